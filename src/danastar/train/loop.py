"""The training loop, top to bottom: build, evaluate, step, log, checkpoint, evaluate, sample.

`train(config)` is what `danastar train` runs in every process. `run` reads like nanoGPT's
train.py: open the data and plan the run, take the run directory (`train/start.py`: its lock,
resume or a fresh start), build the model (a fresh start with `--init_from` takes an export's
weights), wrap it for distribution, build the optimizer from
the plan, resume if a checkpoint exists, then loop over optimizer steps: apply the LR schedule,
`train_step` (accumulate gradients over `acc_steps` micro-batches, syncing only on the last;
clip the global gradient norm; step), then `maybe_log`, `maybe_evaluate`, `stop_decision` and
`maybe_save`, each owning its cadence. Batches are a pure function of the step, so resuming from
a checkpoint reproduces the uninterrupted run exactly.

Exit codes (rundir/exits.py): 0 only when the run has reached its total iterations with a step
that trained and a finite final validation loss, 2 a user error (such as a diverged run, a run
whose every step was skipped, or a resume with other settings), 75 when a checkpoint was saved
and work remains (after SIGTERM/SIGUSR1, the STOP file, or `--iterations_to_run`), so that a job
chain can tell "done" from "more to do", and 130 after Ctrl-C and a saved checkpoint.
`status.json` in the run directory says the same after every segment.
"""

from __future__ import annotations

import contextlib
import math
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from danastar.config import (
    BatchLayout,
    TrainConfig,
    batch_layout,
    config_notes,
    epochs_text,
    make_run_plan,
    model_config,
    repetition_warning,
)
from danastar.errors import UserError
from danastar.models import build_model
from danastar.optim import apply_schedule
from danastar.rundir import status as run_status
from danastar.rundir.exits import COMPLETE_EXIT_CODE, PREEMPTED_EXIT_CODE, USER_ERROR_EXIT_CODE
from danastar.rundir.files import CHECKPOINTS_DIR
from danastar.rundir.status import write_status
from danastar.scaling import Plan
from danastar.train import experts as per_expert
from danastar.train import identity as run_identity
from danastar.train import parallel, tau_stats
from danastar.train.checkpoint import Checkpointer, checkpoint_kind, gather_rng_states
from danastar.train.data import TrainingData
from danastar.train.determinism import warm_up_cpu_math
from danastar.train.evaluation import evaluate as evaluate  # also known here
from danastar.train.evaluation import evaluation, generate_sample
from danastar.train.logging import RunLogger, peak_flops
from danastar.train.optimizer import make_optimizer
from danastar.train.plan import decay_warning
from danastar.train.signals import PreemptionFlag
from danastar.train.start import (
    Resumed,
    initialise,
    open_run_dir,
    resume,
    where_to_run,
    write_run_files,
)
from danastar.train.step import StepResult, train_step
from danastar.train.wrap import parallelize, unwrap


def train(config: TrainConfig, plan: Plan | None = None,
          initial_weights: Callable[[], dict[str, torch.Tensor]] | None = None) -> int:
    """Run (or resume) the configured training in this process; returns the exit code.

    `plan`: the run's plan when the caller has made it already (`make_run_plan` for this
    config, vocabulary and data-parallel size); None plans here, once the data is open.
    `initial_weights`: for `--init_from`, a function returning the full state dict a fresh
    start begins from (the command reads the export; a resume never calls it)."""
    env = parallel.setup_distributed(config)
    warm_up_cpu_math(env.device)  # before any forward pass: see determinism.py
    with contextlib.ExitStack() as cleanup:  # closes what `run` opens, also when it raises
        # last out: after a run that ended normally (or was refused alike on every rank) every
        # rank meets before the process group goes, so that none tears gloo down while another
        # may still be talking to it
        cleanup.push(lambda kind, error, _: parallel.teardown(
            synchronize=kind is None or getattr(error, "raised_by_every_rank", False)))
        return run(config, env, cleanup, plan, initial_weights)


def run(config: TrainConfig, env: parallel.Distributed, cleanup: contextlib.ExitStack,
        plan: Plan | None = None,
        initial_weights: Callable[[], dict[str, torch.Tensor]] | None = None) -> int:
    # -- data, plan and the run directory ------------------------------------------------------
    layout = batch_layout(config, env.world_size)
    data = TrainingData.open(config, env, layout)
    cleanup.callback(data.close)
    # A plan made before the data was prepared may have assumed another vocabulary: plan again.
    if plan is None or (plan.vocab_size, plan.world_size) != (data.vocab_size,
                                                               layout.data_parallel_size):
        plan = make_run_plan(config, data.vocab_size, layout.data_parallel_size)
    identity = run_identity.run_identity(config, plan, layout, data.tokens)
    notes: list[str] = []  # said once the logger exists (it writes into the run directory)
    run_dir = where_to_run(config, identity, layout, data, env, notes)
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    parallel.barrier()
    checkpointer = Checkpointer(run_dir / CHECKPOINTS_DIR, sharded=env.sharded,
                                keep_latest=config.checkpoint.keep_latest, log=notes.append)
    # before anything is loaded or written; the lock is held until the run ends
    start = open_run_dir(run_dir, identity, config, checkpointer, env, cleanup)

    # -- model, distribution, optimizer --------------------------------------------------------
    torch.manual_seed(config.train.seed)  # the same initial weights on every rank
    shape = model_config(config, plan)
    with torch.device(env.device):
        model = build_model(shape)
    if initial_weights is not None and start.found is None:  # before sharding: whole tensors
        notes.append(initialise(model, initial_weights, env, config.train.init_from))
    flops_per_token = model.flops_per_token(layout.sequence_length)
    model = parallelize(model, config, env)
    core = unwrap(model)  # the model itself: parameter groups, sampling, checkpoints
    optimizer, schedule = make_optimizer(plan, config, core.param_groups(plan.weight_decay))

    # -- logging and resume --------------------------------------------------------------------
    log = RunLogger(run_dir, config, rank=env.rank, total_steps=plan.iterations)
    cleanup.callback(log.close)
    checkpointer.log = log.info
    for note in [*notes, *start.notes, *config_notes(config)]:
        log.info(note)
    resumed = resume(start.found, env, checkpointer, core, optimizer, data)
    step = resumed.step if resumed else 0
    log.start(step, resumed=resumed is not None)
    if env.is_main:
        write_run_files(run_dir, config, plan, layout, shape, env.world_size)
        run_identity.record_start(run_dir, identity, config, layout, step, env.world_size,
                                  start.accepted)
    describe_start(log, run_dir, plan, layout, data, config, env, resumed)
    if step >= plan.iterations:
        return already_finished(log, run_dir, data, config, env, step, plan.iterations)

    # -- the loop ------------------------------------------------------------------------------
    preemption = PreemptionFlag(announce=env.is_main).install()
    cleanup.callback(preemption.uninstall)
    cleanup.callback(checkpointer.wait)  # a checkpoint still being copied from $SLURM_TMPDIR
    t = Training(config, env, layout, plan, run_dir, data, model, core, optimizer, identity, log,
                 checkpointer, preemption, parallel.autocast_context(config, env.device),
                 flops_per_token, peak_flops(env.device, config.train.peak_flops), step,
                 skipped_steps=resumed.skipped_steps if resumed else 0,
                 # routing counts per expert (MoE); checkpoints from before it start them at 0
                 expert_tally=per_expert.ExpertTally(resumed.expert_tally if resumed else None))
    if env.is_main:
        write_status(run_dir, "running", step=step, total=plan.iterations, exit_code=None)
    if t.step == 0:
        maybe_evaluate(t)
    start_step = t.step
    model.train()
    while True:
        started = time.perf_counter()
        lr_factor = schedule(t.step)
        apply_schedule(optimizer, lr_factor)
        result = train_step(model, optimizer, data, t.step, acc_steps=layout.acc_steps,
                            grad_clip=config.optim.grad_clip, autocast=t.autocast, env=env,
                            stop_requested_here=lambda: stop_asked_here(t))
        count_step(t, result)
        t.step += 1
        maybe_log(t, result, lr_factor, step_time=time.perf_counter() - started)
        maybe_evaluate(t)
        stop = stop_decision(t, result, start_step)
        maybe_save(t, stop)
        if stop is not None:
            return finish(t, stop)


# ----------------------------------------------------------------------------------------------
# The run's state and what happens after each step

@dataclass
class Training:
    """What the loop's pieces share: the run's parts, and where it stands (`step`,
    `skipped_steps`, the experts' routing tally), which a checkpoint saves."""

    config: TrainConfig
    env: parallel.Distributed
    layout: BatchLayout
    plan: Plan
    run_dir: Path
    data: TrainingData
    model: torch.nn.Module  # as wrapped for distribution: the forward passes
    core: torch.nn.Module  # the model itself: parameter groups, sampling, checkpoints
    optimizer: torch.optim.Optimizer
    identity: dict
    log: RunLogger
    checkpointer: Checkpointer
    preemption: PreemptionFlag
    autocast: contextlib.AbstractContextManager
    flops_per_token: float
    peak_flops: float | None  # of one device, for the MFU; None when unknown
    step: int
    skipped_steps: int
    expert_tally: per_expert.ExpertTally
    consecutive_skips: int = 0
    final_val_loss: float | None = None  # the last step's validation loss, once evaluated


@dataclass(frozen=True)
class Stop:
    """How the run ends after this step: status.json's state, the exit code, and what to say
    once the checkpoint is saved."""

    state: str
    exit_code: int
    message: str | None = None


def stop_asked_here(t: Training) -> bool:
    """A signal to this process, or (rank 0) the STOP file."""
    return t.preemption.is_set or (t.env.is_main and run_status.stop_requested(t.run_dir))


def count_step(t: Training, result: StepResult) -> None:
    """A finite step trains the experts it routed to; a non-finite one was skipped (too many in
    a row end the run: `stop_decision`)."""
    if result.finite:
        t.consecutive_skips = 0
        t.expert_tally.add(result.moe.get("moe_load"))
        return
    t.skipped_steps += 1
    t.consecutive_skips += 1
    t.log.info(f"step {t.step}: non-finite loss {result.objective} or gradient norm "
               f"{result.grad_norm}; step skipped ({t.consecutive_skips} in a row)")


def maybe_log(t: Training, result: StepResult, lr_factor: float, step_time: float) -> None:
    """The training metrics every `log_interval` steps and at the last."""
    step, tokens_per_step = t.step, t.layout.tokens_per_step
    if step % t.config.train.log_interval and step != t.plan.iterations:
        return
    tokens_per_s = tokens_per_step / step_time
    mfu = (t.flops_per_token * tokens_per_s / (t.peak_flops * t.env.world_size)
           if t.peak_flops else None)
    metrics = {"step": step, "train_loss": result.cross_entropy, "loss": result.objective,
               "lr": t.optimizer.param_groups[0]["lr"], "lr_factor": lr_factor,
               "grad_norm": result.grad_norm, "tokens": step * tokens_per_step,
               "tokens_per_s": tokens_per_s, "step_time": step_time, "mfu": mfu,
               "skipped_steps": t.skipped_steps, **result.moe}
    if hasattr(t.optimizer, "diagnostics"):
        metrics.update({f"optim/{k}": v for k, v in t.optimizer.diagnostics().items()})
    t.log.log(metrics)
    t.log.progress(step, metrics)


def maybe_evaluate(t: Training) -> None:
    """The validation loss every `eval_interval` steps (and τ statistics at those
    `tau_stats.collection_due` picks), the final one at the last step."""
    final = t.step == t.plan.iterations
    if final or t.step % t.config.train.eval_interval == 0:
        evaluate_and_log(t, final)
    if not final and t.config.train.collect_tau_stats and tau_stats.collection_due(
            t.step, t.config.train.eval_interval):
        arrays = tau_stats.collect(t.core, t.optimizer)  # on every rank: τ may be sharded
        if t.env.is_main:
            tau_stats.write(t.run_dir, t.step, t.config.train.eval_interval, arrays, t.plan)


def evaluate_and_log(t: Training, final: bool) -> None:
    batches = t.config.train.final_eval_batches if final else t.config.train.eval_batches
    val_loss, router = evaluation(t.model, t.data.validation_batches(batches), t.autocast)
    metrics = {"step": t.step, "val_loss": val_loss,
               "val_perplexity": math.exp(min(val_loss, 50.0)),
               "tokens": t.step * t.layout.tokens_per_step,
               **{f"val_{key}": value for key, value in router.items()}}
    if t.step == 0:
        metrics["loss/init"] = val_loss
    experts = per_expert.statistics(t.core, t.optimizer, t.expert_tally)  # every rank: sharded
    if experts is not None:
        metrics["experts"] = experts
    if final:
        metrics["final"] = True
        t.final_val_loss = val_loss
    t.log.log(metrics)
    t.log.info(f"step {t.step}: {'final ' if final else ''}validation loss {val_loss:.4f}")


def stop_decision(t: Training, result: StepResult, start_step: int) -> Stop | None:
    """Whether the run ends after this step, and how: failed after too many non-finite steps in
    a row; at the last step complete, or failed when no step trained or the final validation
    loss is not finite; else stopped when some rank was asked to (a signal, the STOP file) or
    `--iterations_to_run` steps are done; None goes on."""
    step, preemption = t.step, t.preemption
    if t.consecutive_skips >= t.config.train.max_nonfinite_steps:
        return Stop("failed", USER_ERROR_EXIT_CODE, f"training diverged: {t.consecutive_skips} "
                    f"non-finite steps in a row at step {step}; lower the learning rate (--lr) "
                    f"or clip harder (a smaller --grad_clip).")
    if step == t.plan.iterations:
        return end_of_run(t)
    if result.stop_requested and preemption.interrupted:
        return Stop("interrupted", preemption.exit_code, f"Ctrl-C: checkpoint saved at step "
                    f"{step}; to resume, run the same command again.")
    if result.stop_requested:
        cause = (preemption.received.name if preemption.received
                 else f"{run_status.stop_file(t.run_dir)}"
                 if t.env.is_main and run_status.stop_requested(t.run_dir)
                 else "a stop signal on another rank")
        return Stop("preempted", preemption.exit_code, f"{cause}: checkpoint saved at step "
                    f"{step}; exiting with code {preemption.exit_code} so that the job can be "
                    f"requeued and resumed.")
    to_run = t.config.train.iterations_to_run
    if to_run and step - start_step >= to_run:
        return Stop("segment done", PREEMPTED_EXIT_CODE, f"stopping after {to_run} steps "
                    f"(--iterations_to_run); exiting with code {PREEMPTED_EXIT_CODE}: the next "
                    f"run resumes at step {step}.")
    return None


def end_of_run(t: Training) -> Stop:
    """The last step's outcome: complete, unless every step of the run was skipped (its weights
    are the ones it started from) or its final validation loss is not finite."""
    if t.skipped_steps >= t.step:
        return Stop("failed", USER_ERROR_EXIT_CODE, f"training failed: every one of its {t.step} "
                    f"steps had a non-finite loss or gradient norm and was skipped, so its "
                    f"weights never changed; check the starting weights (--init_from) and the "
                    f"data, or lower the learning rate (--lr).")
    if t.final_val_loss is not None and not math.isfinite(t.final_val_loss):
        return Stop("failed", USER_ERROR_EXIT_CODE, f"training failed: its final validation loss "
                    f"is {t.final_val_loss} ({t.skipped_steps} of its {t.step} steps skipped as "
                    f"non-finite); lower the learning rate (--lr) or clip harder (a smaller "
                    f"--grad_clip), and train again with --no_auto_resume or another --run_dir.")
    return Stop("complete", COMPLETE_EXIT_CODE)


def maybe_save(t: Training, stop: Stop | None) -> None:
    """A checkpoint when `checkpoint_kind` says so (always before the run stops), never of a
    failed run: it is not the run's to continue."""
    if stop is not None and stop.state == "failed":
        return
    kind = checkpoint_kind(t.step, t.plan.iterations, t.config.checkpoint, stop is not None)
    if kind is None:
        return
    t.checkpointer.save(t.step, t.core, t.optimizer, {
        "step": t.step, "skipped_steps": t.skipped_steps,
        "expert_tally": t.expert_tally.state_dict(),
        "data_position": t.data.loader.state_dict(), "rng": gather_rng_states(),
        "plan": t.plan.to_dict(), "identity": t.identity}, kind)


def finish(t: Training, stop: Stop) -> int:
    """Say why the run stopped, record it in status.json, and at the end of a complete run show
    a sample and what to run next; returns the exit code (a failed run raises its sentence)."""
    failed = stop.state == "failed"
    if stop.state == "interrupted" or failed:
        t.log.end_progress()  # the line stands below the bar
    if stop.message and not failed:
        t.log.info(stop.message)
    if t.env.is_main:
        run_status.clear_stop(t.run_dir)  # consumed: the next segment must not stop at once
        write_status(t.run_dir, stop.state, step=t.step, total=t.plan.iterations,
                     exit_code=stop.exit_code, **({"reason": stop.message} if failed else {}))
    if failed:  # said once, on stderr, as every refusal is
        raise UserError.on_every_rank(stop.message, t.env.is_main)
    if stop.state != "complete":
        return stop.exit_code
    t.log.end_progress()
    if t.config.train.sample_tokens > 0:
        t.log.info("sample:\n" + generate_sample(t.model, t.core, t.data, t.config, t.autocast))
    t.log.info(next_commands(t.run_dir, t.data, t.config))
    return stop.exit_code


# ----------------------------------------------------------------------------------------------
# Before the loop: what the run is, and a run that has nothing left to do

def describe_start(log: RunLogger, run_dir: Path, plan: Plan, layout: BatchLayout,
                   data: TrainingData, config: TrainConfig, env: parallel.Distributed,
                   resumed: Resumed | None) -> None:
    active = (f" ({plan.exact_active_params / 1e6:.2f}M active)" if plan.model.moe else "")
    corpus_tokens = data.tokens.train_tokens
    log.info(f"run directory {run_dir}; {plan.arch} with {plan.exact_total_params / 1e6:.2f}M "
             f"parameters{active}, {plan.opt} at peak LR {plan.lr:.3g}, {plan.iterations} steps "
             f"of {layout.tokens_per_step} tokens ("
             f"{epochs_text(plan.tokens, corpus_tokens, config.data.dataset)}), "
             f"{env.world_size} process(es), backend {env.backend}, device {env.device}")
    for warning in (repetition_warning(plan.tokens, layout.tokens_per_step, corpus_tokens,
                                       config.data.dataset),
                    decay_warning(plan.weight_decay, plan.wd_ts)):
        if warning:
            log.info(warning)
    if resumed:
        log.info(resumed.describe())


def already_finished(log: RunLogger, run_dir: Path, data: TrainingData, config: TrainConfig,
                     env: parallel.Distributed, step: int, iterations: int) -> int:
    if env.is_main:
        write_status(run_dir, "complete", step=step, total=iterations, exit_code=0)
    log.info(f"this run already finished at step {step}; pass --no_auto_resume or another "
             f"--run_dir to train again.")
    log.info(next_commands(run_dir, data, config))
    return COMPLETE_EXIT_CODE


def next_commands(run_dir: Path, data: TrainingData, config: TrainConfig) -> str:
    """The last line of a complete run: what to run next on it (its table, and a sample from
    a prompt where the data has a tokenizer)."""
    where = shlex.quote(str(run_dir))
    line = f"next: danastar results {where}"
    if data.tokenizer is not None:
        prompt = "ROMEO:" if config.data.dataset == "shakespeare" else "The"
        line += f"  |  danastar generate {where} --prompt {shlex.quote(prompt)}"
    return line
