"""Continuing a run past its planned length T: the optimizer's side.

What of an optimizer depends on T is its log-time weight decay (``wd_ts = ⌊T/10⌋``,
``weight_decay = ω/wd_ts``); `extend_optimizer` sets it for the new total in each param group,
by one of the rules of `danastar.hparams.extended_weight_decay` ("keep", "reanchor",
"planned"), so that ``state_dict``/``load_state_dict`` carry the new values and a resumed run
continues as the uninterrupted one. The LR schedule's side is
`danastar.optim.schedules.extended_schedule`. docs/optimizers.md ("Extending a run past its
planned T") derives the rules.

A coupled weight decay (AdamW's ``ω/(γ*·T)``, AdEMAMix's without ``decaying_wd``) has no
time scale: "keep" keeps it (the only choice without a jump), and "planned", told the length it
was planned for (``planned_steps``, T1), takes the planned run's λ·T1/T2
(`danastar.hparams.extended_coupled_weight_decay`). Kept whatever the rule: AdEMAMix's
T-dependent β3 = 1 − δ/T, α = T^(1−κ) and their warm-ups of T steps, complete at T.
"""

from __future__ import annotations

import torch

from danastar.hparams import (
    DECAY_RULES,
    check,
    check_decay_rule,
    check_extension,
    extended_coupled_weight_decay,
    extended_weight_decay,
)

__all__ = ["DECAY_RULES", "extend_optimizer", "has_log_time_decay", "steps_taken"]

# The param-group key that holds the total a coupled decay is planned for once "planned" has
# set it: extending again to that total finds it there and changes nothing (a resumed run
# loads it with the group), and a later extension scales from it.
COUPLED_DECAY_TOTAL = "coupled_decay_total_steps"


def has_log_time_decay(group: dict) -> bool:
    """Whether a param group's decay is the log-time one, which depends on T: a time scale
    ``wd_ts``, a strength, and (AdEMAMix) ``decaying_wd``."""
    return (group.get("wd_ts") is not None and group.get("weight_decay", 0) != 0
            and group.get("decaying_wd", True))


def steps_taken(optimizer: torch.optim.Optimizer) -> int:
    """The optimizer's steps so far: the largest step count of its parameters (0 before the
    first step)."""
    counts = [state["step"] for state in optimizer.state.values() if "step" in state]
    return max((int(count) for count in counts), default=0)


def has_coupled_decay(group: dict) -> bool:
    """Whether a param group decays its weights by a constant λ (AdamW's coupled decay)."""
    return group.get("weight_decay", 0) != 0 and not has_log_time_decay(group)


def extend_optimizer(optimizer: torch.optim.Optimizer, new_total_steps: int, *,
                     from_step: int | None = None, decay_rule: str = "keep",
                     planned_steps: int | None = None) -> None:
    """Continue ``optimizer``'s run to ``new_total_steps`` (T2) from step ``from_step`` (the
    steps taken, by default read from its state): every group with the log-time weight decay
    gets the ``weight_decay`` and ``wd_ts`` of ``decay_rule`` ("keep" changes nothing;
    "reanchor" puts the decay on a T2 run's time scale without a jump; "planned" takes a T2
    run's decay, a jump down). Any torch optimizer whose groups hold ``weight_decay`` and
    ``wd_ts`` can be extended so. Extending again to the same T2 changes nothing.

    A coupled decay λ (no ``wd_ts``: AdamW's ω/(γ*·T)) is kept by "keep"; "planned" needs
    ``planned_steps``, the total T1 that λ was set from, and gives λ·T1/T2, the coupled decay
    of a run planned for T2 (a jump down). The group records T2 (``coupled_decay_total_steps``)
    so that extending it again to T2, as a resumed run does, changes nothing; a coupled decay
    cannot be re-anchored (no time scale).

    The decay is continuous at the join's step count k = from_step + 1; a tensor whose count
    lags (steps without a gradient) sees it continuous at its own count only approximately.
    A CUDA graph captured before (``capturable=True``) keeps the old values: capture it again.
    """
    check_decay_rule(decay_rule)
    if from_step is None:
        from_step = steps_taken(optimizer)
    check_extension(None, new_total_steps, from_step)
    groups = [group for group in optimizer.param_groups if has_log_time_decay(group)]
    coupled = [group for group in optimizer.param_groups if has_coupled_decay(group)]
    name = type(optimizer).__name__
    check(decay_rule != "reanchor" or groups or not coupled,
          f"{name} has no log-time weight decay (wd_ts) to re-anchor, so decay_rule 'reanchor' "
          "has nothing to change: use decay_rule 'keep' (its coupled decay kept, no jump) or "
          "'planned' with planned_steps (the coupled decay of a run planned for the new total)")
    if decay_rule == "planned" and coupled:
        unknown = planned_steps is None and any(
            COUPLED_DECAY_TOTAL not in group for group in coupled)
        check(not unknown,
              f"{name}'s coupled weight decay (no wd_ts) was set from a planned total that the "
              "optimizer does not know: pass planned_steps=T1, the steps it was planned for, "
              "or use decay_rule 'keep'")
        for group in coupled:
            total = group.get(COUPLED_DECAY_TOTAL, planned_steps)
            if total != new_total_steps:
                group["weight_decay"] = extended_coupled_weight_decay(
                    group["weight_decay"], total, new_total_steps, "planned")
                group[COUPLED_DECAY_TOTAL] = new_total_steps
    for group in groups:
        group["weight_decay"], group["wd_ts"] = extended_weight_decay(
            group["weight_decay"], group["wd_ts"], new_total_steps, from_step, decay_rule)
