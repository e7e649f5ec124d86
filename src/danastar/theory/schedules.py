"""Generalised momentum SGD and its presets.

With a batch-mean gradient g_t of 1/2 (<x, theta> - y)^2 over B fresh samples, t = 0, 1, 2, ...

    y_{t+1}     = (1 - Delta(t)) y_t + g1(t) g_t
    theta_{t+1} = theta_t - g2(t) g_t - g3(t) y_{t+1}

A `Schedule` is the four functions g1, g2, g3, Delta of t (vectorised: they receive a NumPy
array of times and return an array of the same shape, or a scalar). The simulator and the ODE
take the same `Schedule`, so a new schedule is tried on both by writing four lambdas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .model import base_learning_rate

ScheduleFn = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Schedule:
    """One optimizer in the generalised momentum form.

    `risk_normalised` divides g2 and g3 by sqrt(2 R(t)) at every step (an Adam-like optimizer:
    its update has the size of the gradient divided by the gradient's root mean square, which on
    this model is proportional to sqrt of the risk).
    """

    name: str
    g1: ScheduleFn
    g2: ScheduleFn
    g3: ScheduleFn
    delta: ScheduleFn
    risk_normalised: bool = False

    def values(self, t) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(g1, g2, g3, Delta) at the times t, each broadcast to t's shape, as float64."""
        t = np.asarray(t, dtype=np.float64)
        return tuple(np.broadcast_to(np.asarray(fn(t), dtype=np.float64), t.shape).copy()
                     for fn in (self.g1, self.g2, self.g3, self.delta))


def _constant(value: float) -> ScheduleFn:
    return lambda t: np.full_like(np.asarray(t, dtype=np.float64), value)


def log_time_delta(delta: float = 8.0) -> ScheduleFn:
    """Delta(t) = delta / (delta + t): the EMA coefficient of memory growing with time."""
    return lambda t: delta / (delta + np.asarray(t, dtype=np.float64))


def sgd(alpha: float, d: int, v: int, batch: int, lr_fraction: float = 0.25) -> Schedule:
    """Plain SGD: g2 = 0.25 lr0, no momentum."""
    lr = lr_fraction * base_learning_rate(alpha, v, batch)
    return Schedule("SGD", _constant(0.0), _constant(lr), _constant(0.0), _constant(1.0))


def classical_momentum(alpha: float, d: int, v: int, batch: int, momentum: float = 0.9,
                       lr_fraction: float = 0.25) -> Schedule:
    """Heavy ball with constant momentum mu (torch's SGD(momentum=mu)): g1 = 1, Delta = 1 - mu,
    g2 = 0, g3 = (1 - mu) 0.25 lr0, so that its effective rate g3 / Delta equals SGD's step.

    Constant momentum only rescales the step size: it keeps SGD's exponent.
    """
    lr = lr_fraction * base_learning_rate(alpha, v, batch)
    return Schedule(f"SGD + momentum {momentum:g}", _constant(1.0), _constant(0.0),
                    _constant((1 - momentum) * lr), _constant(1 - momentum))


def dana_constant(alpha: float, d: int, v: int, batch: int, delta: float = 8.0,
                  lr_fraction: float = 0.25) -> Schedule:
    """DANA-constant: g1 = 1, Delta = delta / (delta + t), g2 = 0.25 lr0, g3 = 0.5 g2 / d."""
    lr = lr_fraction * base_learning_rate(alpha, v, batch)
    return Schedule("DANA-constant", _constant(1.0), _constant(lr), _constant(0.5 * lr / d),
                    log_time_delta(delta))


def dana_decaying(alpha: float, d: int, v: int, batch: int, delta: float = 8.0,
                  lr_fraction: float = 0.25) -> Schedule:
    """DANA-decaying: as DANA-constant with g3(t) = 0.5 g2 (1 + t)^(-1/(2 alpha))."""
    lr = lr_fraction * base_learning_rate(alpha, v, batch)
    power = -1.0 / (2 * alpha)
    return Schedule("DANA-decaying", _constant(1.0), _constant(lr),
                    lambda t: 0.5 * lr * (1 + np.asarray(t, dtype=np.float64)) ** power,
                    log_time_delta(delta))


def ademamix_beta3(t, beta_start: float, beta_end: float, warmup: float) -> np.ndarray:
    """beta3 warmed up linearly in half-life from beta_start to beta_end over `warmup` steps
    (the AdEMAMix schedule: h(beta) = ln 0.5 / ln beta - 1 is interpolated, then inverted)."""
    t = np.asarray(t, dtype=np.float64)
    half_life = lambda beta: np.log(0.5) / np.log(beta) - 1.0  # noqa: E731
    fraction = np.clip(t / warmup, 0.0, 1.0)
    h = (1 - fraction) * half_life(beta_start) + fraction * half_life(beta_end)
    return np.where(t < warmup, 0.5 ** (1.0 / (h + 1.0)), beta_end)


def ademamix(alpha: float, d: int, v: int, batch: int, delta: float = 8.0,
             lr_fraction: float = 0.25) -> Schedule:
    """AdEMAMix in the same form: T_m = d^alpha, g1 = 1 / (1 + t), Delta = 1 - beta3(t) with
    beta3 warmed up in half-life from 0.9 to 1 - delta / T_m over T_m steps, and
    g3 = g2 min(t / T_m, 1) 0.5 T_m^(1 - 1/(2 alpha)) (the mixing coefficient's warm-up)."""
    lr = lr_fraction * base_learning_rate(alpha, v, batch)
    horizon = float(d) ** alpha
    beta_end = 1.0 - delta / horizon if horizon > delta else 0.9
    mix = 0.5 * horizon ** (1.0 - 1.0 / (2 * alpha))
    return Schedule(
        "AdEMAMix",
        lambda t: 1.0 / (1.0 + np.asarray(t, dtype=np.float64)),
        _constant(lr),
        lambda t: lr * np.minimum(np.asarray(t, dtype=np.float64) / horizon, 1.0) * mix,
        lambda t: 1.0 - ademamix_beta3(t, 0.9, beta_end, horizon),
    )


def adam_like(alpha: float, d: int, v: int, batch: int, kappa: float, delta: float = 8.0,
              lr_scale: float | None = None) -> Schedule:
    """The risk-normalised (Adam-like) log-time momentum of the kappa study: y is an EMA
    (g1 = Delta = delta / (delta + t)), g2 = c, g3 = c (1 + t)^kappa, both divided by sqrt(2R).

    c = 0.5 lr0 * lr_scale with lr_scale = 0.1 / sqrt(d) by default. The momentum coefficient
    grows as t^kappa; in ADana's notation, whose coefficient is (1 + t)^(1 - kappa_ADana), this
    kappa is 1 - kappa_ADana.
    """
    scale = 0.1 / np.sqrt(d) if lr_scale is None else lr_scale
    lr = 0.5 * scale * base_learning_rate(alpha, v, batch)
    return Schedule(f"kappa={kappa:.2f}", log_time_delta(delta), _constant(lr),
                    lambda t: lr * (1 + np.asarray(t, dtype=np.float64)) ** kappa,
                    log_time_delta(delta), risk_normalised=True)


PRESETS: dict[str, Callable[..., Schedule]] = {
    "sgd": sgd,
    "momentum": classical_momentum,
    "dana-constant": dana_constant,
    "dana-decaying": dana_decaying,
    "ademamix": ademamix,
}


def preset(name: str, alpha: float, d: int, v: int, batch: int, **overrides) -> Schedule:
    """A preset by name (`PRESETS`), for the model's alpha, d, v and the batch size."""
    if name not in PRESETS:
        raise ValueError(f"unknown schedule {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name](alpha, d, v, batch, **overrides)
