"""The four DANA optimizers in one call each, as optax's ``alias.py`` builds ``adamw``:

    chain(scale_by_adana | scale_by_dana_star,      the direction u
          scale_by_learning_rate(lr * schedule),    p <- p - lr_t u
          log_time_weight_decay(...))               p <- p (1 - weight_decay s_t / (1 + k / wd_ts))

The learning rate is the peak ``learning_rate`` times the schedule factor s_t from ``schedule``
(an optax schedule of the 0-based update count), as danastar.optim reads s_t = lr / initial_lr
from a torch scheduler. With ``convention="release"`` the chain is the original release's:
its 0-based count, and the weight decay coupled to the learning rate (optax's
``add_decayed_weights`` before the learning-rate scaling).
"""

from __future__ import annotations

from collections.abc import Callable

import optax

from danastar.hparams import check_lr

from .transforms import (
    DEFAULT_CLIPSNR,
    DEFAULT_DELTA,
    DEFAULT_KAPPA,
    check,
    is_python_number,
    scale_by_adana,
    scale_by_dana_star,
    wide,
)
from .weight_decay import log_time_weight_decay


def learning_rate_schedule(learning_rate, schedule):
    """lr_t = learning_rate * s_t: ``learning_rate`` itself (a number or an optax schedule)
    without ``schedule``; else the peak times ``schedule(count)`` (or times a number, the value
    `optax.inject_hyperparams` passes for a schedule)."""
    if schedule is None:
        return learning_rate
    check(not callable(learning_rate),
          "give learning_rate as the peak (a number) when schedule gives the schedule factor")
    # in the widest float: a Python float times a float32 schedule value would round to float32
    if callable(schedule):
        return lambda count: wide(learning_rate) * wide(schedule(count))
    return wide(learning_rate) * wide(schedule)


def dana_chain(direction, learning_rate, schedule, weight_decay, wd_ts, omega, total_steps,
               mask, convention) -> optax.GradientTransformationExtraArgs:
    """The direction, the learning rate and the weight decay of one of the four aliases."""
    if not callable(learning_rate):  # a schedule's values are its own
        check_lr(learning_rate)
    lr = learning_rate_schedule(learning_rate, schedule)
    if convention == "release":
        check(wd_ts is None and omega is None and total_steps is None,
              "convention='release' has the release's coupled weight decay (weight_decay, "
              "multiplied by the learning rate) and no wd_ts, omega or total_steps")
        decay = optax.add_decayed_weights(weight_decay, mask)
        return optax.chain(direction, decay, optax.scale_by_learning_rate(lr))
    decays = not (is_python_number(weight_decay) and weight_decay == 0) or omega is not None
    check(not (decays and callable(learning_rate)),
          "learning_rate is a schedule, but the weight decay needs the schedule factor "
          "s_t = lr_t / peak: give the peak as learning_rate and the schedule's shape as "
          "schedule, e.g. learning_rate=3e-4, schedule=optax.warmup_cosine_decay_schedule("
          "0.01, 1.0, warmup_steps, total_steps)")
    decay = log_time_weight_decay(weight_decay, wd_ts, omega=omega, total_steps=total_steps,
                                  schedule=schedule, mask=mask)
    return optax.chain(direction, optax.scale_by_learning_rate(lr), decay)


# The Args: entries the four aliases share, written once (each docstring ends with them).
SHARED_ARGS = """
      learning_rate: the peak learning rate gamma* (or, without weight decay and ``schedule``,
        any optax schedule of the learning rate).
      schedule: the schedule factor s_t = lr_t / gamma*, an optax schedule of the 0-based update
        count (e.g. ``optax.warmup_cosine_decay_schedule(0.01, 1.0, W, T)``); it scales both the
        learning rate and the weight decay. None: constant 1.
      delta: delta > 0 of the EMA coefficient a_k = delta / (delta + k) of the moments: they
        average over a window that grows with the step, in log time (default 8).
      kappa: kappa in (0, 1] of the momentum factor (default 0.85); smaller kappa gives the
        momentum more weight as training goes on.
      weight_decay: lambda_0 of the independent decay p <- p (1 - lambda_0 s_t [/ (1 + k /
        wd_ts)]), not multiplied by the learning rate. A constant lambda_0 (no ``wd_ts``) above
        about 5.1e-4 is refused (AdamW's habitual 0.1 would remove almost every weight).
      wd_ts: time scale of the decay of lambda_0 in steps (the paper uses T / 10); None: constant.
      omega: the paper's form instead of ``weight_decay`` and ``wd_ts``, with ``total_steps``:
        ``wd_ts = total_steps // 10`` and ``weight_decay = omega / wd_ts`` (omega = 4 in the
        paper).
      total_steps: the run's length T in optimizer steps, for ``omega``.
      eps: added to sqrt(v) in the denominator D = sqrt(v) + eps.
      mask: a tree of booleans like the parameters, or a function of the parameters returning
        one: True where the weight decay applies (e.g. matrices only, not biases or norms).
      state_dtype: dtype of the optimizer state; None: each parameter's dtype, at least float32
        (bfloat16 parameters get float32 state).
      momentum_scale: weight of the momentum terms relative to the gradient term (the release's
        ``g3 / g2``); 1 in danastar.optim and the paper's language-model runs.
      convention: ``"danastar"`` (equal to danastar.optim step for step) or ``"release"`` (the
        original release's JAX functions: a 0-based step count and the weight decay coupled to
        the learning rate; see docs/optimizers.md).

    Returns:
      The corresponding :class:`optax.GradientTransformationExtraArgs`.
"""


def _with_shared_args(function: Callable) -> Callable:
    function.__doc__ = function.__doc__.rstrip() + "\n" + SHARED_ARGS.lstrip("\n")
    return function


@_with_shared_args
def adana(learning_rate: optax.ScalarOrSchedule = 1e-3,
          schedule: optax.ScalarOrSchedule | None = None, *, delta: float = DEFAULT_DELTA,
          kappa: float = DEFAULT_KAPPA, weight_decay: float = 0.0, wd_ts: float | None = None,
          omega: float | None = None, total_steps: int | None = None, eps: float = 1e-8,
          mask=None, state_dtype=None, momentum_scale: float = 1.0,
          convention: str = "danastar") -> optax.GradientTransformationExtraArgs:
    """ADana: log-time moments (no bias correction) with damped Nesterov momentum.

    p <- p - lr_t (g + m + (1 + k)^(1 - kappa) m) / (sqrt(v) + eps), then the weight decay.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> from danastar.optax import adana
      >>> optimizer = adana(3e-4, optax.warmup_cosine_decay_schedule(0.01, 1.0, 100, 1000),
      ...                   omega=4.0, total_steps=1000)
      >>> params = {"w": jnp.ones((2, 3))}
      >>> state = optimizer.init(params)

    Args:"""
    direction = scale_by_adana(delta, kappa, None, eps, state_dtype=state_dtype,
                               momentum_scale=momentum_scale, convention=convention)
    return dana_chain(direction, learning_rate, schedule, weight_decay, wd_ts, omega,
                      total_steps, mask, convention)


@_with_shared_args
def dana_mk4(learning_rate: optax.ScalarOrSchedule = 1e-3,
             schedule: optax.ScalarOrSchedule | None = None, *,
             clipsnr: float = DEFAULT_CLIPSNR, delta: float = DEFAULT_DELTA,
             kappa: float = DEFAULT_KAPPA, weight_decay: float = 0.0,
             wd_ts: float | None = None, omega: float | None = None,
             total_steps: int | None = None, eps: float = 1e-8, mask=None, state_dtype=None,
             momentum_scale: float = 1.0,
             convention: str = "danastar") -> optax.GradientTransformationExtraArgs:
    """Dana-MK4: ADana with the damping A = (1 + k)^(1 - kappa) |m| / D clipped at clipsnr.

    Args:
      clipsnr: the clip of the damping A (default 2)."""
    direction = scale_by_adana(delta, kappa, clipsnr, eps, state_dtype=state_dtype,
                               momentum_scale=momentum_scale, convention=convention)
    return dana_chain(direction, learning_rate, schedule, weight_decay, wd_ts, omega,
                      total_steps, mask, convention)


@_with_shared_args
def dana_star(learning_rate: optax.ScalarOrSchedule = 1e-3,
              schedule: optax.ScalarOrSchedule | None = None, *,
              delta: float = DEFAULT_DELTA, kappa: float = DEFAULT_KAPPA,
              weight_decay: float = 0.0, wd_ts: float | None = None,
              omega: float | None = None, total_steps: int | None = None, eps: float = 1e-8,
              mask=None, state_dtype=None, momentum_scale: float = 1.0,
              convention: str = "danastar") -> optax.GradientTransformationExtraArgs:
    """Dana-Star: ADana with a per-coordinate estimate tau of how often each coordinate
    receives gradient, so rarely updated coordinates (rare tokens, experts) get the right step.

    Args:"""
    direction = scale_by_dana_star(delta, kappa, None, eps, state_dtype=state_dtype,
                                   momentum_scale=momentum_scale, convention=convention)
    return dana_chain(direction, learning_rate, schedule, weight_decay, wd_ts, omega,
                      total_steps, mask, convention)


@_with_shared_args
def dana_star_mk4(learning_rate: optax.ScalarOrSchedule = 1e-3,
                  schedule: optax.ScalarOrSchedule | None = None, *,
                  clipsnr: float = DEFAULT_CLIPSNR, delta: float = DEFAULT_DELTA,
                  kappa: float = DEFAULT_KAPPA, weight_decay: float = 0.0,
                  wd_ts: float | None = None, omega: float | None = None,
                  total_steps: int | None = None, eps: float = 1e-8, mask=None,
                  state_dtype=None, momentum_scale: float = 1.0,
                  convention: str = "danastar") -> optax.GradientTransformationExtraArgs:
    """Dana-Star-MK4: Dana-Star with its damping A clipped at clipsnr.

    Args:
      clipsnr: the clip of the damping A (default 2)."""
    direction = scale_by_dana_star(delta, kappa, clipsnr, eps, state_dtype=state_dtype,
                                   momentum_scale=momentum_scale, convention=convention)
    return dana_chain(direction, learning_rate, schedule, weight_decay, wd_ts, omega,
                      total_steps, mask, convention)
