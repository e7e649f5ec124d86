"""Learning-rate schedules as pure functions of the step, and a helper that applies one.

``get_schedule(name, warmup_steps, total_steps, **options)`` returns ``factor(step)``, the
multiplier s(n) on the peak LR; ``apply_schedule(optimizer, factor)`` writes
``group["lr"] = group["initial_lr"] * factor`` for every group. No hidden state: resuming at
step n only needs n.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

Schedule = Callable[[int], float]


def _warmup(step: int, warmup_steps: int, start: float) -> float:
    """Linear warm-up from ``start`` (at step 0) to 1 (at ``warmup_steps``)."""
    return start + (1 - start) * step / warmup_steps


def _progress(step: int, warmup_steps: int, total_steps: int) -> float:
    """Fraction of the post-warm-up phase done, in [0, 1]."""
    return min(max((step - warmup_steps) / max(total_steps - warmup_steps, 1), 0.0), 1.0)


def _cosine(progress: float) -> float:
    return 0.5 * (1 + math.cos(math.pi * progress))


def cos_inf(warmup_steps, total_steps, *, start=0.01, floor=0.1) -> Schedule:
    """Linear warm-up from ``start``, then cosine from 1 down to ``floor`` at ``total_steps``;
    it stays at the floor beyond (the default schedule)."""
    def factor(step):
        if step < warmup_steps:
            return _warmup(step, warmup_steps, start)
        return floor + (1 - floor) * _cosine(_progress(step, warmup_steps, total_steps))
    return factor


def cos(warmup_steps, total_steps, *, start=0.01, final=0.1) -> Schedule:
    """Linear warm-up from ``start``, then cosine decay to ``final`` at ``total_steps``."""
    return cos_inf(warmup_steps, total_steps, start=start, floor=final)


def linear(warmup_steps, total_steps, *, start=0.01, final=0.1) -> Schedule:
    """Linear warm-up from ``start``, then linear decay to ``final`` at ``total_steps``."""
    def factor(step):
        if step < warmup_steps:
            return _warmup(step, warmup_steps, start)
        return 1 - (1 - final) * _progress(step, warmup_steps, total_steps)
    return factor


# Shapes of the WSD decay: the factor as a function of the decay phase's progress q in [0, 1].
WSD_SHAPES: dict[str, Callable[[float], float]] = {
    "linear": lambda q: 1 - q,
    "cosine": _cosine,
    "sqrt": lambda q: 1 - math.sqrt(q),
    "square": lambda q: 1 - q * q,
    # exp(-5 q), shifted and rescaled so that it ends exactly at 0.
    "exp": lambda q: (math.exp(-5 * q) - math.exp(-5)) / (1 - math.exp(-5)),
}


def wsd(warmup_steps, total_steps, *, decay_fraction=0.1, shape="linear", start=0.01) -> Schedule:
    """Warm-up, hold at 1, then decay to 0 over the last ``decay_fraction`` of the steps."""
    if shape not in WSD_SHAPES:
        raise ValueError(f"unknown wsd shape {shape!r}; valid shapes: {', '.join(WSD_SHAPES)}")
    if not 0 <= decay_fraction <= 1:
        raise ValueError(f"decay_fraction must be in [0, 1], got {decay_fraction}")
    decay_steps = decay_fraction * total_steps
    decay_start = total_steps - decay_steps
    decay = WSD_SHAPES[shape]

    def factor(step):
        if step < warmup_steps:
            return _warmup(step, warmup_steps, start)
        if step < decay_start or decay_steps == 0:
            return 1.0
        return decay(min((step - decay_start) / decay_steps, 1.0))
    return factor


def powerlaw(warmup_steps, total_steps, *, rho=-0.5, tau=None) -> Schedule:
    """Linear warm-up from 0, then (1 + (n - W) / tau)^rho; tau defaults to max(W, 1)."""
    tau = tau if tau is not None else max(warmup_steps, 1)
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")

    def factor(step):
        if step < warmup_steps:
            return _warmup(step, warmup_steps, 0.0)
        return (1 + (step - warmup_steps) / tau) ** rho
    return factor


def none(warmup_steps, total_steps) -> Schedule:
    """Constant 1 (no warm-up either)."""
    return lambda step: 1.0


SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "cos_inf": cos_inf, "cos": cos, "linear": linear, "wsd": wsd, "powerlaw": powerlaw,
    "none": none,
}


def get_schedule(name: str, warmup_steps: int, total_steps: int, **options) -> Schedule:
    """The schedule ``name`` as a pure function ``step -> factor``."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; valid schedules: {', '.join(SCHEDULES)}")
    if warmup_steps < 0 or total_steps < 0:
        raise ValueError(f"warmup_steps and total_steps must be >= 0, got {warmup_steps}, "
                         f"{total_steps}")
    try:
        return SCHEDULES[name](warmup_steps, total_steps, **options)
    except TypeError as error:
        raise ValueError(f"bad option for schedule {name!r}: {error}") from None


def apply_schedule(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Set every group's LR to its peak LR (``initial_lr``) times ``factor``."""
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] * factor
