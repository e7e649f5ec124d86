"""A run directory belongs to one run: what determines its trajectory is recorded in `run.json`
when it starts, and a resume that would change any of it is refused before anything is loaded.

The identity is everything the weights depend on: the model (architecture and every
dimension, its options), the export it starts from (`--init_from`: its resolved path and a
fingerprint of its weights, by which a resume finds it moved, or goes on without it:
`export_change`), the optimizer and every hyperparameter it receives, the dtype of its state,
the peak LR, the
schedule and its warm-up, the gradient clip, the seeds, the global batch (batch size,
accumulation steps, sequence length), the iterations, the tokenizer and vocabulary, and a
fingerprint of the dataset. What does not
change the trajectory (logging, evaluation and checkpoint cadence, trackers,
`--iterations_to_run`, the process count when the global batch is the same) may change between
starts; `run.json` records each start and what changed.

`--iterations` may grow (or shrink) only when the schedule's factor at every step already taken
stays the same: `none` and `powerlaw` do not depend on the total, the cosine and linear decays
(`cos_inf`, `cos`, `linear`) do once past the warm-up, `wsd` once its decay has begun. Settings
that follow from the iterations (the warm-up when not given, the log-time weight decay's
`wd_ts`, a coupled weight decay) are compared like any other, unless `--extend` names the rule
that continues the run past its planned total (`run_extensions`): then they are the new total's,
and run.json records the extension (its steps, totals and rules) under `extensions`, which every
later start continues under.
"""

from __future__ import annotations

import copy
import functools
import glob
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from danastar.config import (
    MODEL_MOE_FIELDS,
    batch_layout,
    default_run_dir,
    fit_name,
    make_run_plan,
)
from danastar.durable import write_atomic
from danastar.errors import UserError
from danastar.hparams import extended_coupled_weight_decay, extended_weight_decay
from danastar.optim import get_schedule
from danastar.optim.extension import has_log_time_decay
from danastar.optim.registry import weight_decay_style
from danastar.rundir.files import (
    CHECKPOINTS_DIR,
    RUN_FILE,
    checkpoint_dirs,
    checkpoint_step,
    has_earlier_run,
)
from danastar.train.data import open_tokens
from danastar.train.optimizer import extended_run_schedule

# meta.json keys that describe the tokens themselves (other keys, such as caches of checks that
# a later `danastar prepare` may add, do not make a different dataset).
DATA_KEYS = ("format", "tokenizer", "vocab_size", "dtype", "eot_id", "source", "train_tokens",
             "val_tokens", "train_documents", "val_documents")
# The export a run starts from, compared together (`export_change`).
EXPORT_KEYS = ("init_from", "init_from_fingerprint")
# Settings recorded only when they differ from their default, so that the identity (and the
# automatic directory named from its hash) of a run at the default is what it was before the
# setting was recorded; an identity without one had the default.
RECORDED_WHEN_SET = {"state_dtype": "float32"}
# What follows from the iterations (where derived), and how a longer total continues a run.
EXTENSION_FOLLOWERS = ("iterations", "wd_ts", "weight_decay", "warmup_steps")
# The optimizer hyperparameters planned from the iterations (log-time AdEMAMix: β3 = 1 − δ/T,
# α = T^(1−κ) and their warm-ups of T steps), which an extension keeps as its checkpoint holds
# them (`extension_hparams_problem` checks that only the iterations changed them).
TOTAL_HPARAMS = ("betas", "alpha", "alpha_warmup", "beta3_warmup")
EXTEND_FIX = ("to continue the run to the new total, pass --extend (rewarm: measured best for a "
              "run that finished its schedule; --extend stretch or reanchor continue a decay "
              "that is not over; docs/training.md, extending a run)")
# Settings derived from the plan that the checkpoints of runs older than run.json hold.
PLAN_KEYS = ("arch", "heads", "n_layer", "n_head", "n_embd", "head_dim", "mlp_hidden",
             "vocab_size", "padded_vocab_size", "opt", "lr", "weight_decay", "wd_ts", "omega",
             "batch_size", "acc_steps", "sequence_length", "iterations", "warmup_steps")


def run_identity(config, plan, layout, tokens) -> dict[str, Any]:
    """The settings that determine the run's trajectory, by the names a user knows them by."""
    model = config.model
    shape = plan.to_dict()
    data_seed = config.train.seed if config.data.data_seed is None else config.data.data_seed
    identity = {
        **{key: shape[key] for key in ("arch", "heads", "n_layer", "n_head", "n_embd",
                                       "head_dim", "mlp_hidden")},
        "z_loss": model.z_loss, "init": model.init, "tie_embeddings": model.tie_embeddings,
        "residual_scale": model.residual_scale,
        "opt": plan.opt, "lr": plan.lr, "weight_decay": plan.weight_decay, "wd_ts": plan.wd_ts,
        "omega": plan.omega,
        # kappa, delta, clipsnr, betas, ...: exactly what this optimizer receives
        **{key: value for key, value in plan.optimizer_hparams.items()
           if key not in ("weight_decay", "wd_ts")},
        "grad_clip": config.optim.grad_clip,
        # the optimizer state's dtype (bfloat16: stochastically rounded on every write)
        "state_dtype": config.optim.state_dtype,
        "scheduler": config.optim.scheduler, "warmup_steps": plan.warmup_steps,
        "iterations": plan.iterations,
        "seed": config.train.seed, "data_seed": data_seed,
        "global_batch": layout.global_batch, "batch_size": config.train.batch_size,
        "acc_steps": layout.acc_steps, "sequence_length": layout.sequence_length,
        "vocab_size": shape["vocab_size"], "padded_vocab_size": shape["padded_vocab_size"],
        **dataset_identity(config.data.dataset, tokens),
    }
    for key, default in RECORDED_WHEN_SET.items():
        if identity[key] == default:
            del identity[key]
    if config.train.init_from:  # its starting weights; a random start's identity is unchanged
        identity.update(export_identity(Path(config.train.init_from)))
    if plan.model.moe:  # a dense run's identity stays what it was before MoE existed
        flat = plan.model.to_dict()  # the MoE fields by their flat names, as recorded
        identity.update({name: flat[name] for name in MODEL_MOE_FIELDS})
        identity["moe_budget"] = plan.moe_budget
    return json.loads(json.dumps(identity))  # as it reads back from run.json (tuples → lists)


def dataset_identity(dataset: str, tokens) -> dict[str, Any]:
    """The dataset as named, its tokenizer, and a fingerprint: a hash of what its meta.json says
    about the tokens and of the token files' names and sizes."""
    if tokens.path is None:  # the in-memory synthetic source: fixed by its seed and size
        content = {"synthetic": tokens.meta, "train_tokens": tokens.train_tokens}
    else:
        directory = Path(tokens.path)
        meta = {key: tokens.meta.get(key) for key in DATA_KEYS}
        files = {p.name: p.stat().st_size for p in sorted(directory.glob("*.bin"))}
        content = {"meta": meta, "files": files}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode())
    return {"dataset": dataset, "tokenizer": tokens.meta.get("tokenizer"),
            "dataset_fingerprint": digest.hexdigest()[:16]}


def export_identity(path: Path) -> dict[str, Any]:
    """The export a run starts from: its resolved path, and a fingerprint of its weights where
    they are there to read (a resume needs no export: its weights are its checkpoint's)."""
    resolved = path.expanduser().resolve()
    found = {"init_from": str(resolved)}
    weights = sorted(resolved.glob("*.safetensors")) if resolved.is_dir() else []
    if weights:
        found["init_from_fingerprint"] = weights_fingerprint(tuple(
            (str(file), file.stat().st_size, file.stat().st_mtime_ns) for file in weights))
    return found


@functools.lru_cache(maxsize=4)
def weights_fingerprint(files: tuple[tuple[str, int, int], ...]) -> str:
    """A hash of the names and bytes of the files, given as (path, size, modification time):
    read once per process while they are unchanged (a start works its identity out more than
    once)."""
    digest = hashlib.sha256()
    for name, size, _ in files:
        digest.update(f"{Path(name).name} {size}\n".encode())
        with open(name, "rb") as file:
            while chunk := file.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def identity_from_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """The part of an identity that the plan saved in an older checkpoint holds."""
    renamed = {**plan, "sequence_length": plan.get("seq_len")}
    found = {key: renamed[key] for key in PLAN_KEYS if key in renamed}
    found.update({key: value for key, value in plan.get("optimizer_hparams", {}).items()
                  if key not in found})
    return json.loads(json.dumps(found))


def read_run_file(run_dir: Path) -> Optional[dict[str, Any]]:
    path = run_dir / RUN_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        raise UserError(f"{path} is not valid JSON, so this run directory's run cannot be "
                        f"checked; use another --run_dir, or pass --no_auto_resume to move the "
                        f"old run aside.") from None


def extension_keys(config) -> tuple[str, ...]:
    """The settings that follow from the iterations, which `--extend` sets anew for the longer
    total (none without it): the iterations, `wd_ts`, and the weight decay and warm-up where they
    are derived (not given)."""
    if config.optim.extend is None:
        return ()
    derived = {"weight_decay": config.optim.weight_decay, "warmup_steps":
               config.optim.warmup_steps}
    return ("iterations", "wd_ts", *(key for key, given in derived.items() if given is None),
            *TOTAL_HPARAMS)


def changed_settings(recorded: dict[str, Any], current: dict[str, Any], *, step: int,
                     complete: bool = True, extending: tuple[str, ...] = ()
                     ) -> tuple[list[str], list[str]]:
    """(refused, accepted) changes, each `name: old → new`, of resuming `recorded` at `step`
    with `current`. `complete=False` (the partial identity of an older checkpoint): only keys
    both hold are compared. `extending` (`extension_keys`): the settings an extension sets."""
    refused, accepted = [], []
    keys = [*recorded, *(key for key in current if key not in recorded)] if complete else recorded
    longer = recorded.get("iterations") != current.get("iterations")
    for key in keys:
        if key not in current and not complete:
            continue
        old, new = (identity.get(key, RECORDED_WHEN_SET.get(key))
                    for identity in (recorded, current))
        if old == new:
            continue
        change = f"{key}: {show(old)} → {show(new)}"
        if key in extending:
            accepted.append(f"{change} (--extend)")
        elif key in EXTENSION_FOLLOWERS and longer and key != "iterations":
            refused.append(f"{change} (follows from --iterations)")
        elif key in EXPORT_KEYS:
            verdict = export_change(key, recorded, current)
            if verdict is not None:
                (refused if verdict[0] else accepted).append(change + verdict[1])
        elif key == "dataset" and recorded.get("dataset_fingerprint") == current.get(
                "dataset_fingerprint"):
            accepted.append(change + " (the same data)")
        elif key == "iterations":
            why = extension_problem(recorded, current, step)
            (refused if why else accepted).append(change + (f" ({why})" if why else ""))
        elif key == "dataset_fingerprint" and recorded.get("dataset") != current.get("dataset"):
            continue  # reported as the dataset's change
        else:
            refused.append(change)
    return refused, accepted


def export_change(key: str, recorded: dict[str, Any], current: dict[str, Any]
                  ) -> Optional[tuple[bool, str]]:
    """(refused, why) of resuming with another `init_from` (or `init_from_fingerprint`), or None
    where that is nothing to say. A resume takes its checkpoint's weights, so the export may have
    moved (another path, the same fingerprint) or be gone (no fingerprint now); another export,
    or none where there was one, is another run."""
    old_path, new_path = recorded.get("init_from"), current.get("init_from")
    fingerprints = recorded.get("init_from_fingerprint"), current.get("init_from_fingerprint")
    known = None not in fingerprints
    if key == "init_from_fingerprint":  # said with the path, where that changed too
        if known and old_path == new_path:
            return False, (" (the export there has changed since the run started from it; the "
                           "run goes on from its checkpoint's weights)")
        return None
    if old_path is None:
        return True, ""  # a run from random weights
    if known and fingerprints[0] == fingerprints[1]:
        return False, " (the same export, moved)"
    if known:
        why = "another export: other weights"
    elif new_path is None:
        why = "the run started from an export"
    elif fingerprints[0] is None:
        why = "the run recorded no fingerprint of its export to compare"
    else:
        why = f"{new_path} holds no export to compare"
    return True, f" ({why}; resume with --init_from {old_path}, which need not be there now)"


def extension_problem(recorded: dict[str, Any], current: dict[str, Any], step: int
                      ) -> Optional[str]:
    """Why the run cannot continue with other --iterations, or None: the schedule's factor at
    each step already taken must not depend on the total."""
    scheduler = current.get("scheduler", recorded.get("scheduler"))
    if scheduler is None:
        return "the schedule of this older run is not recorded"
    warmup = current.get("warmup_steps", 0)
    old = get_schedule(scheduler, recorded.get("warmup_steps", warmup), recorded["iterations"])
    new = get_schedule(scheduler, warmup, current["iterations"])
    if all(old(n) == new(n) for n in range(step)):
        return None
    return (f"the {scheduler} schedule's factor at the steps already taken depends on the "
            f"total; none and powerlaw never do")


def run_extensions(record: Optional[dict[str, Any]], current: dict[str, Any], step: int,
                   config) -> list[dict[str, Any]]:
    """The extensions past the planned total that a start at checkpoint `step` continues under,
    oldest first (recorded in run.json's `extensions`, each with from_step, from_iterations,
    iterations, schedule_rule, decay_rule and the warm-up it was planned with), or none: the
    recorded ones, and a new one after them where `--extend` asks for other iterations than the
    record's (its rules refused, UserError, where they cannot honour it)."""
    if record is None or "iterations" not in record["identity"]:
        return []
    recorded, extensions = record["identity"], list(record.get("extensions", []))
    check_not_before_join(extensions, step)
    if current["iterations"] == recorded["iterations"] or config.optim.extend is None:
        # the same total (or `changed_settings` said why the iterations cannot change)
        last = extensions[-1] if extensions else None
        decay, rewarm = config.optim.extend_decay, config.optim.extend_rewarm
        if last and config.optim.extend is not None and (
                config.optim.extend != last["schedule_rule"]
                or decay not in (None, last["decay_rule"])
                or rewarm not in (None, last.get("rewarm_steps"))):
            raise UserError(f"this run was extended at step {last['from_step']} to "
                            f"{last['iterations']} steps by --extend {last['schedule_rule']} "
                            f"--extend_decay {last['decay_rule']}{recorded_rewarm(last)}; resume "
                            f"it with those (or without --extend).")
        return extensions
    # the warm-up the schedule was first planned with (the record's is the last total's)
    warmup = extensions[0]["warmup_steps"] if extensions else recorded.get("warmup_steps", 0)
    extension = {"from_step": step, "from_iterations": recorded["iterations"],
                 "iterations": current["iterations"], "schedule_rule": config.optim.extend,
                 "decay_rule": config.optim.extend_decay or extend_decay_rule(recorded, config),
                 "warmup_steps": warmup}
    if config.optim.extend == "rewarm":
        extension["rewarm_steps"] = rewarm_steps(config, warmup, current["iterations"] - step)
    check_extension_rules([*extensions, extension], recorded, config)
    check_total_hparams(recorded, current, config)
    previous = extensions[-1] if extensions else recorded
    if "weight_decay" in previous:  # (an extension recorded before it was kept: not known)
        extension.update(decay_in_effect({**recorded, **previous}, extension))
    return [*extensions, extension]


def rewarm_steps(config, warmup: int, left: int) -> int:
    """The steps `--extend rewarm` climbs back to the peak over: `--extend_rewarm`, else the
    run's own warm-up `warmup` (a climb over a run planned for the new total's warm-up measured
    no better, docs/study-extend.md) but at most the `left` steps, else, where the run had
    none, a 50th of the steps left."""
    return config.optim.extend_rewarm or min(warmup, left) or max(1, left // 50)


def coupled_from_length(recorded: dict[str, Any], config) -> bool:
    """Whether the run's decay is a coupled one planned from its length (AdamW's ω/(γ·T)), not
    one given as a constant."""
    return (weight_decay_style(recorded.get("opt", "")) == "coupled"
            and recorded.get("wd_ts") is None and bool(recorded.get("weight_decay"))
            and config.optim.weight_decay is None)


def extend_decay_rule(recorded: dict[str, Any], config) -> str:
    """The decay rule of an extension that names none, the measured best for the run's decay
    (docs/study-extend.md): `planned` for a coupled decay planned from the run's length
    (kept, it removes T2/T1 times a longer run's share per step), `keep` for any other."""
    return "planned" if coupled_from_length(recorded, config) else "keep"


def recorded_rewarm(extension: dict[str, Any]) -> str:
    """The extension's rewarm length as its flag (nothing for the other rules)."""
    steps = extension.get("rewarm_steps")
    return f" --extend_rewarm {steps}" if steps else ""


def decay_in_effect(before: dict[str, Any], extension: dict[str, Any]) -> dict[str, Any]:
    """The weight decay the optimizer holds from the join on (what `extend_run` sets, recorded
    with the extension: the identity holds what a run planned for the new total would have),
    from the one it held `before`: a log-time decay by the extension's rule, a coupled one
    (AdamW's ω/(γ·T)) scaled by T1/T2 under `planned`, any other kept."""
    decay = {"weight_decay": before["weight_decay"], "wd_ts": before["wd_ts"]}
    if has_log_time_decay(before):
        decay["weight_decay"], decay["wd_ts"] = extended_weight_decay(
            before["weight_decay"], before["wd_ts"], extension["iterations"],
            extension["from_step"], extension["decay_rule"])
    elif extension["decay_rule"] == "planned" and before["weight_decay"]:
        decay["weight_decay"] = extended_coupled_weight_decay(
            before["weight_decay"], extension["from_iterations"], extension["iterations"],
            "planned")
    return decay


def check_not_before_join(extensions: list[dict[str, Any]], step: int) -> None:
    """Refuse a resume from a checkpoint older than the run's newest extension (its newer
    checkpoints missing or damaged): the extension's optimizer and schedule begin at its step,
    and the steps between would be trained under the extended plan too early."""
    if extensions and step < extensions[-1]["from_step"]:
        join = extensions[-1]["from_step"]
        raise UserError(f"the newest usable checkpoint is at step {step:,}, before this run was "
                        f"extended at step {join:,} (its checkpoints from step {join:,} on are "
                        f"missing or damaged); put a checkpoint from step {join:,} or later "
                        f"back into checkpoints/, or extend a copy of the run as it was before "
                        f"the extension.")


def check_total_hparams(recorded: dict[str, Any], current: dict[str, Any], config) -> None:
    """Refuse an extension where a hyperparameter planned from the iterations (TOTAL_HPARAMS)
    differs from what these settings plan for the recorded total: another setting changed it."""
    keys = [key for key in TOTAL_HPARAMS if key in recorded or key in current]
    if not keys:
        return
    at_total = make_run_plan(config_with_iterations(config, recorded["iterations"]),
                             current["vocab_size"], 1).optimizer_hparams
    planned = json.loads(json.dumps({key: at_total.get(key) for key in keys}))
    changed = [f"{key}: {show(recorded.get(key))} → {show(planned[key])}" for key in keys
               if planned[key] != recorded.get(key)]
    if changed:
        raise UserError(f"these settings plan other optimizer hyperparameters than the run's "
                        f"for its {recorded['iterations']} steps ({'; '.join(changed)}), so "
                        f"more than --iterations changed; extend it with the settings it was "
                        f"trained with.")


def check_extension_rules(extensions: list[dict[str, Any]], recorded: dict[str, Any],
                          config) -> None:
    """Refuse the newest of `extensions` where its rules cannot honour it: the library's
    sentence (a decay that is over cannot be stretched), and a decay rule for an optimizer
    without a log-time weight decay."""
    extension = extensions[-1]
    try:
        extended_run_schedule(config, extensions)
    except ValueError as error:
        why = (str(error).rstrip(".").replace("use rule 'rewarm'", "use --extend rewarm")
               .replace("rewarm_steps must be", "--extend_rewarm must be"))
        raise UserError(f"--extend {extension['schedule_rule']} cannot continue this run from "
                        f"step {extension['from_step']} to {extension['iterations']} steps: "
                        f"{why}.") from None
    rule = extension["decay_rule"]
    if rule == "keep" or recorded.get("wd_ts") is not None or not recorded.get("weight_decay"):
        return
    if coupled_from_length(recorded, config):
        if rule == "reanchor":
            raise UserError(f"--extend_decay reanchor re-anchors a log-time weight decay's time "
                            f"scale (wd_ts), and {recorded['opt']}'s coupled decay ω/(γ·T) has "
                            f"none; use --extend_decay keep (its decay as it is) or planned (a "
                            f"run planned for the new total's, λ·T1/T2).")
        return
    given = " (given by optim.weight_decay)" if config.optim.weight_decay is not None else ""
    raise UserError(f"--extend_decay {rule} changes a weight decay planned from the run's "
                    f"length, and {recorded.get('opt')}'s is a constant{given}; use "
                    f"--extend_decay keep (its weight decay as it is).")


def show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return json.dumps(value) if isinstance(value, (dict, list)) or value is None else str(value)


def refusal(run_dir: Path, step: int, refused: list[str], note: str = "") -> UserError:
    """The sentence of a refused resume; where a longer --iterations is what changed, it says
    how to continue the run to them (`--extend`)."""
    longer = any(change.startswith("iterations:") or change.endswith("(follows from --iterations)")
                 for change in refused)
    extend = f"; {EXTEND_FIX}" if longer else ""
    return UserError(
        f"{run_dir} holds another run (its checkpoint at step {step} was trained with other "
        f"settings{note}): {'; '.join(refused)}{extend}; to keep it, use another --run_dir, or "
        f"pass --no_auto_resume to move the old run into {run_dir}/previous-<time>/ and start "
        f"afresh."
    )


def planned_identity(config, world_size: int, tokens) -> dict[str, Any]:
    """The identity `train` records for `config` on `world_size` processes over `tokens`, worked
    out without building anything: for checks before a run starts."""
    layout = batch_layout(config, world_size)
    plan = make_run_plan(config, tokens.vocab_size, layout.data_parallel_size)
    return run_identity(config, plan, layout, tokens)


def recorded_changes(run_dir: Path, identity: dict[str, Any], extending: tuple[str, ...] = ()
                     ) -> Optional[tuple[int, list[str], list[str]]]:
    """(step, refused, accepted) of resuming the run recorded in `run_dir` with `identity`, as
    `train` would decide it, without touching the directory; None when `train` would not resume
    there (no checkpoint), or when the run predates run.json (`train` compares its checkpoint's
    plan when it starts). The step is the newest checkpoint's, read from its name and not
    verified: a corrupt newest checkpoint makes this check stricter than `train`'s, never looser."""
    steps = [checkpoint_step(path) for path in checkpoint_dirs(run_dir / CHECKPOINTS_DIR)]
    record = read_run_file(run_dir) if steps else None
    if record is None:
        return None
    refused, accepted = changed_settings(record["identity"], identity, step=max(steps),
                                         extending=extending)
    return max(steps), refused, accepted


def record_start(run_dir: Path, identity: dict[str, Any], config, layout, step: int,
                 world_size: int, accepted: list[str],
                 extension: Optional[dict[str, Any]] = None) -> None:
    """Write run.json: the identity, the latest settings, one entry per start, and the
    newest extension past the planned total the run continues under (`run_extensions`), if
    any."""
    previous = read_run_file(run_dir) or {}
    if step > 0:
        identity = with_started_export(previous.get("identity", {}), identity)
    # as run.json will hold them (a tuple reads back as a list), so that an unchanged setting
    # compares equal to its record
    settings = json.loads(json.dumps(config.to_dict(), default=str))
    changed = [f"{key}: {show(old)} → {show(new)}" for key, old, new in
               setting_changes(previous.get("settings", {}), settings)]
    starts = previous.get("starts", [])
    starts.append({"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "step": step,
                   "world_size": world_size, "changed": changed, "accepted": accepted})
    record = {"identity": identity, "settings": settings, "batch_layout": layout.to_dict(),
              "starts": starts}
    extensions = previous.get("extensions", []) if step > 0 else []
    if extension is not None and extension not in extensions:
        extensions.append(extension)
    if extensions:
        record["extensions"] = extensions
    write_atomic(run_dir / RUN_FILE, json.dumps(record, indent=1, default=str) + "\n")


def with_started_export(recorded: dict[str, Any], identity: dict[str, Any]) -> dict[str, Any]:
    """A resumed run's `identity` with the fingerprint of the export it started from as
    recorded (or none, where none was): the export now at the path, or none, did not give its
    weights."""
    if "init_from" not in identity:
        return identity
    kept = {key: value for key, value in identity.items() if key != "init_from_fingerprint"}
    if "init_from_fingerprint" in recorded:
        kept["init_from_fingerprint"] = recorded["init_from_fingerprint"]
    return kept


def setting_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = ""):
    """(dotted key, old, new) of the configuration values that differ."""
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            yield from setting_changes(before, value, f"{prefix}{key}.")
        elif key in old and before != value:
            yield f"{prefix}{key}", before, value


# ----------------------------------------------------------------------------------------------
# The automatic run directory

def choose_run_dir(base: Path, identity: dict[str, Any],
                   with_iterations: Callable[[int], dict[str, Any]],
                   extending: tuple[str, ...] = ()) -> tuple[Path, Optional[str]]:
    """Where a run without --run_dir goes, and a line saying why when it is not `base` (the name
    from the run's settings, which leaves out the iterations).

    `base` when it holds no run, or this same run (to resume), or one that these settings may
    continue (a longer --iterations on a schedule that allows it). Else a directory of its own
    beside it: `<base>-it<iterations>` when only the iterations (and what follows from them)
    differ from base's run, `<base>-<hash of the settings>` otherwise. Each candidate's name
    depends on this run's settings alone, and a candidate that holds this run is found before a
    free one is taken, so the same command finds its directory again whatever `base` holds
    later. `with_iterations(T)` is this run's identity with T iterations. A run extended
    (`extending`, `extension_keys`, or one recorded) stays in the directory it was planned in,
    whose `-it<T>` names its first total: those are looked at too."""
    iterations = identity["iterations"]
    digest = identity_digest(identity)
    candidates = [base, *(base.with_name(fit_name(f"{base.name}-{suffix}")) for suffix in (
        f"it{iterations}", digest, f"{digest}-it{iterations}"))]
    for candidate in [*candidates, *extended_candidates(base, digest, candidates, extending)]:
        if holds_this_run(candidate, identity, older_is_ours=candidate == base,
                          extending=extending):
            return candidate, None
    record = read_run_file(base)
    recorded = record["identity"] if record else None
    only_iterations = False
    if recorded is not None and "iterations" in recorded:
        try:
            only_iterations = not changed_settings(
                recorded, with_iterations(recorded["iterations"]), step=0)[0]
        except UserError:  # these settings cannot plan base's iterations (a longer warm-up)
            pass
    for candidate in candidates:
        if candidate == candidates[1] and not only_iterations:
            continue  # the name would say the iterations are what differs
        if not has_earlier_run(candidate):
            if candidate == base:
                return base, None
            differs = [change.split(":")[0] for change in changed_settings(
                recorded, identity, step=newest_step(base))[0]] if recorded else []
            what = f" ({', '.join(differs)})" if differs else ""
            return candidate, (f"{base} holds a run with other settings{what}, so this one goes "
                               f"to its own directory, {candidate} (--run_dir chooses one).")
    return base, None  # every candidate is taken: training there says why it cannot resume


def extended_candidates(base: Path, digest: str, candidates: list[Path],
                        extending: tuple[str, ...]) -> list[Path]:
    """The `-it<T>` directories beside `base` (of its settings, or of this digest) other than
    `candidates` that a run extended past its first total may be in: each, when extending, else
    those whose run.json records an extension."""
    found = []
    for prefix in (base.name, f"{base.name}-{digest}"):
        for path in sorted(base.parent.glob(f"{glob.escape(prefix)}-it*")):
            if path in candidates or not path.name[len(prefix) + 3:].isdigit():
                continue
            record = read_run_file(path) if not extending else None
            if extending or (record and record.get("extensions")):
                found.append(path)
    return found


def identity_digest(identity: dict[str, Any]) -> str:
    """A short hash of the settings but the iterations (which the `-it<T>` names carry), so
    that a run extended on a schedule that allows it keeps its directory, and but the export's
    fingerprint (the path names it; a resume may have no export to read)."""
    settings = {key: value for key, value in identity.items()
                if key not in ("iterations", "init_from_fingerprint")}
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()
                          ).hexdigest()[:8]


def newest_step(run_dir: Path) -> int:
    """The step of the newest checkpoint in `run_dir` by its name (0 when there is none)."""
    return max(map(checkpoint_step, checkpoint_dirs(run_dir / CHECKPOINTS_DIR)), default=0)


def holds_this_run(run_dir: Path, identity: dict[str, Any], older_is_ours: bool,
                   extending: tuple[str, ...] = ()) -> bool:
    """Whether `run_dir` holds a run that `train` with `identity` would resume or continue (not
    refuse, and not call finished beyond its total; `extending`: the settings an extension
    sets). A run directory from before run.json counts as ours when `older_is_ours` (its
    checkpoint's plan is compared when training starts)."""
    if not has_earlier_run(run_dir):
        return False
    record = read_run_file(run_dir)
    if record is None:
        return older_is_ours
    step = newest_step(run_dir)
    refused, _ = changed_settings(record["identity"], identity, step=step, extending=extending)
    return not refused and step <= identity["iterations"]


@dataclass(frozen=True)
class RunDirChoice:
    """Where `train` will run (`planned_run_dir`), why there (`note`, when it is not the
    settings' own name), and what the choice rests on: `data`, the fingerprint of the data its
    runs were compared on (`dataset_identity`; None where nothing needed comparing), and
    `undecided`, where the data is not prepared yet and runs were there to compare (training
    chooses again once it is)."""

    path: Path
    note: Optional[str] = None
    data: Optional[dict[str, Any]] = None
    undecided: bool = False

    def holds_for(self, dataset_fingerprint: dict[str, Any], given: bool) -> bool:
        """Whether the choice stands for data of `dataset_fingerprint` (`given`: --run_dir)."""
        return given or (not self.undecided and self.data in (None, dataset_fingerprint))


def planned_run_dir(config, world_size: int, base: Optional[Path] = None) -> RunDirChoice:
    """The directory `train` will use for `config` (and the line of `choose_run_dir`), worked
    out without writing or preparing anything: --run_dir as given, else the automatic one next
    to `base` (default: `default_run_dir`). Where the data is not prepared yet nothing could be
    compared, and the base is the answer (training chooses again once it is)."""
    if config.logging.run_dir:
        return RunDirChoice(Path(config.logging.run_dir))
    base = default_run_dir(config) if base is None else base
    if not has_earlier_run(base) and not any(base.parent.glob(f"{glob.escape(base.name)}-*")):
        return RunDirChoice(base)  # nothing to compare with (the common case: no tokens opened)
    tokens = open_tokens(config, prepare=False)
    if tokens is None:
        return RunDirChoice(base, undecided=True)
    path, note = choose_run_dir(base, planned_identity(config, world_size, tokens),
                                lambda iterations: planned_identity(
                                    config_with_iterations(config, iterations), world_size,
                                    tokens), extension_keys(config))
    return RunDirChoice(path, note, data=dataset_identity(config.data.dataset, tokens))


def config_with_iterations(config, iterations: int):
    """A copy of `config` with `train.iterations` set."""
    changed = copy.deepcopy(config)
    changed.train.iterations = iterations
    return changed
