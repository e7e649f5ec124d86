"""The training loop, top to bottom: build, evaluate, step, log, checkpoint, evaluate, sample.

`train(config)` is what `danastar train` runs in every process. `run` reads like nanoGPT's
train.py: open the data and plan the run, take the run directory (`train/start.py`: its lock,
resume or a fresh start), build the model (a fresh start with `--init_from` takes an export's
weights), wrap it for distribution, build the optimizer from
the plan, resume if a checkpoint exists, then loop over optimizer steps: apply the LR schedule,
`train_step` (accumulate gradients over `acc_steps` micro-batches, syncing only on the last;
clip the global gradient norm; step), then the parts of `train/parts.py`, each built from its
config section and owning its cadence: the metrics, the evaluation, the stop and the
checkpoint, with `Progress` (where the run stands) passed along. Batches are a pure function
of the step, so resuming from a checkpoint reproduces the uninterrupted run exactly.

Exit codes (rundir/exits.py): 0 only when the run has reached its total iterations with a step
that trained and a finite final validation loss, 2 a user error (such as a diverged run, a run
whose every step was skipped, or a resume with other settings), 75 when a checkpoint was saved
and work remains (after SIGTERM/SIGUSR1, the STOP file, or `--iterations_to_run`), so that a job
chain can tell "done" from "more to do", and 130 after Ctrl-C and a saved checkpoint.
`status.json` in the run directory says the same after every segment.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable
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
from danastar.rundir.exits import COMPLETE_EXIT_CODE
from danastar.rundir.files import CHECKPOINTS_DIR
from danastar.rundir.status import write_status
from danastar.scaling import Plan
from danastar.train import experts as per_expert
from danastar.train import identity as run_identity
from danastar.train import parallel
from danastar.train.checkpoint import Checkpointer
from danastar.train.data import TrainingData
from danastar.train.decision import StartDecision
from danastar.train.determinism import warm_up_cpu_math
from danastar.train.evaluation import evaluate as evaluate  # also known here
from danastar.train.evaluation import generate_sample
from danastar.train.logging import RunLogger, peak_flops
from danastar.train.optimizer import extend_run, make_optimizer
from danastar.train.parts import Evaluator, Metrics, Progress, Saver, Stop, Stopper
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
from danastar.train.step import train_step
from danastar.train.wrap import parallelize, unwrap


def train(config: TrainConfig, decision: StartDecision | None = None,
          initial_weights: Callable[[], dict[str, torch.Tensor]] | None = None) -> int:
    """Run (or resume) the configured training in this process; returns the exit code.

    `decision`: the start `danastar train` decided (`train.decision`: the plan and the run
    directory); None decides here, once the data is open. `initial_weights`: for
    `--init_from`, a function returning the full state dict a fresh start begins from (the
    command reads the export; a resume never calls it)."""
    env = parallel.setup_distributed(config)
    warm_up_cpu_math(env.device)  # before any forward pass: see determinism.py
    with contextlib.ExitStack() as cleanup:  # closes what `run` opens, also when it raises
        # last out: after a run that ended normally (or was refused alike on every rank) every
        # rank meets before the process group goes, so that none tears gloo down while another
        # may still be talking to it
        cleanup.push(lambda kind, error, _: parallel.teardown(
            synchronize=kind is None or getattr(error, "raised_by_every_rank", False)))
        return run(config, env, cleanup, decision, initial_weights)


def run(config: TrainConfig, env: parallel.Distributed, cleanup: contextlib.ExitStack,
        decision: StartDecision | None = None,
        initial_weights: Callable[[], dict[str, torch.Tensor]] | None = None) -> int:
    # -- data, plan and the run directory ------------------------------------------------------
    layout = batch_layout(config, env.world_size)
    data = TrainingData.open(config, env, layout)
    cleanup.callback(data.close)
    # What preparing the data can change of the decision: the vocabulary (plan again) and the
    # data the automatic directory was chosen on (choose again).
    plan = decision.plan if decision else None
    if plan is None or (plan.model.vocab_size, plan.world_size) != (data.vocab_size,
                                                               layout.data_parallel_size):
        plan = make_run_plan(config, data.vocab_size, layout.data_parallel_size)
    identity = run_identity.run_identity(config, plan, layout, data.tokens)
    notes: list[str] = []  # said once the logger exists (it writes into the run directory)
    run_dir = where_to_run(config, identity, layout, data, env, notes,
                           decision.run_dir if decision else None)
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
    if start.extensions:  # past the planned total: the decay and the schedule
        schedule = extend_run(optimizer, config, start.extensions)
    step = resumed.step if resumed else 0
    log.start(step, resumed=resumed is not None)
    if env.is_main:
        write_run_files(run_dir, config, plan, layout, shape, env.world_size)
        run_identity.record_start(run_dir, identity, config, layout, step, env.world_size,
                                  start.accepted,
                                  start.extensions[-1] if start.extensions else None)
    describe_start(log, run_dir, plan, layout, data, config, env, resumed,
                   extended=bool(start.extensions))
    if step >= plan.iterations:
        return already_finished(log, run_dir, data, config, env, step, plan.iterations)

    # -- the loop ------------------------------------------------------------------------------
    preemption = PreemptionFlag(announce=env.is_main).install()
    cleanup.callback(preemption.uninstall)
    cleanup.callback(checkpointer.wait)  # a checkpoint still being copied from $SLURM_TMPDIR
    autocast = parallel.autocast_context(config, env.device)
    progress = Progress(step, skipped_steps=resumed.skipped_steps if resumed else 0,
                        # routing counts per expert (MoE); older checkpoints start them at 0
                        expert_tally=per_expert.ExpertTally(
                            resumed.expert_tally if resumed else None))
    device_flops = peak_flops(env.device, config.train.peak_flops)
    metrics = Metrics(log=log, optimizer=optimizer, log_interval=config.train.log_interval,
                      iterations=plan.iterations, tokens_per_step=layout.tokens_per_step,
                      flops_per_token=flops_per_token,
                      peak_flops=device_flops * env.world_size if device_flops else None)
    evaluator = Evaluator(settings=config.train, model=model, core=core, optimizer=optimizer,
                          data=data, autocast=autocast, log=log,
                          tau_writer=(run_dir, plan) if env.is_main else None)
    stopper = Stopper(settings=config.train, preemption=preemption, run_dir=run_dir,
                      is_main=env.is_main, iterations=plan.iterations, start_step=step)
    saver = Saver(settings=config.checkpoint, checkpointer=checkpointer, core=core,
                  optimizer=optimizer, data=data, plan=plan, identity=identity)
    if env.is_main:
        write_status(run_dir, "running", step=step, total=plan.iterations, exit_code=None)
    if progress.step == 0:
        evaluator.maybe(progress, plan.iterations)
    model.train()
    while True:
        started = time.perf_counter()
        lr_factor = schedule(progress.step)
        apply_schedule(optimizer, lr_factor)
        result = train_step(model, optimizer, data, progress.step, acc_steps=layout.acc_steps,
                            grad_clip=config.optim.grad_clip, autocast=autocast, env=env,
                            stop_requested_here=stopper.asked_here)
        progress.count(result, log)
        metrics.after_step(progress, result, lr_factor, step_time=time.perf_counter() - started)
        evaluator.maybe(progress, plan.iterations)
        stop = stopper.decision(progress, result)
        saver.maybe(progress, stop)
        if stop is not None:
            return finish(stop, progress, log=log, run_dir=run_dir, is_main=env.is_main,
                          iterations=plan.iterations,
                          sample=lambda: generate_sample(model, core, data, config, autocast),
                          next_line=next_commands(run_dir, data, config),
                          sample_tokens=config.train.sample_tokens)


def finish(stop: Stop, progress: Progress, *, log: RunLogger, run_dir: Path, is_main: bool,
           iterations: int, sample: Callable[[], str], next_line: str,
           sample_tokens: int) -> int:
    """Say why the run stopped, record it in status.json, and at the end of a complete run show
    a sample and what to run next; returns the exit code (a failed run raises its sentence)."""
    failed = stop.state == "failed"
    if stop.state == "interrupted" or failed:
        log.end_progress()  # the line stands below the bar
    if stop.message and not failed:
        log.info(stop.message)
    if is_main:
        run_status.clear_stop(run_dir)  # consumed: the next segment must not stop at once
        write_status(run_dir, stop.state, step=progress.step, total=iterations,
                     exit_code=stop.exit_code, **({"reason": stop.message} if failed else {}))
    if failed:  # said once, on stderr, as every refusal is
        raise UserError.on_every_rank(stop.message, is_main)
    if stop.state != "complete":
        return stop.exit_code
    log.end_progress()
    if sample_tokens > 0:
        log.info("sample:\n" + sample())
    log.info(next_line)
    return stop.exit_code


# ----------------------------------------------------------------------------------------------
# Before the loop: what the run is, and a run that has nothing left to do

def describe_start(log: RunLogger, run_dir: Path, plan: Plan, layout: BatchLayout,
                   data: TrainingData, config: TrainConfig, env: parallel.Distributed,
                   resumed: Resumed | None, extended: bool = False) -> None:
    counts = plan.params
    active = (f" ({counts.exact_active_params / 1e6:.2f}M active)" if plan.model.moe else "")
    corpus_tokens = data.tokens.train_tokens
    log.info(f"run directory {run_dir}; {plan.model.arch} with "
             f"{counts.exact_total_params / 1e6:.2f}M parameters{active}, {plan.opt} at peak LR "
             f"{plan.lr:.3g}, {plan.iterations} steps "
             f"of {layout.tokens_per_step} tokens ("
             f"{epochs_text(plan.tokens, corpus_tokens, config.data.dataset)}), "
             f"{env.world_size} process(es), backend {env.backend}, device {env.device}")
    for warning in (repetition_warning(plan.tokens, layout.tokens_per_step, corpus_tokens,
                                       config.data.dataset),
                    # an extended run holds the decay it was continued with, past its start
                    None if extended else decay_warning(plan.weight_decay, plan.wd_ts)):
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
