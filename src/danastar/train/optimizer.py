"""The planned optimizer over a model's parameter groups, and its LR schedule."""

from __future__ import annotations

import warnings

from danastar.config import TrainConfig, schedule_options
from danastar.errors import UserError
from danastar.hparams import ShortRunWeightDecayWarning
from danastar.optim import build_optimizer, extend_optimizer, get_schedule
from danastar.optim.schedules import continued_schedule


def make_optimizer(plan, config: TrainConfig, param_groups: list[dict]):
    """The planned optimizer over `param_groups` and its LR schedule.

    Both check their hyperparameters (ValueError); a bad value is the user's to fix. The
    optimizers' short-run weight-decay warning, in the library's words, is not shown: the run
    says it in the command's (`train.plan.decay_warning`).
    """
    try:
        # The state's dtype is passed only when asked for: other optimizers do not take it.
        state = {"state_dtype": config.optim.state_dtype} \
            if config.optim.state_dtype != "float32" else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ShortRunWeightDecayWarning)
            optimizer = build_optimizer(plan.opt, param_groups, lr=plan.lr,
                                        **plan.optimizer_hparams, **state)
        schedule = get_schedule(config.optim.scheduler, plan.warmup_steps, plan.iterations,
                                **schedule_options(config))
    except ValueError as error:
        raise UserError(f"{plan.opt} with schedule {config.optim.scheduler} cannot run this "
                        f"plan ({str(error).rstrip('.')}); change the optimizer settings or "
                        f"--iterations.") from None
    return optimizer, schedule


def extended_run_schedule(config: TrainConfig, extensions: list[dict]):
    """The LR schedule of a run continued past its planned total by `extensions` (as run.json
    records them, oldest first): the schedule planned for its first total and warm-up, continued
    by each in turn (the library's `continued_schedule`); ValueError where a rule cannot."""
    name, options = config.optim.scheduler, schedule_options(config)
    first = extensions[0]
    schedule = get_schedule(name, first["warmup_steps"], first["from_iterations"], **options)
    for extension in extensions:
        schedule = continued_schedule(
            schedule, name, extension["warmup_steps"], extension["from_iterations"],
            extension["iterations"], extension["from_step"], extension["schedule_rule"],
            rewarm_steps=extension.get("rewarm_steps"), **options)
    return schedule


def coupled_decay_planned(extension: dict) -> bool:
    """Whether the extension takes a planned run's coupled decay (AdamW's ω/(γ·T), which the
    identity checked). The run holds the value run.json records rather than scaling λ in the
    library (`extend_optimizer`'s ``planned_steps``): a checkpoint from before the group kept
    its planned total would be scaled twice."""
    return (extension["decay_rule"] == "planned" and extension.get("wd_ts") is None
            and bool(extension.get("weight_decay")))


def hold_weight_decay(optimizer, weight_decay: float) -> None:
    """Every decaying param group of `optimizer` to `weight_decay`, the value the extension
    recorded (set, not scaled: a checkpoint saved after the join holds it already)."""
    for group in optimizer.param_groups:
        if group.get("weight_decay"):
            group["weight_decay"] = weight_decay


def extend_run(optimizer, config: TrainConfig, extensions: list[dict]):
    """Continue the optimizer (its checkpoint loaded) by the newest of `extensions` and the LR
    schedule by all of them; returns the schedule. The optimizer's side changes nothing when
    its checkpoint was saved after that extension began (it holds the extended decay already;
    the checkpoints of an earlier extension hold its decay)."""
    extension = extensions[-1]
    try:
        if coupled_decay_planned(extension):
            hold_weight_decay(optimizer, extension["weight_decay"])
        else:
            extend_optimizer(optimizer, extension["iterations"],
                             from_step=extension["from_step"], decay_rule=extension["decay_rule"])
        return extended_run_schedule(config, extensions)
    except ValueError as error:
        raise UserError(f"--extend {extension['schedule_rule']} --extend_decay "
                        f"{extension['decay_rule']} cannot continue this run "
                        f"({str(error).rstrip('.')}); choose other rules.") from None
