"""The training loop, top to bottom: build, evaluate, step, log, checkpoint, evaluate, sample.

`train(config)` is what `danastar train` runs in every process. It reads like nanoGPT's
train.py: set up the processes and the data, build the model, wrap it for distribution, build
the optimizer from the scaling plan, resume if a checkpoint exists (`resume`), then loop over
optimizer steps: apply the LR schedule, `train_step` (accumulate gradients over `acc_steps`
micro-batches, syncing only on the last; clip the global gradient norm; step), log, evaluate,
and checkpoint when `checkpoint_kind` says so. Batches are a pure function of the step, so
resuming from a checkpoint reproduces the uninterrupted run exactly.

Before anything is built, the run directory is taken (`open_run_dir`): rank 0 holds its lock for
the whole run (`rundir/lock.py`: one live run per directory), a resume must be the same run
(`train/identity.py`), and a fresh start moves an earlier run's files aside.

Exit codes: 0 only when the run has reached its total iterations, 2 a user error (such as a
diverged run, or a resume with other settings), `PREEMPTED_EXIT_CODE` (75) when a checkpoint
was saved and work remains (after SIGTERM/SIGUSR1, the stop file, or `--iterations_to_run`), so
that a job chain can tell "done" from "more to do", and `INTERRUPTED_EXIT_CODE` (130) after
Ctrl-C and a saved checkpoint. `status.json` in the run directory says the same after every
segment.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from danastar.config import (
    CheckpointSection,
    TrainConfig,
    batch_layout,
    config_notes,
    default_run_dir,
    epochs_text,
    make_run_plan,
    model_config,
    repetition_warning,
    save_yaml,
    schedule_options,
)
from danastar.errors import UserError
from danastar.models import build_model
from danastar.optim import apply_schedule, build_optimizer, get_schedule
from danastar.optim.base import local
from danastar.rundir import lock as run_lock
from danastar.train import experts as per_expert
from danastar.train import identity as run_identity
from danastar.train import parallel, tau_stats
from danastar.train.checkpoint import Checkpointer, Found, gather_rng_states, set_rng_state
from danastar.train.data import TrainingData
from danastar.train.determinism import warm_up_cpu_math
from danastar.train.logging import RunLogger, environment, peak_flops
from danastar.train.signals import PREEMPTED_EXIT_CODE, PreemptionFlag
from danastar.train.status import STOP_FILE, write_status


def train(config: TrainConfig) -> int:
    """Run (or resume) the configured training in this process; returns the exit code."""
    env = parallel.setup_distributed(config)
    warm_up_cpu_math(env.device)  # before any forward pass: see determinism.py
    with contextlib.ExitStack() as cleanup:  # closes what `run` opens, also when it raises
        # last out: after a run that ended normally (or was refused alike on every rank) every
        # rank meets before the process group goes, so that none tears gloo down while another
        # may still be talking to it
        cleanup.push(lambda kind, error, _: parallel.teardown(
            synchronize=kind is None or getattr(error, "raised_by_every_rank", False)))
        return run(config, env, cleanup)


def run(config: TrainConfig, env: parallel.Distributed, cleanup: contextlib.ExitStack) -> int:
    # -- data and plan -------------------------------------------------------------------------
    layout = batch_layout(config, env.world_size)
    data = TrainingData.open(config, env, layout)
    cleanup.callback(data.close)
    plan = make_run_plan(config, data.vocab_size, layout.data_parallel_size)
    iterations = plan.iterations
    identity = run_identity.run_identity(config, plan, layout, data.tokens)
    notes: list[str] = []  # said once the logger exists (it writes into the run directory)
    run_dir = where_to_run(config, identity, layout, data, env, notes)
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    parallel.barrier()
    checkpointer = Checkpointer(run_dir / "checkpoints", sharded=env.sharded,
                                keep_latest=config.checkpoint.keep_latest, log=notes.append)
    # before anything is loaded or written; the lock is held until the run ends
    start = open_run_dir(run_dir, identity, config, checkpointer, env, cleanup)

    # -- model, distribution, optimizer --------------------------------------------------------
    torch.manual_seed(config.train.seed)  # the same initial weights on every rank
    with torch.device(env.device):
        model = build_model(model_config(config, plan))
    flops_per_token = model.flops_per_token(layout.sequence_length)
    model = parallel.parallelize(model, config, env)
    core = parallel.unwrap(model)  # the model itself: parameter groups, sampling, checkpoints
    optimizer, schedule = make_optimizer(plan, config, core.param_groups(plan.weight_decay))

    # -- logging and resume --------------------------------------------------------------------
    log = RunLogger(run_dir, config, rank=env.rank, total_steps=iterations)
    cleanup.callback(log.close)
    checkpointer.log = log.info
    for note in [*notes, *start.notes, *config_notes(config)]:
        log.info(note)
    resumed = resume(start.found, env, checkpointer, core, optimizer, data)
    step = resumed.step if resumed else 0
    skipped_total = resumed.skipped_steps if resumed else 0
    # routing counts per expert (MoE); checkpoints from before it start them at zero
    expert_tally = per_expert.ExpertTally(resumed.expert_tally if resumed else None)
    log.start(step, resumed=resumed is not None)
    if env.is_main:
        write_run_files(run_dir, config, plan, layout, env)
        run_identity.record_start(run_dir, identity, config, layout, step, env.world_size,
                                  start.accepted)
    active = (f" ({plan.exact_active_params / 1e6:.2f}M active)" if plan.model.moe else "")
    corpus_tokens = data.tokens.train_tokens
    log.info(f"run directory {run_dir}; {plan.arch} with {plan.exact_total_params / 1e6:.2f}M "
             f"parameters{active}, {plan.opt} at peak LR {plan.lr:.3g}, {iterations} steps of "
             f"{layout.tokens_per_step} tokens ("
             f"{epochs_text(plan.tokens, corpus_tokens, config.data.dataset)}), "
             f"{env.world_size} process(es), backend {env.backend}, device {env.device}")
    warning = repetition_warning(plan.tokens, layout.tokens_per_step, corpus_tokens,
                                 config.data.dataset)
    if warning:
        log.info(warning)
    if resumed:
        log.info(resumed.describe())
    if step >= iterations:
        if env.is_main:
            write_status(run_dir, "complete", step=step, total=iterations, exit_code=0)
        log.info(f"this run already finished at step {step}; pass --no_auto_resume or another "
                 f"--run_dir to train again.")
        log.info(next_commands(run_dir, data, config))
        return 0

    autocast = autocast_context(config, env.device)
    peak = peak_flops(env.device, config.train.peak_flops)
    preemption = PreemptionFlag(announce=env.is_main).install()
    cleanup.callback(preemption.uninstall)
    cleanup.callback(checkpointer.wait)  # a checkpoint still being copied from $SLURM_TMPDIR
    stop_file = run_dir / STOP_FILE  # asks for a stop like SIGUSR1 (a job script's time limit)
    if env.is_main:
        write_status(run_dir, "running", step=step, total=iterations, exit_code=None)

    def save(kind: str) -> None:
        checkpointer.save(step, core, optimizer, {
            "step": step, "skipped_steps": skipped_total,
            "expert_tally": expert_tally.state_dict(),
            "data_position": data.loader.state_dict(), "rng": gather_rng_states(),
            "plan": plan.to_dict(), "identity": identity}, kind)

    def evaluate_and_log(final: bool = False) -> float:
        batches = config.train.final_eval_batches if final else config.train.eval_batches
        val_loss, router = evaluation(model, data.validation_batches(batches), autocast)
        metrics = {"step": step, "val_loss": val_loss,
                   "val_perplexity": math.exp(min(val_loss, 50.0)),
                   "tokens": step * layout.tokens_per_step,
                   **{f"val_{key}": value for key, value in router.items()}}
        if step == 0:
            metrics["loss/init"] = val_loss
        experts = per_expert.statistics(core, optimizer, expert_tally)  # on every rank: sharded
        if experts is not None:
            metrics["experts"] = experts
        if final:
            metrics["final"] = True
        elif config.train.collect_tau_stats and tau_stats.collection_due(
                step, config.train.eval_interval):
            arrays = tau_stats.collect(core, optimizer)  # on every rank: τ may be sharded
            if env.is_main:
                tau_stats.write(run_dir, step, config.train.eval_interval, arrays, plan)
        log.log(metrics)
        log.info(f"step {step}: {'final ' if final else ''}validation loss {val_loss:.4f}")
        return val_loss

    # -- the loop ------------------------------------------------------------------------------
    if step == 0:
        evaluate_and_log()
    start_step, consecutive_skips, exit_code = step, 0, 0
    model.train()
    while step < iterations:
        started = time.perf_counter()
        lr_factor = schedule(step)
        apply_schedule(optimizer, lr_factor)
        result = train_step(model, optimizer, data, step, acc_steps=layout.acc_steps,
                            grad_clip=config.optim.grad_clip, autocast=autocast, env=env,
                            stop_requested_here=lambda: preemption.is_set
                            or (env.is_main and stop_file.exists()))
        if result.finite:
            consecutive_skips = 0
            expert_tally.add(result.moe.get("moe_load"))  # a skipped step trained no expert
        else:
            skipped_total += 1
            consecutive_skips += 1
            log.info(f"step {step}: non-finite loss {result.objective} or gradient norm "
                     f"{result.grad_norm}; step skipped ({consecutive_skips} in a row)")
            if consecutive_skips >= config.train.max_nonfinite_steps:
                raise UserError(f"training diverged: {consecutive_skips} non-finite steps in a "
                                f"row at step {step + 1}; lower the learning rate (--lr) or clip "
                                f"harder (a smaller --grad_clip).")
        step += 1
        step_time = time.perf_counter() - started

        if step % config.train.log_interval == 0 or step == iterations:
            tokens_per_s = layout.tokens_per_step / step_time
            mfu = flops_per_token * tokens_per_s / (peak * env.world_size) if peak else None
            metrics = {"step": step, "train_loss": result.cross_entropy, "loss": result.objective,
                       "lr": optimizer.param_groups[0]["lr"], "lr_factor": lr_factor,
                       "grad_norm": result.grad_norm, "tokens": step * layout.tokens_per_step,
                       "tokens_per_s": tokens_per_s, "step_time": step_time, "mfu": mfu,
                       "skipped_steps": skipped_total, **result.moe}
            if hasattr(optimizer, "diagnostics"):
                metrics.update({f"optim/{k}": v for k, v in optimizer.diagnostics().items()})
            log.log(metrics)
            log.progress(step, metrics)
        if step == iterations:
            evaluate_and_log(final=True)
        elif step % config.train.eval_interval == 0:
            evaluate_and_log()

        to_run = config.train.iterations_to_run
        stop_for_chain = bool(to_run) and step - start_step >= to_run and step < iterations
        kind = checkpoint_kind(step, iterations, config.checkpoint,
                               stopping=result.stop_requested or stop_for_chain)
        if kind is not None:
            save(kind)
        if result.stop_requested and step < iterations:
            exit_code = preemption.exit_code
            if preemption.interrupted:
                log.end_progress()
                log.info(f"Ctrl-C: checkpoint saved at step {step}; to resume, run the same "
                         f"command again.")
                state = "interrupted"
            else:
                signal_name = (preemption.received.name if preemption.received
                               else f"{stop_file}" if env.is_main and stop_file.exists()
                               else "a stop signal on another rank")
                log.info(f"{signal_name}: checkpoint saved at step {step}; exiting with code "
                         f"{exit_code} so that the job can be requeued and resumed.")
                state = "preempted"
            break
        if stop_for_chain:
            log.info(f"stopping after {to_run} steps (--iterations_to_run); exiting with code "
                     f"{PREEMPTED_EXIT_CODE}: the next run resumes at step {step}.")
            exit_code, state = PREEMPTED_EXIT_CODE, "segment done"
            break
    else:
        state = "complete"

    if env.is_main:
        stop_file.unlink(missing_ok=True)  # consumed: the next segment must not stop at once
        write_status(run_dir, state, step=step, total=iterations, exit_code=exit_code)

    if step == iterations and config.train.sample_tokens > 0:
        log.end_progress()
        log.info("sample:\n" + generate_sample(model, core, data, config, autocast))
    if step == iterations:
        log.end_progress()
        log.info(next_commands(run_dir, data, config))
    return exit_code


def next_commands(run_dir: Path, data: TrainingData, config: TrainConfig) -> str:
    """The last line of a complete run: what to run next on it (its table, and a sample from
    a prompt where the data has a tokenizer)."""
    import shlex

    where = shlex.quote(str(run_dir))
    line = f"next: danastar results {where}"
    if data.tokenizer is not None:
        prompt = "ROMEO:" if config.data.dataset == "shakespeare" else "The"
        line += f"  |  danastar generate {where} --prompt {shlex.quote(prompt)}"
    return line


# ----------------------------------------------------------------------------------------------
# One optimizer step

@dataclass(frozen=True)
class StepResult:
    """One optimizer step, averaged over its micro-batches and over the ranks."""

    objective: float  # cross-entropy + z-loss (+ weighted router losses): what the gradient
    # descends (logged as `loss`)
    cross_entropy: float  # the cross-entropy alone (logged as `train_loss`, like `val_loss`)
    grad_norm: float  # the global gradient norm before clipping
    stop_requested: bool  # some rank received SIGTERM/SIGUSR1
    moe: dict = field(default_factory=dict)  # a mixture of experts' routing (`RoutingSums`)

    @property
    def finite(self) -> bool:
        return math.isfinite(self.objective) and math.isfinite(self.grad_norm)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: TrainingData,
               step: int, *, acc_steps: int, grad_clip: float, autocast,
               env: parallel.Distributed,
               stop_requested_here: bool | Callable[[], bool] = False) -> StepResult:
    """Accumulate gradients over `acc_steps` micro-batches (syncing them only on the last), clip
    the global norm, and step the optimizer unless the loss or the norm is not finite."""
    objective_sum = torch.zeros((), device=env.device)
    cross_entropy_sum = torch.zeros((), device=env.device)
    routing = RoutingSums(env.device)
    for micro_step in range(acc_steps):
        inputs, targets = data.train_batch(step, micro_step)
        with parallel.gradient_sync(model, sync=micro_step == acc_steps - 1):
            with autocast:
                out = model(inputs, targets)
            (out.loss / acc_steps).backward()
        objective_sum += out.loss.detach()
        cross_entropy_sum += out.ce.detach()
        routing.add(out)

    grad_norm = clip_grad_norm(model, grad_clip)
    # One all-reduce carries the losses, a mixture of experts' routing statistics and whether any
    # rank was asked to stop, and one copy to the host (the step's only wait for the device)
    # brings them with the gradient norm.
    stats = torch.cat([torch.stack([objective_sum / acc_steps, cross_entropy_sum / acc_steps,
                                    torch.full((), float(stop_requested(stop_requested_here)),
                                               device=env.device)]).float(),
                       routing.flat() / acc_steps])
    parallel.all_reduce_sum(stats)
    norm = grad_norm.float().reshape(1)
    values = torch.cat([stats[:2] / env.world_size, stats[2:3], norm,
                        stats[3:] / env.world_size]).tolist()
    objective_mean, cross_entropy_mean, stop_flag, grad_norm = values[:4]
    result = StepResult(objective_mean, cross_entropy_mean, grad_norm, stop_flag > 0,
                        routing.metrics(values[4:]))
    if result.finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return result


# What a mixture of experts reports per forward (`LossOutput.moe`) and the loop averages over the
# micro-batches and the ranks: the router losses (unweighted), the dropped share of (token, expert)
# pairs and the per-layer load (fraction of routed assignments per expert). Every micro-batch on
# every rank has the same number of tokens, so the averaged load is the global batch's.
ROUTER_LOSSES = ("moe_aux_loss", "moe_z_loss", "moe_entropy_loss")
ROUTING_AVERAGED = (*ROUTER_LOSSES, "moe_dropped_fraction", "moe_load")


class RoutingSums:
    """The routing statistics of one optimizer step, summed over its micro-batches (nothing
    for a dense model)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, out) -> None:
        moe = getattr(out, "moe", None) or {}
        for key in ROUTING_AVERAGED:
            if key in moe:  # a count may come from the host: all go where the losses are
                value = torch.as_tensor(moe[key]).detach().float().to(self.device)
                self.sums[key] = value if key not in self.sums else self.sums[key] + value

    def flat(self) -> torch.Tensor:
        if not self.sums:
            return torch.zeros(0, device=self.device)
        return torch.cat([value.reshape(-1) for value in self.sums.values()])

    def metrics(self, values: list[float]) -> dict:
        """The averaged `values` (as `flat` laid them out) as metrics.jsonl entries: the router
        losses, `moe_dropped_fraction`, `moe_load` (per MoE layer, the fraction of routed
        assignments per expert) and `moe_max_load` (the largest of them times the R routed
        experts: 1 when balanced, R/k when every token goes to the same k experts)."""
        metrics, at = {}, 0
        for key, value in self.sums.items():
            size = value.numel()
            metrics[key] = values[at] if value.dim() == 0 else \
                torch.tensor(values[at:at + size]).reshape(value.shape).tolist()
            at += size
        load = metrics.get("moe_load")
        if load:
            metrics["moe_max_load"] = max(max(row) for row in load) * len(load[0])
        return metrics


def stop_requested(flag: bool | Callable[[], bool]) -> bool:
    """A stop flag, read as late as possible (after the backward pass) when it is a callable, so
    that a signal during this step stops the run after this step rather than the next."""
    return flag() if callable(flag) else flag


def checkpoint_kind(step: int, iterations: int, settings: CheckpointSection,
                    stopping: bool) -> str | None:
    """Which checkpoint to write after `step`: "permanent" every `permanent_every` steps, else
    "latest" every `latest_every` steps, at the end, and before stopping early; None otherwise."""
    every, permanent = settings.latest_every, settings.permanent_every
    if permanent > 0 and step % permanent == 0:
        return "permanent"
    if step == iterations or (every > 0 and step % every == 0) or stopping:
        return "latest"
    return None


# ----------------------------------------------------------------------------------------------
# Resume and the run directory

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


@dataclass(frozen=True)
class RunStart:
    """What `open_run_dir` decided: the checkpoint to resume from (None: start afresh), what to
    tell the user, and the accepted changes of a resume."""

    found: Found | None
    notes: list[str]
    accepted: list[str]


def open_run_dir(run_dir: Path, identity: dict, config: TrainConfig, checkpointer: Checkpointer,
                 env: parallel.Distributed, cleanup: contextlib.ExitStack) -> RunStart:
    """Take `run_dir` and decide how this run starts there, on rank 0 (which alone touches the
    files), before any checkpoint is loaded: rank 0 holds the directory's lock until `cleanup`
    closes (another live process there is refused, naming it), then decides. Every rank gets
    its answer, or raises its refusal (which rank 0 alone prints)."""
    def decide() -> RunStart:
        unlocked = cleanup.enter_context(run_lock.hold(run_dir, "danastar train",
                                                       "use another --run_dir"))
        start = decide_start(run_dir, identity, config, checkpointer)
        if unlocked:
            start.notes.append(unlocked)
        return start

    return decided_on_rank_0(decide, env)


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
                 env: parallel.Distributed, notes: list[str]) -> Path:
    """--run_dir, or the automatic directory for this run's settings
    (`identity.choose_run_dir`: the default name, or one of its own beside it when that holds
    another run), chosen by rank 0 and given to every rank."""
    if config.logging.run_dir:
        return Path(config.logging.run_dir)
    run_dir, note = decided_on_rank_0(lambda: run_identity.choose_run_dir(
        default_run_dir(config), identity,
        lambda iterations: run_identity.planned_identity(
            run_identity.config_with_iterations(config, iterations), layout.world_size,
            data.tokens)), env)
    if note:
        notes.append(note)
    return run_dir


def decide_start(run_dir: Path, identity: dict, config: TrainConfig,
                 checkpointer: Checkpointer) -> RunStart:
    """Resume the newest good checkpoint if it belongs to this same run (else refuse), or start
    afresh, first moving an earlier run's files into `previous-<time>/` (never deleting them)."""
    checkpointer.check_space()  # a full disk is said now, not at the first save
    if not config.checkpoint.auto_resume:
        aside = run_identity.move_aside(run_dir)
        notes = [f"--no_auto_resume: moved the earlier run in {run_dir} to {aside}; starting "
                 f"afresh."] if aside else []
        return RunStart(None, notes, [])
    found = checkpointer.find_latest_here()  # refuses when checkpoints exist but none is usable
    if found is None:
        aside = run_identity.move_aside(run_dir)
        notes = [f"no checkpoint to resume from in {run_dir}; moved the earlier run's files to "
                 f"{aside} and starting afresh."] if aside else []
        return RunStart(None, notes, [])
    record, notes, older = run_identity.read_run_file(run_dir), [], ""
    if record is not None:
        recorded = record["identity"]
    else:  # a run directory from before run.json: its checkpoint's plan says part of the story
        recorded = run_identity.identity_from_plan(checkpointer.saved_run_state(found)["plan"])
        older = f"; {run_dir} predates {run_identity.RUN_FILE}, so only its saved plan was compared"
        notes.append(f"{run_dir} has no {run_identity.RUN_FILE} (an older run directory): "
                     f"compared the settings its checkpoint's plan holds (model, optimizer, LR, "
                     f"batch, iterations), not its seed, schedule or dataset.")
    refused, accepted = run_identity.changed_settings(recorded, identity, step=found.step,
                                                      complete=record is not None)
    if refused:
        raise run_identity.refusal(run_dir, found.step, refused, older)
    if accepted:
        notes.append(f"resuming with changed settings that keep the trajectory: "
                     f"{'; '.join(accepted)}.")
    return RunStart(found, notes, accepted)


def resume(found: Found | None, env: parallel.Distributed, checkpointer: Checkpointer,
           core: torch.nn.Module, optimizer: torch.optim.Optimizer,
           data: TrainingData) -> Resumed | None:
    """Load checkpoint `found` (None: the run starts afresh) into the model, the optimizer, the
    data position and this rank's RNG."""
    if found is None:
        return None
    run_state = checkpointer.load(found, core, optimizer)
    data.loader.load_state_dict(run_state["data_position"])  # batches are a function of the step
    saved_world = len(run_state["rng"])
    same_topology = saved_world == env.world_size  # else the RNG streams cannot be matched
    if same_topology:
        set_rng_state(run_state["rng"][env.rank])
    return Resumed(found.path, run_state["step"], run_state["skipped_steps"], saved_world,
                   same_topology, run_state.get("expert_tally"))


def write_run_files(run_dir: Path, config: TrainConfig, plan, layout, env) -> None:
    """The resolved config, the environment and the plan, beside the metrics."""
    save_yaml(config, run_dir / "config.yaml")
    (run_dir / "environment.json").write_text(json_text(environment(env.world_size)))
    (run_dir / "plan.json").write_text(
        json_text({"plan": run_record(plan, config, layout), "batch_layout": layout.to_dict()}))


def run_record(plan, config: TrainConfig, layout) -> dict:
    """The plan as analysis reads it: every derived setting (ω, κ, δ, clipsnr, weight decay and
    wd_ts, peak LR, parameter counts in both conventions, iterations), plus what a plan does not
    derive but a comparison of runs needs: the global batch, the seed and the schedule."""
    return {**plan.to_dict(), "global_batch": layout.global_batch, "seed": config.train.seed,
            "data_seed": config.data.data_seed, "scheduler": config.optim.scheduler}


# ----------------------------------------------------------------------------------------------
# Pieces

def make_optimizer(plan, config: TrainConfig, param_groups: list[dict]):
    """The planned optimizer over `param_groups` and its LR schedule.

    Both check their hyperparameters (ValueError); a bad value is the user's to fix.
    """
    try:
        optimizer = build_optimizer(plan.opt, param_groups, lr=plan.lr, **plan.optimizer_hparams)
        schedule = get_schedule(config.optim.scheduler, plan.warmup_steps, plan.iterations,
                                **schedule_options(config))
    except ValueError as error:
        raise UserError(f"{plan.opt} with schedule {config.optim.scheduler} cannot run this "
                        f"plan ({str(error).rstrip('.')}); change the optimizer settings or "
                        f"--iterations.") from None
    return optimizer, schedule


def autocast_context(config: TrainConfig, device: torch.device):
    """bf16 autocast on CUDA by default; off on CPU unless asked for (it is slow there)."""
    wanted = config.train.autocast
    if wanted == "bf16" or (wanted == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the global L2 norm of all gradients; returns the norm before clipping (a 0-dim
    tensor on the device: nothing here waits for the device).

    DTensor-safe: under TP + FSDP2 the gradients live on two meshes (the 2-D one of the sharded
    projections, the 1-D data-parallel one of the rest), which one `torch.stack` cannot mix, so the
    norm is taken per mesh and the per-mesh norms are combined.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    by_mesh: dict = {}
    for grad in grads:
        by_mesh.setdefault(getattr(grad, "device_mesh", None), []).append(grad)
    norms = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(group, norm_type=2.0)
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    total = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
    if max_norm > 0:
        # As torch.nn.utils.clip_grad_norm_: scale by min(1, max_norm / (norm + 1e-6)), in fp32.
        # The scale is the same on every rank, so each rank scales its own shards in place.
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        torch._foreach_mul_([local(grad) for grad in grads], scale)
    return total


def evaluate(model: torch.nn.Module, batches, autocast) -> float:
    """Mean validation cross-entropy (see `evaluation`)."""
    return evaluation(model, batches, autocast)[0]


@torch.no_grad()
def evaluation(model: torch.nn.Module, batches, autocast) -> tuple[float, dict[str, float]]:
    """Mean validation cross-entropy, and a mixture of experts' mean router losses (computed,
    never added to the loss, in evaluation). Every rank runs the same number of forwards (FSDP
    needs all ranks in each one) on its rows of each fixed batch; the sums are all-reduced."""
    model.eval()
    totals, keys = None, []
    for inputs, targets in batches:
        with autocast:
            out = model(inputs, targets)
        moe = getattr(out, "moe", None) or {}
        keys = [key for key in ROUTER_LOSSES if key in moe]
        rows = float(inputs.shape[0])
        batch_total = torch.stack([out.ce.float() * rows, torch.tensor(rows, device=inputs.device),
                                   *(moe[key].float().to(inputs.device) * rows for key in keys)])
        totals = batch_total if totals is None else totals + batch_total
    parallel.all_reduce_sum(totals)
    model.train()
    means = (totals / totals[1]).tolist()
    return means[0], dict(zip(keys, means[2:]))


@torch.no_grad()
def generate_sample(model, core, data: TrainingData, config: TrainConfig, autocast) -> str:
    """A short continuation of the prompt (every rank samples the same; sharded models need all)."""
    prompt = data.encode(config.train.sample_prompt) or [data.eot_id]
    new_tokens = min(config.train.sample_tokens, core.config.max_seq_len - len(prompt))
    idx = torch.tensor([prompt], dtype=torch.long, device=data.device)
    model.eval()
    with torch.random.fork_rng(devices=[data.device] if data.device.type == "cuda" else []):
        torch.manual_seed(config.train.seed)
        with autocast:
            out = core.generate(idx, new_tokens, temperature=0.8, top_k=50)
    return data.decode(out[0].tolist())


def json_text(value) -> str:
    import json

    return json.dumps(value, indent=1, default=str)
