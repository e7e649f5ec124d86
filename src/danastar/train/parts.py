"""The training loop's parts, each built from its own config section with keyword arguments and
owning its cadence: where the run stands (`Progress`, what a checkpoint saves), the metrics
(`Metrics`), the evaluation (`Evaluator`), the stop (`Stopper`, `Stop`) and the checkpoint
(`Saver`). `train.loop.run` builds them and calls them in order after every step."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from danastar.config import CheckpointSection, TrainSection
from danastar.rundir import status as run_status
from danastar.rundir.exits import COMPLETE_EXIT_CODE, PREEMPTED_EXIT_CODE, USER_ERROR_EXIT_CODE
from danastar.scaling import Plan
from danastar.train import experts as per_expert
from danastar.train import tau_stats
from danastar.train.checkpoint import Checkpointer, checkpoint_kind, gather_rng_states
from danastar.train.data import TrainingData
from danastar.train.evaluation import evaluation
from danastar.train.logging import RunLogger
from danastar.train.signals import PreemptionFlag
from danastar.train.step import StepResult


@dataclass
class Progress:
    """Where the run stands: the step, the steps skipped as non-finite (in all and in a row),
    the experts' routing tally (a checkpoint saves these), and the final validation loss."""

    step: int
    skipped_steps: int
    expert_tally: per_expert.ExpertTally
    consecutive_skips: int = 0
    final_val_loss: float | None = None

    def count(self, result: StepResult, log: RunLogger) -> None:
        """A finite step trains the experts it routed to; a non-finite one was skipped (too
        many in a row end the run: `Stopper`). Then the step advances."""
        if result.finite:
            self.consecutive_skips = 0
            self.expert_tally.add(result.moe.get("moe_load"))
        else:
            self.skipped_steps += 1
            self.consecutive_skips += 1
            log.info(f"step {self.step}: non-finite loss {result.objective} or gradient norm "
                     f"{result.grad_norm}; step skipped ({self.consecutive_skips} in a row)")
        self.step += 1

    def saved(self) -> dict:
        """What a checkpoint records of it."""
        return {"step": self.step, "skipped_steps": self.skipped_steps,
                "expert_tally": self.expert_tally.state_dict()}


@dataclass(frozen=True)
class Metrics:
    """The training metrics every `log_interval` steps and at the last."""

    log: RunLogger
    optimizer: torch.optim.Optimizer
    log_interval: int
    iterations: int
    tokens_per_step: int
    flops_per_token: float
    peak_flops: float | None  # of all devices together, for the MFU; None when unknown

    def after_step(self, progress: Progress, result: StepResult, lr_factor: float,
                   step_time: float) -> None:
        step = progress.step
        if step % self.log_interval and step != self.iterations:
            return
        tokens_per_s = self.tokens_per_step / step_time
        mfu = self.flops_per_token * tokens_per_s / self.peak_flops if self.peak_flops else None
        metrics = {"step": step, "train_loss": result.cross_entropy, "loss": result.objective,
                   "lr": self.optimizer.param_groups[0]["lr"], "lr_factor": lr_factor,
                   "grad_norm": result.grad_norm, "tokens": step * self.tokens_per_step,
                   "tokens_per_s": tokens_per_s, "step_time": step_time, "mfu": mfu,
                   "skipped_steps": progress.skipped_steps, **result.moe}
        if hasattr(self.optimizer, "diagnostics"):
            metrics.update({f"optim/{k}": v for k, v in self.optimizer.diagnostics().items()})
        self.log.log(metrics)
        self.log.progress(step, metrics)


@dataclass(frozen=True)
class Evaluator:
    """The validation loss every `eval_interval` steps (and τ statistics at the steps
    `tau_stats.collection_due` picks), the final one, on `final_eval_batches`, at the last."""

    settings: TrainSection  # eval_interval, eval_batches, final_eval_batches, collect_tau_stats
    model: torch.nn.Module  # as wrapped for distribution
    core: torch.nn.Module  # the model itself
    optimizer: torch.optim.Optimizer
    data: TrainingData
    autocast: contextlib.AbstractContextManager
    log: RunLogger
    tau_writer: tuple[Path, Plan] | None  # where rank 0 writes τ statistics; None elsewhere

    def maybe(self, progress: Progress, iterations: int) -> None:
        final, interval = progress.step == iterations, self.settings.eval_interval
        if final or progress.step % interval == 0:
            self.evaluate(progress, final)
        if not final and self.settings.collect_tau_stats and tau_stats.collection_due(
                progress.step, interval):
            arrays = tau_stats.collect(self.core, self.optimizer)  # every rank: τ may be sharded
            if self.tau_writer is not None:
                run_dir, plan = self.tau_writer
                tau_stats.write(run_dir, progress.step, interval, arrays, plan)

    def evaluate(self, progress: Progress, final: bool) -> None:
        batches = self.settings.final_eval_batches if final else self.settings.eval_batches
        val_loss, router = evaluation(self.model, self.data.validation_batches(batches),
                                      self.autocast)
        step = progress.step
        metrics = {"step": step, "val_loss": val_loss,
                   "val_perplexity": math.exp(min(val_loss, 50.0)),
                   "tokens": step * self.data.layout.tokens_per_step,
                   **{f"val_{key}": value for key, value in router.items()}}
        if step == 0:
            metrics["loss/init"] = val_loss
        # every rank: the experts' tensors may be sharded
        experts = per_expert.statistics(self.core, self.optimizer, progress.expert_tally)
        if experts is not None:
            metrics["experts"] = experts
        if final:
            metrics["final"] = True
            progress.final_val_loss = val_loss
        self.log.log(metrics)
        self.log.info(f"step {step}: {'final ' if final else ''}validation loss {val_loss:.4f}")


@dataclass(frozen=True)
class Stop:
    """How the run ends after this step: status.json's state, the exit code, and what to say
    once the checkpoint is saved."""

    state: str
    exit_code: int
    message: str | None = None


@dataclass(frozen=True)
class Stopper:
    """Whether the run ends after a step, and how: failed after too many non-finite steps in
    a row; at the last step complete, or failed when no step trained or the final validation
    loss is not finite; else stopped when some rank was asked to (a signal, the STOP file) or
    `iterations_to_run` steps are done; None goes on."""

    settings: TrainSection  # max_nonfinite_steps, iterations_to_run
    preemption: PreemptionFlag
    run_dir: Path
    is_main: bool
    iterations: int
    start_step: int

    def asked_here(self) -> bool:
        """A signal to this process, or (rank 0) the STOP file."""
        return self.preemption.is_set or (self.is_main and run_status.stop_requested(
            self.run_dir))

    def decision(self, progress: Progress, result: StepResult) -> Stop | None:
        step, preemption = progress.step, self.preemption
        if progress.consecutive_skips >= self.settings.max_nonfinite_steps:
            return Stop("failed", USER_ERROR_EXIT_CODE, f"training diverged: "
                        f"{progress.consecutive_skips} non-finite steps in a row at step {step}; "
                        f"lower the learning rate (--lr) or clip harder (a smaller --grad_clip).")
        if step == self.iterations:
            return self.end_of_run(progress)
        if result.stop_requested and preemption.interrupted:
            return Stop("interrupted", preemption.exit_code, f"Ctrl-C: checkpoint saved at step "
                        f"{step}; to resume, run the same command again.")
        if result.stop_requested:
            cause = (preemption.received.name if preemption.received
                     else f"{run_status.stop_file(self.run_dir)}"
                     if self.is_main and run_status.stop_requested(self.run_dir)
                     else "a stop signal on another rank")
            return Stop("preempted", preemption.exit_code, f"{cause}: checkpoint saved at step "
                        f"{step}; exiting with code {preemption.exit_code} so that the job can "
                        f"be requeued and resumed.")
        to_run = self.settings.iterations_to_run
        if to_run and step - self.start_step >= to_run:
            return Stop("segment done", PREEMPTED_EXIT_CODE, f"stopping after {to_run} steps "
                        f"(--iterations_to_run); exiting with code {PREEMPTED_EXIT_CODE}: the "
                        f"next run resumes at step {step}.")
        return None

    @staticmethod
    def end_of_run(progress: Progress) -> Stop:
        """The last step's outcome: complete, unless every step of the run was skipped (its
        weights are the ones it started from) or its final validation loss is not finite."""
        step, skipped, final = progress.step, progress.skipped_steps, progress.final_val_loss
        if skipped >= step:
            return Stop("failed", USER_ERROR_EXIT_CODE, f"training failed: every one of its "
                        f"{step} steps had a non-finite loss or gradient norm and was skipped, "
                        f"so its weights never changed; check the starting weights "
                        f"(--init_from) and the data, or lower the learning rate (--lr).")
        if final is not None and not math.isfinite(final):
            return Stop("failed", USER_ERROR_EXIT_CODE, f"training failed: its final "
                        f"validation loss is {final} ({skipped} of its {step} steps skipped as "
                        f"non-finite); lower the learning rate (--lr) or clip harder (a smaller "
                        f"--grad_clip), and train again with --no_auto_resume or another "
                        f"--run_dir.")
        return Stop("complete", COMPLETE_EXIT_CODE)


@dataclass(frozen=True)
class Saver:
    """A checkpoint when `checkpoint_kind` says so (always before the run stops), never of a
    failed run: it is not the run's to continue."""

    settings: CheckpointSection
    checkpointer: Checkpointer
    core: torch.nn.Module
    optimizer: torch.optim.Optimizer
    data: TrainingData
    plan: Plan
    identity: dict

    def maybe(self, progress: Progress, stop: Stop | None) -> None:
        if stop is not None and stop.state == "failed":
            return
        kind = checkpoint_kind(progress.step, self.plan.iterations, self.settings,
                               stop is not None)
        if kind is None:
            return
        self.checkpointer.save(progress.step, self.core, self.optimizer, {
            **progress.saved(), "data_position": self.data.loader.state_dict(),
            "rng": gather_rng_states(), "plan": self.plan.to_dict(), "identity": self.identity},
            kind)
