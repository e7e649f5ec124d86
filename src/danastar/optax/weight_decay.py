"""The DANA family's independent, log-time weight decay as an optax transformation.

At step k the decay multiplies each parameter, after the learning-rate step, by

    1 - weight_decay * s_t / (1 + k / wd_ts)        (1 - weight_decay * s_t without wd_ts)

clamped to [0, 1] (danastar.hparams.decay_multiplier, the formula danastar.optim uses too),
where s_t is the schedule factor (current LR / peak LR): scaled by the schedule, **not** by the
learning rate, unlike AdamW's coupled ``p <- p - lr * weight_decay * p`` (optax's
``add_decayed_weights``). The paper's form is ``omega`` and the run's length T:
``wd_ts = T // 10`` and ``weight_decay = omega / wd_ts``, so the per-step decay is about
omega / t late in the run; a run too short for its decay (more than half of a weight gone in
its first 5 steps) is warned of (danastar.hparams.ShortRunWeightDecayWarning).

Placed after ``scale_by_learning_rate`` in a chain, it turns the step ``u`` into
``c u - (1 - c) p`` (c the multiplier above), so that ``optax.apply_updates`` gives
``c (p + u)``, what danastar.optim's optimizers compute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from danastar.hparams import (
    EARLY_STEPS,
    FIX_EXPLICIT_FORM,
    FIX_PAPER_FORM,
    MAX_EARLY_DECAY,
    PAPER_OMEGA,
    WD_TS_DIVISOR,
    check_non_negative,
    check_paper_form,
    check_positive_or_none,
    decay_multiplier,
    largest_constant_weight_decay,
    paper_weight_decay,
    warn_short_run,
)

from .transforms import check, is_python_number, wide

# The numbers and the multiplier of the decay are danastar.hparams', shared with danastar.optim.
__all__ = ["EARLY_STEPS", "MAX_EARLY_DECAY", "WD_TS_DIVISOR", "LogTimeWeightDecayState",
           "largest_constant_weight_decay", "log_time_weight_decay", "paper_weight_decay",
           "resolve_weight_decay"]


class LogTimeWeightDecayState(NamedTuple):
    """State of `log_time_weight_decay`: the number of updates done."""

    count: jax.Array


def resolve_weight_decay(weight_decay, wd_ts, omega, total_steps):
    """``(weight_decay, wd_ts)`` from the explicit form or the paper's (omega, total_steps),
    checked as danastar.optim checks them (values that are arrays, from
    ``optax.inject_hyperparams``, are taken as they are); warns
    (danastar.hparams.ShortRunWeightDecayWarning) when the run is too short for the decay."""
    if omega is not None or total_steps is not None:
        check(total_steps is not None,
              "omega needs total_steps as well (e.g. omega=4.0, total_steps=T, T the run's "
              "length in optimizer steps)")
        omega = PAPER_OMEGA if omega is None else omega  # total_steps alone: the paper's
        check(not (is_python_number(weight_decay) and weight_decay != 0) and wd_ts is None,
              "give the weight decay either as omega and total_steps or as weight_decay and "
              "wd_ts, not both")
        check_paper_form(omega, total_steps)
        if is_python_number(omega) and is_python_number(total_steps):
            weight_decay, wd_ts = paper_weight_decay(omega, int(total_steps))
            warn_short_run([{"weight_decay": weight_decay, "wd_ts": wd_ts}], FIX_PAPER_FORM)
            return weight_decay, wd_ts
        wd_ts = jnp.maximum(1, jnp.asarray(total_steps) // WD_TS_DIVISOR)
        return omega / wd_ts, wd_ts
    check_non_negative(weight_decay=weight_decay)
    check_positive_or_none(wd_ts=wd_ts)
    if is_python_number(weight_decay) and wd_ts is None \
            and weight_decay > largest_constant_weight_decay():
        raise ValueError(
            f"weight_decay={weight_decay:g} with wd_ts=None multiplies every weight by "
            f"1 - {weight_decay:g} * s_t at every step, not scaled by the learning rate as "
            f"AdamW's is, and would remove more than {MAX_EARLY_DECAY:.0%} of it in "
            f"{EARLY_STEPS} steps; use the paper's form (omega=4.0, total_steps=T), give "
            f"the decay a time scale (wd_ts=T // {WD_TS_DIVISOR}), or keep a constant "
            f"weight_decay at most {largest_constant_weight_decay():.1e}")
    warn_short_run([{"weight_decay": weight_decay, "wd_ts": wd_ts}], FIX_EXPLICIT_FORM)
    return weight_decay, wd_ts


def schedule_value(schedule, count) -> jax.Array:
    """s_t: ``schedule(count)`` for an optax schedule, the value itself for a number, 1 for
    None."""
    if schedule is None:
        return wide(1.0)
    return wide(schedule(count) if callable(schedule) else schedule)


def log_time_weight_decay(weight_decay: float = 0.0, wd_ts: float | None = None, *,
                          omega: float | None = None, total_steps: int | None = None,
                          schedule: optax.ScalarOrSchedule | None = None,
                          mask: optax.Params | Callable | None = None,
                          ) -> optax.GradientTransformation:
    """The independent weight decay p <- p (1 - weight_decay s_t / (1 + k / wd_ts)), to place
    after ``scale_by_learning_rate`` in a chain.

    Args:
      weight_decay: lambda_0 of the decay; not multiplied by the learning rate. A constant decay
        (no ``wd_ts``) above about 5.1e-4 is refused (AdamW's habitual 0.1 would remove nearly
        every weight within 100 steps).
      wd_ts: time scale of the decay of lambda_0 in steps (the paper uses T / 10); None:
        constant.
      omega: the paper's form instead of ``weight_decay`` and ``wd_ts``, with ``total_steps``:
        ``wd_ts = total_steps // 10``, ``weight_decay = omega / wd_ts`` (omega = 4 in the paper).
      total_steps: the run's length T in optimizer steps, for ``omega``.
      schedule: the schedule factor s_t (current LR / peak LR): an optax schedule of the
        0-based update count, a number, or None (1).
      mask: a tree of booleans like the parameters (or a function of the parameters returning
        one): True where the decay applies, as optax's ``add_decayed_weights`` takes it.

    Returns:
      A :class:`optax.GradientTransformation` whose state is a `LogTimeWeightDecayState`.
    """
    weight_decay, wd_ts = resolve_weight_decay(weight_decay, wd_ts, omega, total_steps)

    def init_fn(params):
        del params
        return LogTimeWeightDecayState(jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("log_time_weight_decay needs the parameters: call update(grads, "
                             "state, params)")
        step = wide(state.count + 1)
        multiplier = decay_multiplier(wide(weight_decay), schedule_value(schedule, state.count),
                                      step, None if wd_ts is None else wide(wd_ts))
        removed = 1 - multiplier

        def leaf(update, param):
            dtype = update.dtype
            return multiplier.astype(dtype) * update - removed.astype(dtype) * param

        updates = jax.tree.map(leaf, updates, params)
        return updates, LogTimeWeightDecayState(optax.safe_int32_increment(state.count))

    transformation = optax.GradientTransformation(init_fn, update_fn)
    return transformation if mask is None else optax.masked(transformation, mask)
