"""How a run starts in its directory, before its first step: the directory chosen (`where_to_run`),
taken (`open_run_dir`: rank 0 holds its lock for the whole run; a resume must be the same run,
`train/identity.py`; a fresh start moves an earlier run's files aside), a fresh start's weights
taken from an export (`initialise`, `--init_from`), the checkpoint loaded (`resume`), and the
run's files written (`write_run_files`).

Rank 0 alone touches the directory's files and decides; every rank gets its answer, or raises
its refusal (which rank 0 alone prints): `decided_on_rank_0`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from danastar.config import TrainConfig, default_run_dir, save_yaml
from danastar.durable import write_atomic
from danastar.errors import UserError
from danastar.optim.dtensors import local
from danastar.rundir import lock as run_lock
from danastar.rundir.files import (
    CONFIG_FILE,
    ENVIRONMENT_FILE,
    MODEL_CONFIG_FILE,
    PLAN_FILE,
    RUN_FILE,
    move_aside,
)
from danastar.train import identity as run_identity
from danastar.train import parallel
from danastar.train.checkpoint import Checkpointer, Found, set_rng_state
from danastar.train.data import TrainingData
from danastar.train.logging import environment


@dataclass(frozen=True)
class RunStart:
    """What `open_run_dir` decided: the checkpoint to resume from (None: start afresh), what to
    tell the user, the accepted changes of a resume, and the extensions past the run's planned
    total it continues under, oldest first (`identity.run_extensions`)."""

    found: Found | None
    notes: list[str]
    accepted: list[str]
    extensions: list[dict] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class Resumed:
    """Where a run resumed from a checkpoint."""

    path: Path
    step: int
    skipped_steps: int
    saved_world_size: int
    same_topology: bool
    expert_tally: dict | None = None  # `ExpertTally.state_dict()`; absent in older checkpoints

    def describe(self) -> str:
        if self.same_topology:
            return f"resumed from {self.path} at step {self.step}"
        return (f"resumed from {self.path} at step {self.step} (saved by {self.saved_world_size} "
                f"processes: RNG states not restored, losses will differ slightly)")


def decided_on_rank_0(decide, env: parallel.Distributed):
    """`decide()` on rank 0 alone, its answer given to every rank; a refusal (UserError) there
    is raised on every rank (and printed by rank 0 alone)."""
    answer, problem = None, None
    if env.is_main:
        try:
            answer = decide()
        except UserError as error:
            problem = str(error)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        box = [(answer, problem)]
        torch.distributed.broadcast_object_list(box, src=0)
        answer, problem = box[0]
    if problem is not None:
        raise UserError.on_every_rank(problem, env.is_main)
    return answer


def where_to_run(config: TrainConfig, identity: dict, layout, data: TrainingData,
                 env: parallel.Distributed, notes: list[str],
                 chosen: run_identity.RunDirChoice | None = None) -> Path:
    """The directory `chosen` before the run started (`train.decision`) where that choice
    stands for the data now open; else --run_dir, or the automatic directory for this run's
    settings (`identity.choose_run_dir`: the default name, or one of its own beside it when
    that holds another run), chosen by rank 0 and given to every rank."""
    given = bool(config.logging.run_dir)
    if chosen is not None and chosen.holds_for(
            run_identity.dataset_identity(config.data.dataset, data.tokens), given):
        if chosen.note:
            notes.append(chosen.note)
        return chosen.path
    if given:
        return Path(config.logging.run_dir)
    run_dir, note = decided_on_rank_0(lambda: run_identity.choose_run_dir(
        default_run_dir(config), identity,
        lambda iterations: run_identity.planned_identity(
            run_identity.config_with_iterations(config, iterations), layout.world_size,
            data.tokens), run_identity.extension_keys(config)), env)
    if note:
        notes.append(note)
    return run_dir


def open_run_dir(run_dir: Path, identity: dict, config: TrainConfig, checkpointer: Checkpointer,
                 env: parallel.Distributed, cleanup: contextlib.ExitStack) -> RunStart:
    """Take `run_dir` and decide how this run starts there, on rank 0, before any checkpoint is
    loaded: rank 0 holds the directory's lock until `cleanup` closes (another live process there
    is refused, naming it), then decides."""
    def decide() -> RunStart:
        unlocked = cleanup.enter_context(run_lock.hold(run_dir, "danastar train",
                                                       "use another --run_dir"))
        start = decide_start(run_dir, identity, config, checkpointer)
        if unlocked:
            start.notes.append(unlocked)
        return start

    return decided_on_rank_0(decide, env)


def decide_start(run_dir: Path, identity: dict, config: TrainConfig,
                 checkpointer: Checkpointer) -> RunStart:
    """Resume the newest good checkpoint if it belongs to this same run (else refuse), or start
    afresh, first moving an earlier run's files into `previous-<time>/` (never deleting them)."""
    checkpointer.check_space()  # a full disk is said now, not at the first save
    if not config.checkpoint.auto_resume:
        aside = move_aside(run_dir)
        notes = [f"--no_auto_resume: moved the earlier run in {run_dir} to {aside}; starting "
                 f"afresh."] if aside else []
        return RunStart(None, notes, [])
    found = checkpointer.find_latest_here()  # refuses when checkpoints exist but none is usable
    if found is None:
        aside = move_aside(run_dir)
        notes = [f"no checkpoint to resume from in {run_dir}; moved the earlier run's files to "
                 f"{aside} and starting afresh."] if aside else []
        return RunStart(None, notes, [])
    record, notes, older = run_identity.read_run_file(run_dir), [], ""
    if record is not None:
        recorded = record["identity"]
    else:  # a run directory from before run.json: its checkpoint's plan says part of the story
        recorded = run_identity.identity_from_plan(checkpointer.saved_run_state(found)["plan"])
        older = f"; {run_dir} predates {RUN_FILE}, so only its saved plan was compared"
        notes.append(f"{run_dir} has no {RUN_FILE} (an older run directory): compared the "
                     f"settings its checkpoint's plan holds (model, optimizer, LR, batch, "
                     f"iterations), not its seed, schedule or dataset.")
    refused, accepted = run_identity.changed_settings(
        recorded, identity, step=found.step, complete=record is not None,
        extending=run_identity.extension_keys(config))
    if refused:
        raise run_identity.refusal(run_dir, found.step, refused, older)
    extensions = run_identity.run_extensions(record, identity, found.step, config)
    kept = [change for change in accepted if not change.endswith("(--extend)")]
    if kept:
        notes.append(f"resuming with changed settings that keep the trajectory: "
                     f"{'; '.join(kept)}.")
    if extensions:
        notes.append(extension_line(extensions))
    return RunStart(found, notes, accepted, extensions)


def extension_line(extensions: list[dict]) -> str:
    """The newest extension a run continues under, in a line (the log, the dry run)."""
    extension = extensions[-1]
    earlier = len(extensions) - 1
    before = f" (after {earlier} earlier extension{'s' * (earlier > 1)})" if earlier else ""
    rewarm = (f", back up to the peak over {extension['rewarm_steps']:,} step"
              f"{'s' if extension['rewarm_steps'] != 1 else ''}"
              if "rewarm_steps" in extension else "")
    return (f"extended past its planned total: from step {extension['from_step']:,}, "
            f"{extension['from_iterations']:,} → {extension['iterations']:,} steps, the LR "
            f"schedule by --extend {extension['schedule_rule']} (planned with its warm-up of "
            f"{extension['warmup_steps']:,} steps{rewarm}), the weight decay by --extend_decay "
            f"{extension['decay_rule']}{before}")


def resume(found: Found | None, env: parallel.Distributed, checkpointer: Checkpointer,
           core: torch.nn.Module, optimizer: torch.optim.Optimizer,
           data: TrainingData) -> Resumed | None:
    """Load checkpoint `found` (None: the run starts afresh) into the model, the optimizer, the
    data position and this rank's RNG."""
    if found is None:
        return None
    run_state = checkpointer.load(found, core, optimizer)
    check_finite_weights(found, core, env)
    data.loader.load_state_dict(run_state["data_position"])  # batches are a function of the step
    saved_world = len(run_state["rng"])
    same_topology = saved_world == env.world_size  # else the RNG streams cannot be matched
    if same_topology:
        set_rng_state(run_state["rng"][env.rank])
    return Resumed(found.path, run_state["step"], run_state["skipped_steps"], saved_world,
                   same_topology, run_state.get("expert_tally"))


def check_finite_weights(found: Found, core: torch.nn.Module, env: parallel.Distributed
                         ) -> None:
    """Refuse a checkpoint whose weights hold a NaN or an infinity (saved while a diverging run
    skipped its non-finite steps): resuming it could only skip every step again. Each rank
    looks at its own shards; all learn the count."""
    count = sum(1 for param in core.parameters() if not bool(torch.isfinite(local(param)).all()))
    total = parallel.all_reduce_sum(torch.tensor([float(count)], device=env.device)).item()
    if total:
        raise UserError.on_every_rank(
            f"checkpoint {found.path} holds non-finite weights (NaN or infinity in {int(total)} "
            f"tensor(s)), saved while the run diverged; move it out of {found.path.parent} to "
            f"resume from an earlier one, or pass --no_auto_resume to start afresh (with a "
            f"lower --lr).", env.is_main)


def initialise(model: torch.nn.Module, initial_weights, env: parallel.Distributed,
               source: str) -> str:
    """Load a fresh run's starting weights, `initial_weights()` (full tensors under the model's
    names, read by every rank), into the model as built, before it is sharded or wrapped, so
    that every rank starts from the same weights; returns the line that says so. The command
    checked them against the planned model; this refuses a model planned again since (another
    vocabulary, once the data was prepared)."""
    try:
        state = initial_weights()  # refuses non-finite weights (`export.init_from.read`)
    except UserError as error:  # every rank reads the same files: one message
        raise UserError.on_every_rank(str(error), env.is_main) from None
    own = model.state_dict()
    differ = sorted(set(own) ^ set(state)) or sorted(
        name for name in own if tuple(own[name].shape) != tuple(state[name].shape))
    if differ:
        name = differ[0]
        shapes = " vs ".join(str(list(weights[name].shape)) for weights in (state, own)
                             if name in weights)
        raise UserError.on_every_rank(
            f"--init_from {source} does not fit this run's model ({len(differ)} tensor(s) "
            f"differ, first {name}: {shapes or 'missing'}); train on the data the export was "
            f"trained on, with the flags of its model.", env.is_main)
    with torch.no_grad():
        model.load_state_dict(state)
    return f"starting from the weights of the export {source} (--init_from)"


def write_run_files(run_dir: Path, config: TrainConfig, plan, layout, model_config,
                    world_size: int) -> None:
    """The resolved config, the model's options, the environment and the plan, beside the
    metrics (rewritten at each start: a resume may change what keeps the trajectory)."""
    save_yaml(config, run_dir / CONFIG_FILE)
    write_atomic(run_dir / MODEL_CONFIG_FILE, json_text(model_config.to_dict()) + "\n")
    (run_dir / ENVIRONMENT_FILE).write_text(json_text(environment(world_size)))
    (run_dir / PLAN_FILE).write_text(
        json_text({"plan": run_record(plan, config, layout), "batch_layout": layout.to_dict()}))


def run_record(plan, config: TrainConfig, layout) -> dict:
    """The plan as analysis reads it: every derived setting (ω, κ, δ, clipsnr, weight decay and
    wd_ts, peak LR, parameter counts in both conventions, iterations), plus what a plan does not
    derive but a comparison of runs needs: the global batch, the seed and the schedule."""
    return {**plan.to_dict(), "global_batch": layout.global_batch, "seed": config.train.seed,
            "data_seed": config.data.data_seed, "scheduler": config.optim.scheduler}


def json_text(value) -> str:
    return json.dumps(value, indent=1, default=str)
