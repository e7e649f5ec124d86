"""Continuing a run past its planned length T with danastar.optax: any optax schedule continued
by the rules of danastar.optim's `extended_schedule` (the same formulas, danastar.hparams'),
written with ``jnp.where`` so that they run under ``jit``.

    schedule = optax.warmup_cosine_decay_schedule(0.01, 1.0, W, T1, end_value=0.1)
    longer = stretch_schedule(schedule, T1, T2, from_step=T1 // 2, warmup_steps=W)
    weight_decay, wd_ts = extended_weight_decay(4.0 / (T1 // 10), T1 // 10, T2, T1 // 2)
    optimizer = adana(3e-4, longer, weight_decay=weight_decay, wd_ts=wd_ts)   # same state

The optimizer built again with the continued schedule and decay has the state of the first
(the same chain), so the run goes on from it. A step is the 0-based update count, as optax
schedules take it; the decay is continuous at the join's update count ``from_step``.
"""

from __future__ import annotations

import jax.numpy as jnp

from danastar.hparams import (
    check_extension,
    check_from_step,
    extended_weight_decay,
    reanchored_schedule,
    rewarmed_schedule,
    stretched_schedule,
)

__all__ = ["extended_weight_decay", "reanchor_schedule", "rewarm_schedule", "stretch_schedule"]


def stretch_schedule(schedule, total_steps: int, new_total_steps: int, from_step: int, *,
                     warmup_steps: int = 0):
    """``schedule`` (planned for ``total_steps``) up to max(``from_step``, ``warmup_steps``),
    then what was left of it stretched over the steps up to ``new_total_steps``: it ends at its
    own end value, at the new total."""
    check_extension(total_steps, new_total_steps, from_step)
    anchor = max(from_step, warmup_steps)
    return stretched_schedule(schedule, anchor, total_steps, new_total_steps, where=jnp.where)


def reanchor_schedule(schedule, planned, new_total_steps: int, from_step: int, *,
                      warmup_steps: int = 0):
    """``schedule`` up to max(``from_step``, ``warmup_steps``), then ``planned`` (the same
    schedule planned for ``new_total_steps``) scaled to start at the factor reached there and
    to end at its own end value."""
    check_extension(None, new_total_steps, from_step)
    anchor = max(from_step, warmup_steps)
    return reanchored_schedule(schedule, planned, anchor, new_total_steps, where=jnp.where)


def rewarm_schedule(schedule, restarted, from_step: int, rewarm_steps: int, *,
                    peak: float = 1.0):
    """``schedule`` before ``from_step``, then linearly from the factor reached there up to
    ``peak`` over ``rewarm_steps``, then ``peak`` times ``restarted`` at the steps counted from
    ``from_step``: the schedule planned for the steps left, with a warm-up of ``rewarm_steps``
    (e.g. ``optax.warmup_cosine_decay_schedule(0.0, 1.0, rewarm_steps, T2 - from_step,
    end_value=0.1)``)."""
    check_from_step(from_step)
    return rewarmed_schedule(schedule, restarted, from_step, rewarm_steps, peak,
                             where=jnp.where)
