"""Reading run directories: config.yaml, plan.json, metrics.jsonl (and run.json, status.json
when present) into one :class:`Run` per directory.

A run is complete when metrics.jsonl holds a ``final: true`` validation record at
``step == iterations`` with a finite loss, and status.json does not say it failed (training
records a run whose every step was skipped, or that diverged, as failed); a failed run is shown
as failed, anything else as partial, and both are left out of fits.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from danastar.analysis import compute
from danastar.errors import UserError
from danastar.rundir import metrics as metrics_file
from danastar.rundir.files import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    EVAL_DIR,
    METRICS_FILE,
    PLAN_FILE,
    RUN_FILE,
    STATUS_FILE,
    SUBMISSION_DIR,
    TRAINED_FILES,
)

COMPLETE = "complete"
PARTIAL = "partial"
# `danastar eval` writes <run_dir>/eval/<step>.json (danastar.export.evaluate, which analysis
# does not import): {"step", "checkpoint", ..., "tasks": {task: {metric: value}}}.
# libyaml's safe loader where PyYAML was built with it: a study's report reads hundreds of
# config.yaml files, seven times faster than with the pure-Python one (the same values)
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UnreadableRun(UserError):
    """A run directory whose files cannot be read or parsed; `find_runs` leaves it out with a
    line naming it, so that one damaged run does not hide the others."""


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; {} when there is no such file."""
    if not path.exists():
        return {}
    try:
        found = json.loads(path.read_text())
    except OSError as error:
        raise UnreadableRun(f"{path} cannot be read ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise UnreadableRun(f"{path} is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise UnreadableRun(f"{path} is not valid JSON ({error.msg} at line {error.lineno})"
                            ) from None
    if not isinstance(found, dict):
        raise UnreadableRun(f"{path} holds a JSON {type(found).__name__}, not an object")
    return found


def _finite(value: Any) -> bool:
    """A loss as logged (NaN and infinities are written as JSON's NaN and Infinity) is a finite
    number."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _read_metrics(path: Path, notes: list[str]) -> list[dict[str, Any]]:
    """The readable records of metrics.jsonl; a line in ``notes`` names the lines left out."""
    try:
        found = metrics_file.read(path)
    except OSError as error:
        raise UnreadableRun(f"{path} cannot be read ({error.strerror or error})") from None
    if problem := found.problem():
        notes.append(problem)
    return found.records


@dataclasses.dataclass
class Run:
    path: Path
    plan: dict[str, Any]
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    status: dict[str, Any]
    identity: dict[str, Any] = dataclasses.field(default_factory=dict)  # run.json's
    notes: list[str] = dataclasses.field(default_factory=list)  # what could not be read
    evaluation: dict[str, Any] = dataclasses.field(default_factory=dict)  # newest eval/<step>.json
    # run.json's `extensions`: each continuation past the planned steps (`danastar train
    # --extend`): from_step, from_iterations, iterations, schedule_rule, decay_rule
    extensions: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def extended(self) -> str | None:
        """Its extensions past the planned steps, as the results table shows them
        (`10→20 at 10 (stretch, keep)`; a rewarm with its steps back to the peak, `rewarm 2`),
        None where it has none."""
        def rule(e: dict) -> str:
            steps = e.get("rewarm_steps")
            return f"{e['schedule_rule']} {steps}" if steps else e["schedule_rule"]

        return "; ".join(f"{e['from_iterations']}→{e['iterations']} at {e['from_step']} "
                         f"({rule(e)}, {e['decay_rule']})" for e in self.extensions) or None

    def joins(self, x: str = "compute") -> list[float]:
        """Where it was extended on the axis ``x`` of `curve` (compute, tokens or steps)."""
        per_step = float(self.plan.get("tokens_per_step", 0))
        return [{"compute": compute.pfh(compute.flops(self.non_embedding,
                                                      e["from_step"] * per_step)),
                 "tokens": e["from_step"] * per_step, "steps": float(e["from_step"])}[x]
                for e in self.extensions]

    @property
    def eval_scores(self) -> dict[str, float]:
        """The newest evaluation's scores by column, ``"<task> <metric>"`` (``hellaswag acc``),
        without the standard errors; {} for a run never evaluated."""
        tasks = self.evaluation.get("tasks")
        scores = {}
        for task, metrics in (tasks.items() if isinstance(tasks, dict) else ()):
            for metric, value in (metrics.items() if isinstance(metrics, dict) else ()):
                stderr = metric.endswith("_stderr") or "_stderr[" in metric
                if not stderr and isinstance(value, (int, float)):
                    scores[f"{task} {metric}"] = float(value)
        return scores

    @property
    def dataset(self) -> str | None:
        """The dataset as named when the run was started (run.json, else config.yaml)."""
        data = self.config.get("data")
        name = self.identity.get("dataset") or (data.get("dataset")
                                                if isinstance(data, dict) else None)
        return None if name is None else str(name)

    @property
    def data(self) -> tuple[str, str]:
        """What the run trained on, for grouping: (dataset name, fingerprint of its token
        files); "" for what an older run directory does not record."""
        return (self.dataset or "", str(self.identity.get("dataset_fingerprint") or ""))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def arch(self) -> str:
        """The architecture, and for a mixture of experts its experts (`enoki-moe64k2`: 64
        experts, 2 per token; `+1s` for a shared one), so that a MoE and a dense model with the
        same heads are two models, not one size, in every table and figure."""
        arch = str(self.plan.get("arch", "?"))
        if not self.plan.get("moe"):
            return arch
        shared = self.plan.get("moe_num_shared_experts") or 0
        return (f"{arch}-moe{self.plan.get('moe_num_experts', '?')}"
                f"k{self.plan.get('moe_num_experts_per_tok', '?')}"
                + (f"+{shared}s" if shared else ""))

    @property
    def heads(self) -> int:
        return int(self.plan.get("heads") or self.plan.get("n_head") or 0)

    @property
    def optimizer(self) -> str:
        return str(self.plan.get("opt") or self.config.get("optim", {}).get("name", "?"))

    def _setting(self, name: str) -> float | None:
        """An optimizer setting, only when the optimizer uses it (plans record κ for all)."""
        used = self.plan.get("optimizer_hparams")
        if isinstance(used, dict) and name not in used:
            return None
        return self.plan.get(name)

    @property
    def kappa(self) -> float | None:
        return self._setting("kappa")

    @property
    def clipsnr(self) -> float | None:
        return self._setting("clipsnr")

    @property
    def omega(self) -> float | None:
        value = self.plan.get("omega", self.config.get("optim", {}).get("omega"))
        return None if value is None else float(value)

    @property
    def lr(self) -> float:
        return float(self.plan.get("lr", math.nan))

    @property
    def seed(self) -> int:
        return int(self.plan.get("seed", self.config.get("train", {}).get("seed", 0)) or 0)

    @property
    def global_batch(self) -> int:
        layout = self.plan.get("batch_layout") or {}
        return int(layout.get("global_batch")
                   or self.plan.get("batch_size", 0) * self.plan.get("acc_steps", 1))

    @property
    def iterations(self) -> int:
        return int(self.plan.get("iterations", 0))

    @property
    def non_embedding(self) -> int:
        """N_ne for compute (12·d²·L for Enoki, exact for Qwen3)."""
        return compute.compute_non_embedding(self.plan)

    @property
    def lr_law_params(self) -> int:
        """P of the LR laws: 12·d²·L."""
        return int(self.plan["non_embedding_params"])

    @property
    def total_params(self) -> int:
        return int(self.plan.get("total_params", 0))

    @property
    def size(self) -> tuple[str, int]:
        return (self.arch, self.heads)

    @property
    def group(self) -> str:
        """The optimizer with the settings that make it a different curve (κ, clipsnr)."""
        return optimizer_label(self.optimizer, self.kappa, self.clipsnr)

    def _validation(self) -> list[dict[str, Any]]:
        return [r for r in self.metrics if "val_loss" in r and "step" in r]

    @property
    def final_record(self) -> dict[str, Any] | None:
        finals = [r for r in self._validation() if r.get("final")]
        return finals[-1] if finals else None

    @property
    def complete(self) -> bool:
        final = self.final_record
        return (final is not None and int(final["step"]) == self.iterations > 0
                and _finite(final["val_loss"]) and self.status.get("state") != "failed")

    @property
    def wall_seconds(self) -> float | None:
        """Wall time from the run's first start (run.json) to its last status update, for a run
        that ran in one go (None if it was resumed, or the files do not say)."""
        try:
            starts = json.loads((self.path / RUN_FILE).read_text())["starts"]
            first, last = starts[0]["at"], self.status["updated"]
        except (OSError, KeyError, IndexError, TypeError, ValueError):
            return None
        if len(starts) != 1:
            return None
        return (datetime.fromisoformat(last.replace("Z", "+00:00"))
                - datetime.fromisoformat(first.replace("Z", "+00:00"))).total_seconds()

    @property
    def state(self) -> str:
        if self.complete:
            return COMPLETE
        final = self.final_record
        failed = self.status.get("state") == "failed" or (
            final is not None and not _finite(final["val_loss"]))
        return "failed" if failed else PARTIAL

    @property
    def steps_done(self) -> int:
        steps = [int(r["step"]) for r in self.metrics if "step" in r]
        return max(steps, default=0)

    @property
    def tokens(self) -> int:
        values = [int(r["tokens"]) for r in self.metrics if "tokens" in r]
        return max(values, default=0)

    @property
    def final_loss(self) -> float | None:
        final = self.final_record
        return float(final["val_loss"]) if final is not None and self.complete else None

    @property
    def best_loss(self) -> float | None:
        losses = [float(r["val_loss"]) for r in self._validation()]
        return min(losses) if losses else None

    @property
    def tokens_per_s(self) -> float | None:
        values = [r["tokens_per_s"] for r in self.metrics if r.get("tokens_per_s")]
        return float(values[-1]) if values else None

    @property
    def flops(self) -> float:
        return compute.flops(self.non_embedding, self.tokens)

    @property
    def pfh(self) -> float:
        return compute.pfh(self.flops)

    def curve(self, x: str = "compute") -> tuple[list[float], list[float]]:
        """Validation loss against ``x`` (compute in PFH, tokens or steps): the periodic
        evaluations, then the final one in place of a periodic one at the same step."""
        by_step: dict[int, dict[str, Any]] = {}
        for record in self._validation():
            step = int(record["step"])
            if record.get("final") or step not in by_step:
                by_step[step] = record
        xs, ys = [], []
        for step, record in sorted(by_step.items()):
            tokens = float(record.get("tokens", 0))
            value = {"compute": compute.pfh(compute.flops(self.non_embedding, tokens)),
                     "tokens": tokens, "steps": float(step)}[x]
            xs.append(value)
            ys.append(float(record["val_loss"]))
        return xs, ys


def optimizer_label(optimizer: str, kappa: float | None = None,
                    clipsnr: float | None = None) -> str:
    label = optimizer
    if kappa is not None:
        label += f" κ={kappa:g}"
    if clipsnr is not None:
        label += f" clipsnr={clipsnr:g}"
    return label


def read_run(path: Path) -> Run:
    """The run in ``path``; UnreadableRun (a UserError) when one of its files exists but cannot
    be read or parsed, or its plan lacks what the tables need."""
    plan_file = _read_json(path / PLAN_FILE)
    run_file = _read_json(path / RUN_FILE)
    for name, part in ((PLAN_FILE, plan_file.get("plan", plan_file)),
                       (RUN_FILE, run_file.get("plan", {}))):
        if not isinstance(part, dict):
            raise UnreadableRun(f"{path / name} holds a plan that is not a JSON object")
    plan = dict(plan_file.get("plan", plan_file))
    if "batch_layout" in plan_file:
        plan["batch_layout"] = plan_file["batch_layout"]
    plan.update(run_file.get("plan", {}))
    config_path = path / CONFIG_FILE
    config: Any = {}
    if config_path.exists():
        try:
            config = yaml.load(config_path.read_text(), Loader=YAML_LOADER) or {}
        except OSError as error:
            raise UnreadableRun(f"{config_path} cannot be read ({error.strerror or error})"
                                ) from None
        except (UnicodeDecodeError, yaml.YAMLError):
            raise UnreadableRun(f"{config_path} is not valid YAML") from None
    notes = []
    try:
        status = _read_json(path / STATUS_FILE)
    except UnreadableRun as error:  # only the "failed" state comes from it
        status = {}
        notes.append(f"{error}; its state is read from metrics.jsonl alone")
    metrics = _read_metrics(path / METRICS_FILE, notes)
    identity, extensions = run_file.get("identity"), run_file.get("extensions")
    run = Run(path=path, plan=plan, config=config if isinstance(config, dict) else {},
              metrics=metrics, status=status,
              identity=identity if isinstance(identity, dict) else {}, notes=notes,
              evaluation=newest_evaluation(path, notes),
              extensions=extensions if isinstance(extensions, list) else [])
    try:  # what every table and figure reads from the plan
        for name in ("arch", "heads", "optimizer", "lr", "seed", "global_batch", "iterations",
                     "non_embedding", "lr_law_params", "total_params", "dataset"):
            getattr(run, name)
    except KeyError as error:
        raise UnreadableRun(f"{path / PLAN_FILE} has no {error.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError):
        raise UnreadableRun(f"{path / PLAN_FILE} (or {CONFIG_FILE}) holds a value of the wrong "
                            f"type where {name} is read") from None
    return run


def newest_evaluation(run_dir: Path, notes: list[str]) -> dict[str, Any]:
    """The record of the run's evaluation at its highest step (``eval/<step>.json``; an
    export's ``eval/export.json``, whose step is unknown, only when there is no other); {} when
    there is none. One that cannot be read is named in ``notes`` and the next older one used."""
    folder = run_dir / EVAL_DIR
    if not folder.is_dir():
        return {}
    for path in sorted(folder.glob("*.json"), key=_eval_step, reverse=True):
        try:
            record = _read_json(path)
        except UnreadableRun as error:
            notes.append(f"{error}; its scores are left out")
            continue
        if isinstance(record.get("tasks"), dict):
            return record
        notes.append(f"{path} holds no tasks' scores; it is left out")
    return {}


def _eval_step(path: Path) -> int:
    return int(path.stem) if path.stem.isdigit() else -1


def _is_run_dir(path: Path) -> bool:
    return (path / PLAN_FILE).is_file()


def _moved_aside(run_dir: Path, root: Path) -> bool:
    """Whether ``run_dir`` is (inside) a ``previous-<time>/`` folder of a run directory."""
    for folder in (run_dir, *run_dir.parents):
        if folder == root:
            return False
        if folder.name.startswith("previous-") and any(
                (folder.parent / name).exists() for name in (PLAN_FILE, RUN_FILE)):
            return True
    return False


def _is_submission(folder: Path) -> bool:
    """`<run_dir>/slurm/`: the plan `danastar submit` checked a queued job against, not a run."""
    return folder.name == SUBMISSION_DIR and not any((folder / name).exists()
                                                     for name in TRAINED_FILES)


def _default_note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _run_dirs_in(path: Path) -> tuple[list[Path], int]:
    """(the run directories that `path` is or holds, how many runs below it were moved aside
    into previous-<time>/); checkpoints' own plan files are not runs."""
    if not path.exists():
        raise UserError(f"{path} does not exist; give run directories or sweep directories.")
    if _is_run_dir(path):
        return [path], 0
    found, aside = [], 0
    for plan in sorted(path.rglob(PLAN_FILE)):
        if CHECKPOINTS_DIR in plan.parent.relative_to(path).parts or _is_submission(plan.parent):
            continue
        if _moved_aside(plan.parent, path):
            aside += 1
        else:
            found.append(plan.parent)
    return found, aside


# A number in a run's path, as sweeps name their points: 3, 0.25, 1.10e-02.
NUMBER = re.compile(r"(\d+(?:\.\d+)?(?:e[-+]?\d+)?)")


def by_value(path: Path) -> tuple:
    """A path's sort key with its numbers compared as numbers (each part: text, number, ...)."""
    return tuple(tuple(float(piece) if index % 2 else piece
                       for index, piece in enumerate(NUMBER.split(part)))
                 for part in path.parts)


def find_runs(paths: Iterable[str | Path],
              note: Callable[[str], None] | None = None) -> list[Run]:
    """Every run directory given, or found below a directory given (a sweep), sorted by path,
    the numbers in its names by value (`lr5.49e-03` before `lr1.10e-02`, `h3` before `h12`).
    An earlier run that ``train`` moved aside into ``previous-<time>/`` inside a run directory
    is not a run of the table unless given itself.

    ``note`` (default: standard error) hears one line for each run left out because its files
    cannot be read, and for each run with lines of metrics.jsonl that could not be read.
    Raises UserError for a missing path, or when no (readable) run is found at all."""
    say = note or _default_note
    paths = [Path(p) for p in paths]
    found: list[Path] = []
    aside = 0
    for path in paths:
        runs_here, aside_here = _run_dirs_in(path)
        found += runs_here
        aside += aside_here
    if not found:
        where = ", ".join(str(p) for p in paths)
        raise UserError(f"no run directories (with a plan.json) under {where}; point at a run "
                        "directory or at a sweep directory that holds runs.")
    if aside:
        say(f"left out {aside} earlier run(s) moved aside into previous-<time>/ folders; give "
            "such a folder itself to include it")
    runs = []
    for path in sorted(set(found), key=by_value):
        try:
            run = read_run(path)
        except UnreadableRun as error:
            say(f"left out {path}: {error}; restore the file or move the run directory away")
            continue
        for line in run.notes:
            say(line)
        runs.append(run)
    if not runs:
        raise UserError(f"none of the {len(set(found))} run directories found can be read (each "
                        "is named above); restore their files or give other directories.")
    return runs


def dataset_labels(runs: Sequence[Run]) -> dict[tuple[str, str], str]:
    """A name per `Run.data` for tables and legends: the dataset's name, with the start of
    its fingerprint where one name stands for different token files."""
    keys = {run.data for run in runs}
    labels = {}
    for name, fingerprint in keys:
        shared = sum(1 for other, _ in keys if other == name) > 1
        label = name or "?"
        if shared:
            label += f" ({fingerprint[:8]})" if fingerprint else " (no fingerprint)"
        labels[(name, fingerprint)] = label
    return labels


def one_dataset(runs: Sequence[Run], what: str) -> None:
    """UserError when ``runs`` were trained on more than one dataset: ``what`` compares runs
    on one."""
    labels = dataset_labels(runs)
    if len(labels) > 1:
        raise UserError(f"{what} compares runs on one dataset, and these runs were trained on "
                        f"{len(labels)} ({', '.join(sorted(labels.values()))}); give the "
                        "directories of one dataset (danastar results shows each run's).")


def lr_key(lr: float) -> float:
    return float(f"{lr:.4g}")  # the same LR written by different runs with float noise


def check_distinct_seeds(runs: Sequence[Run]) -> None:
    """UserError when two complete runs of one optimizer, dataset, size, budget and LR have the
    same seed: averaged as seeds they would count one trajectory twice."""
    cells: dict[tuple, dict[int, Run]] = {}
    labels = dataset_labels(runs)
    for run in runs:
        if not run.complete:
            continue
        cell = cells.setdefault((run.group, run.data, run.size, run.iterations,
                                 lr_key(run.lr)), {})
        other = cell.setdefault(run.seed, run)
        if other is run:
            continue
        differ = _differences(other, run)
        raise UserError(
            f"{other.path} and {run.path} are both seed {run.seed} of {run.group} at "
            f"{run.arch} h{run.heads}, LR {run.lr:.4g}, {run.iterations} steps, on "
            f"{labels[run.data]} ({differ}), so they cannot be averaged as seeds; give the "
            "directories without one of them, or train it with another --seed.")


def _differences(a: Run, b: Run) -> str:
    first, second = (a.identity, b.identity) if a.identity and b.identity else (a.plan, b.plan)
    keys = [k for k in sorted({*first, *second}) if first.get(k) != second.get(k)]
    if not keys:
        return "the same settings: a repeat of one run"
    shown = "; ".join(f"{k}: {first.get(k)} vs {second.get(k)}" for k in keys[:3])
    return f"they differ in {shown}" + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def match_optimizer(labels: Iterable[str], wanted: str) -> str:
    """The optimizer label (name with κ, clipsnr) that ``wanted`` names: the label itself, or
    an optimizer name that one label has (``adana`` for ``adana κ=0.85``); ``wanted``
    unchanged when nothing matches (the caller says what was found). UserError when a name
    matches several labels."""
    labels = set(labels)
    wanted = wanted.strip().replace("kappa=", "κ=")
    if wanted in labels:
        return wanted
    matches = sorted(label for label in labels if label.split(" ")[0] == wanted)
    if len(matches) > 1:
        listed = ", ".join(f"'{m}'" for m in matches)
        raise UserError(f"--vs {wanted} matches {len(matches)} optimizers ({listed}); name one "
                        f"of them, e.g. --vs '{matches[0]}'.")
    return matches[0] if matches else wanted


def complete_runs(runs: Sequence[Run], what: str) -> list[Run]:
    """The complete runs; UserError naming ``what`` needs them when there are none."""
    complete = [r for r in runs if r.complete]
    if not complete:
        raise UserError(f"{what} needs complete runs, and all {len(runs)} run(s) found are "
                        "partial; let them finish (a complete run has its final validation "
                        "record at step == iterations).")
    return complete
