"""danastar's optimizers in the Hugging Face `Trainer`, with the paper's weight decay.

The log-time weight decay needs the run's length T (``wd_ts = T // 10``, ``weight_decay =
ω / wd_ts``). Two ways to give the Trainer an optimizer whose T is the Trainer's own:

    from danastar.integrations.hf import DanastarTrainer, optimizer_cls_and_kwargs

    args = TrainingArguments(..., learning_rate=3e-4, max_steps=T)  # weight_decay stays 0
    trainer = Trainer(model, args, train_dataset=dataset,
                      optimizer_cls_and_kwargs=optimizer_cls_and_kwargs(model, args, "adana"))

    # or: T from the Trainer once it knows it (max_steps, or the epochs' steps)
    trainer = DanastarTrainer(model, args, train_dataset=dataset, optimizer_name="adana")

Either way the parameters that `danastar.optim.param_groups` picks decay (not embeddings, norms
or biases), the peak LR is ``args.learning_rate`` and the schedule is the Trainer's
(``lr_scheduler_type``, ``warmup_steps``): the optimizer reads its schedule factor as the current
LR over the peak. The Trainer's checkpoints save and restore the optimizer's state as they do
AdamW's. An AdamW-style ``TrainingArguments(weight_decay=...)`` is refused. A run too short for
the paper's decay (a few hundred steps or fewer at ω = 4) is warned of, naming the fix
(danastar.optim.ShortRunWeightDecayWarning).

A run planned for T1 steps is continued to T2 by resuming it with ``max_steps=T2`` and the
callback `ExtendRun` (docs/optimizers.md, "Extending a run past its planned T"):

    trainer = DanastarTrainer(model, args_with_max_steps_T2, train_dataset=dataset,
                              callbacks=[ExtendRun(planned_steps=T1, from_step=T1)])
    trainer.train(resume_from_checkpoint=f"{output_dir}/checkpoint-{T1}")
"""

from __future__ import annotations

import warnings
from typing import Any

from danastar.extras import MissingExtra

try:  # first, so that without the extra this says so before importing anything else
    import transformers
    from accelerate import Accelerator  # noqa: F401  (the Trainer needs it)
except ModuleNotFoundError as error:
    if error.name not in ("transformers", "accelerate"):
        raise
    raise MissingExtra("danastar.integrations.hf", "hf-trainer", error.name) from None

import torch
from torch import nn

from danastar.hparams import (
    LR_RULES,
    check,
    check_decay_rule,
    reanchored_schedule,
    rewarmed_schedule,
    stretched_schedule,
)
from danastar.optim import extend_optimizer, param_groups
from danastar.optim.registry import OPTIMIZERS
from danastar.optim.weight_decay import (
    PAPER_OMEGA,
    ShortRunWeightDecayWarning,
    log_time_weight_decay,
    warn_short_run,
)

# danastar's optimizers with the log-time weight decay whose other settings do not depend on T.
SUPPORTED = ("adana", "dana-mk4", "dana-star", "dana-star-mk4", "adamw-decaying-wd")
# What a Trainer's user changes when the run is too short for its log-time weight decay.
SHORT_RUN_FIX = ("more steps (TrainingArguments max_steps, or more epochs), a smaller omega "
                 "(omega=... here), or omega=0 (no decay) for a smoke test")


def check_trainer_arguments(args: transformers.TrainingArguments, name: str) -> None:
    """Refuse what the Trainer would pass on wrongly: an unknown optimizer, AdamW's weight decay."""
    if name not in SUPPORTED:
        raise ValueError(f"{name!r} is not one of danastar's optimizers with the log-time weight "
                         f"decay ({', '.join(SUPPORTED)}); for another, pass the Trainer "
                         "optimizer_cls_and_kwargs=(cls, kwargs) yourself")
    if args.weight_decay:
        raise ValueError(
            f"TrainingArguments(weight_decay={args.weight_decay:g}) is AdamW's decay, scaled by "
            f"the LR, which {name} does not take: set TrainingArguments(weight_decay=0.0) and "
            f"give danastar the log-time decay's strength ω instead, e.g. "
            f"optimizer_cls_and_kwargs(model, args, {name!r}, omega=4.0)")


def trainer_optimizer(model: nn.Module, args: transformers.TrainingArguments, name: str,
                      total_steps: int, omega: float = PAPER_OMEGA,
                      **hparams: Any) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The class and keyword arguments (``params`` included) of the registry's ``name`` for a
    run of ``total_steps`` optimizer steps: the paper's form ``omega``/``total_steps``, unless
    ``hparams`` give the explicit ``weight_decay``/``wd_ts``; other ``hparams`` (``kappa``,
    ``delta``, ``clipsnr``, ...) go to the constructor."""
    check_trainer_arguments(args, name)
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"the run's length must be known to set the weight decay of {name}: "
                         f"TrainingArguments(max_steps=T) with T >= 1, got {total_steps}; or use "
                         "DanastarTrainer, which takes T from the Trainer's epochs")
    registered = OPTIMIZERS[name]
    kwargs: dict[str, Any] = {**registered.variant, "params": param_groups(model),
                              "lr": args.learning_rate}
    if "weight_decay" not in hparams and "wd_ts" not in hparams:
        kwargs.update(omega=omega, total_steps=total_steps)
        # a bad omega is the constructor's to refuse
        weight_decay, wd_ts = log_time_weight_decay(omega, total_steps) \
            if isinstance(omega, int | float) and omega > 0 else (0.0, None)
    else:
        weight_decay, wd_ts = hparams.get("weight_decay", 0.0), hparams.get("wd_ts")
    warn_short_run([{"weight_decay": weight_decay, "wd_ts": wd_ts}], SHORT_RUN_FIX)
    kwargs.update(hparams)
    return registered.constructor, kwargs


def optimizer_cls_and_kwargs(model: nn.Module, args: transformers.TrainingArguments,
                             name: str = "adana", *, omega: float = PAPER_OMEGA,
                             **hparams: Any) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """For ``Trainer(..., optimizer_cls_and_kwargs=...)``: danastar's ``name`` over ``model``
    for a run of ``args.max_steps`` steps (which must be set). The Trainer takes the param
    groups from ``kwargs["params"]`` (and removes them from the dict): build one per Trainer."""
    return trainer_optimizer(model, args, name, args.max_steps, omega, **hparams)


class DanastarTrainer(transformers.Trainer):
    """A `transformers.Trainer` whose optimizer is danastar's ``optimizer_name`` (default
    "adana"), built when the Trainer builds its own, for the run's length as the Trainer
    computed it (``max_steps``, or the epochs times the steps per epoch).

    ``omega`` and ``optimizer_hparams`` are as for `optimizer_cls_and_kwargs`; every other
    argument is the Trainer's.
    """

    def __init__(self, *args: Any, optimizer_name: str = "adana", omega: float = PAPER_OMEGA,
                 optimizer_hparams: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        check_trainer_arguments(self.args, optimizer_name)  # at once, not when training starts
        self.optimizer_name = optimizer_name
        self.omega = omega
        self.optimizer_hparams = dict(optimizer_hparams or {})

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        self._total_steps = num_training_steps  # transformers 4 builds the optimizer through here
        super().create_optimizer_and_scheduler(num_training_steps)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        if self.optimizer is None:
            # The run's length: transformers 5 sets state.max_steps before it builds the
            # optimizer; transformers 4 passes it to create_optimizer_and_scheduler.
            total_steps = (self.state.max_steps or getattr(self, "_total_steps", 0)
                           or self.args.max_steps)
            cls, kwargs = trainer_optimizer(self.model if model is None else model, self.args,
                                            self.optimizer_name, total_steps, self.omega,
                                            **self.optimizer_hparams)
            with warnings.catch_warnings():  # said above, in the Trainer's words
                warnings.simplefilter("ignore", ShortRunWeightDecayWarning)
                self.optimizer = cls(kwargs.pop("params"), **kwargs)
        return self.optimizer


def trainer_schedule(args: transformers.TrainingArguments, warmup_steps: int, total_steps: int):
    """The Trainer's LR schedule factor (``lr_scheduler_type`` and its kwargs) for a run of
    ``total_steps`` with ``warmup_steps``, as a function of the step: the lambda of the
    scheduler transformers builds, over a stand-in optimizer so that nothing real is touched."""
    stand_in = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = transformers.get_scheduler(args.lr_scheduler_type, stand_in, warmup_steps,
                                           total_steps, args.lr_scheduler_kwargs)
    check(isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR),
          f"lr_scheduler_type {args.lr_scheduler_type!r} is no function of the step, so it "
          "cannot be continued past its total: use one of transformers' LambdaLR schedules "
          "(linear, cosine, cosine_with_min_lr, constant_with_warmup, wsd ...)")
    return scheduler.lr_lambdas[0]


class ExtendRun(transformers.TrainerCallback):
    """Continue a run planned for ``planned_steps`` (T1) steps past them, to the resumed
    Trainer's ``max_steps`` (T2), from step ``from_step`` (the checkpoint's: T1 for a finished
    run): the Trainer's LR schedule continued by ``lr_rule`` ("stretch", "reanchor" or
    "rewarm", as `danastar.optim.extended_schedule`, with ``rewarm_steps`` and ``peak``), the
    weight decay by ``decay_rule`` ("keep", "reanchor" or "planned", as ``optimizer.extend_to``
    with ``planned_steps``: "planned" gives a coupled decay, AdamW's, T1/T2 of itself). Applied
    when training begins, after the checkpoint is loaded; the same callback on a later resume
    gives the same schedule and decay, so the run resumes as it would have gone on."""

    def __init__(self, planned_steps: int, from_step: int, lr_rule: str = "stretch",
                 decay_rule: str = "keep", rewarm_steps: int | None = None, peak: float = 1.0):
        check(lr_rule in LR_RULES,
              f"lr_rule must be one of {', '.join(LR_RULES)}, got {lr_rule!r}")
        check_decay_rule(decay_rule)
        self.planned_steps, self.from_step = planned_steps, from_step
        self.lr_rule, self.decay_rule = lr_rule, decay_rule
        self.rewarm_steps, self.peak = rewarm_steps, peak

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None,
                       **kwargs):
        new_total = state.max_steps
        extend_optimizer(getattr(optimizer, "optimizer", optimizer), new_total,
                         from_step=self.from_step, decay_rule=self.decay_rule,
                         planned_steps=self.planned_steps)
        scheduler = getattr(lr_scheduler, "scheduler", lr_scheduler)
        scheduler.lr_lambdas = [self.schedule(args, new_total)] * len(scheduler.lr_lambdas)

    def schedule(self, args: transformers.TrainingArguments, new_total: int):
        """The Trainer's schedule planned for T1, continued to ``new_total``."""
        warmup = args.get_warmup_steps(self.planned_steps)
        old = trainer_schedule(args, warmup, self.planned_steps)
        if self.lr_rule == "rewarm":
            rewarm = warmup if self.rewarm_steps is None else self.rewarm_steps
            restarted = trainer_schedule(args, rewarm, new_total - self.from_step)
            return rewarmed_schedule(old, restarted, self.from_step, rewarm, self.peak)
        anchor = max(self.from_step, warmup)
        check(anchor < self.planned_steps or old(anchor) > 0,
              f"the Trainer's {args.lr_scheduler_type} schedule has ended at 0 by step {anchor}, "
              f"so there is nothing left to {self.lr_rule}; use lr_rule 'rewarm'")
        if self.lr_rule == "stretch":
            return stretched_schedule(old, anchor, self.planned_steps, new_total)
        planned = trainer_schedule(args, warmup, new_total)
        return reanchored_schedule(old, planned, anchor, new_total)


__all__ = ["DanastarTrainer", "ExtendRun", "SUPPORTED", "optimizer_cls_and_kwargs",
           "trainer_optimizer"]
