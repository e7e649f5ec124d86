"""The planned optimizer over a model's parameter groups, and its LR schedule."""

from __future__ import annotations

import warnings

from danastar.config import TrainConfig, schedule_options
from danastar.errors import UserError
from danastar.hparams import ShortRunWeightDecayWarning
from danastar.optim import build_optimizer, extend_optimizer, extended_schedule, get_schedule
from danastar.optim.schedules import (
    DECAY_END_BEFORE_TOTAL,
    TOTAL_FREE,
    check_extension,
    reanchored_schedule,
    rewarmed_schedule,
    stretched_schedule,
)


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
    records them, oldest first): the schedule planned for its first total and warm-up, extended
    by the library's `extended_schedule` from the step the first began, then each later one
    continued by the same rules (`continued_schedule`); ValueError where a rule cannot."""
    first, options = extensions[0], schedule_options(config)
    schedule = extended_schedule(config.optim.scheduler, first["warmup_steps"],
                                 first["from_iterations"], first["iterations"],
                                 from_step=first["from_step"], rule=first["schedule_rule"],
                                 rewarm_steps=first.get("rewarm_steps"), **options)
    for extension in extensions[1:]:
        schedule = continued_schedule(schedule, config.optim.scheduler, extension, options)
    return schedule


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def continued_schedule(schedule, name: str, extension: dict, options: dict):
    """`schedule` (already extended to `from_iterations`) continued to `iterations` from
    `from_step` by the rule of `extension`, as `extended_schedule` continues a planned one: its
    remaining decay stretched, the rest of the schedule planned for the new total re-anchored at
    the current factor, or re-warmed; a `cos`, `linear` or `wsd` decay that is over is refused
    for stretch and reanchor (use rewarm)."""
    step, total, new_total = (extension[key] for key in ("from_step", "from_iterations",
                                                         "iterations"))
    check_extension(total, new_total, step)
    rule, warmup = extension["schedule_rule"], extension["warmup_steps"]
    if name in TOTAL_FREE:
        require(rule != "rewarm", f"{name} does not depend on the total steps, so it goes on as it "
              "is past them; there is no decay to restart (use rule 'stretch' or 'reanchor')")
        return schedule
    if rule == "rewarm":
        rewarm = extension["rewarm_steps"]
        require(1 <= rewarm <= new_total - step, f"rewarm_steps must be in 1 .. "
              f"{new_total - step} (the steps left), got {rewarm}")
        return rewarmed_schedule(schedule, get_schedule(name, rewarm, new_total - step,
                                                        **options), step, rewarm)
    anchor = max(step, warmup)
    require(name not in DECAY_END_BEFORE_TOTAL or schedule(anchor) != schedule(total),
          f"{name} has finished its decay by step {anchor} (factor {schedule(anchor):.3g}), so "
          f"there is nothing left to {rule}; use rule 'rewarm' (back up to the peak over "
          "rewarm_steps, then the schedule again up to the new total)")
    if rule == "stretch":
        return stretched_schedule(schedule, anchor, total, new_total)
    return reanchored_schedule(schedule, get_schedule(name, warmup, new_total, **options),
                               anchor, new_total)


def extend_run(optimizer, config: TrainConfig, extensions: list[dict]):
    """Continue the optimizer (its checkpoint loaded) by the newest of `extensions` and the LR
    schedule by all of them; returns the schedule. The optimizer's side changes nothing when
    its checkpoint was saved after that extension began (it holds the extended decay already;
    the checkpoints of an earlier extension hold its decay)."""
    extension = extensions[-1]
    try:
        extend_optimizer(optimizer, extension["iterations"], from_step=extension["from_step"],
                         decay_rule=extension["decay_rule"])
        return extended_run_schedule(config, extensions)
    except ValueError as error:
        raise UserError(f"--extend {extension['schedule_rule']} --extend_decay "
                        f"{extension['decay_rule']} cannot continue this run "
                        f"({str(error).rstrip('.')}); choose other rules.") from None
