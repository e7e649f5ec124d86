"""Learning-rate schedules as pure functions of the step, and a helper that applies one.

``get_schedule(name, warmup_steps, total_steps, **options)`` returns ``factor(step)``, the
multiplier s(n) on the peak LR at optimizer step n (0-based: a run of T iterations uses steps
0 .. T-1); ``apply_schedule(optimizer, factor)`` writes ``group["lr"] = group["initial_lr"] *
factor`` for every group. No hidden state: resuming at step n only needs n.

The schedules, their option names and their defaults are those of the original ADana release
(its ``--scheduler`` flag and the options next to it), so that its curves carry over unchanged:

* ``cos`` / ``linear``: ``torch.optim.lr_scheduler.OneCycleLR`` as the release builds it
  (``pct_start = warmup / total``, no momentum cycling), options ``div_factor`` (100) and
  ``final_div_factor`` (1): from 1/100 of the peak up to the peak at step W-1, then down to
  1/(div_factor * final_div_factor) of it at step T-1.
* ``cos_inf``: ``div_factor`` (100), ``final_div_factor`` (0.1, the value the release's
  launcher passes), ``cos_inf_steps`` (0): cosine to 1/(div_factor * final_div_factor) at step
  T - cos_inf_steps, constant after.
* ``wsd``: ``wsd_fract_decay`` (0.1), ``wsd_final_lr_scale`` (0), ``decay_type`` (linear).
* ``powerlaw``: ``powerlaw_init_value`` (1), ``powerlaw_saturation_value`` (0),
  ``powerlaw_power`` (-0.5), ``powerlaw_time_scale`` (1).

Earlier option names are still accepted as aliases: ``start`` (1/div_factor), ``final`` /
``floor`` (the final factor itself), ``decay_fraction``, ``shape``, ``rho`` and ``tau``.

``extended_schedule(name, warmup_steps, total_steps, new_total_steps, from_step, rule)``
continues a schedule planned for ``total_steps`` past it, from the step a run has reached, by
one of the rules of docs/optimizers.md ("Extending a run past its planned T"): equal to the old
schedule before that step, and without a jump at it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from danastar.hparams import (
    LR_RULES,
    check_extension,
    reanchored_schedule,
    rewarmed_schedule,
    stretched_schedule,
)

Schedule = Callable[[int], float]


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _warmup_from(step: int, warmup_steps: int, div_factor: float) -> float:
    """The release's linear warm-up from 1/div_factor (step 0) to 1 (step ``warmup_steps``)."""
    return step / warmup_steps + (1 - step / warmup_steps) / div_factor


def _div_factor(div_factor: float, start: float | None) -> float:
    """``start`` (the factor at step 0, an earlier option name) as a div_factor."""
    if start is not None:
        _check(start > 0, f"start must be > 0, got {start}")
        div_factor = 1 / start
    _check(div_factor > 0, f"div_factor must be > 0, got {div_factor}")
    return div_factor


# -- cos / linear: OneCycleLR ------------------------------------------------------------------

def _anneal_cos(start: float, end: float, pct: float) -> float:
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


def _anneal_linear(start: float, end: float, pct: float) -> float:
    return (end - start) * pct + start


def one_cycle(warmup_steps, total_steps, *, anneal="cos", div_factor=1e2, final_div_factor=1.0,
              start=None, final=None) -> Schedule:
    """``OneCycleLR(max_lr=1, total_steps=T, pct_start=W / T, anneal_strategy=anneal,
    div_factor, final_div_factor, cycle_momentum=False)`` as a function of the step.

    Its two phases end at the float ``pct_start * T - 1`` and at T - 1, as torch computes them,
    so the warm-up peaks at step W - 1 (with W = 0 the decay starts from step -1, so step 0 is
    already a little below the peak). Two cases where torch has no value: beyond T - 1 the
    factor stays at the final one (torch raises past step T), and with W = 1 the one warm-up
    step is the peak (torch divides by zero).
    """
    _check(anneal in ("cos", "linear"), f"anneal must be 'cos' or 'linear', got {anneal!r}")
    _check(total_steps >= 1, f"total_steps must be >= 1 for {anneal}, got {total_steps}")
    _check(warmup_steps <= total_steps,
           f"warmup_steps ({warmup_steps}) must be <= total_steps ({total_steps})")
    div_factor = _div_factor(div_factor, start)
    initial = 1.0 / div_factor
    if final is not None:
        _check(final >= 0, f"final must be >= 0, got {final}")
        minimum = final
    else:
        _check(final_div_factor > 0, f"final_div_factor must be > 0, got {final_div_factor}")
        minimum = initial / final_div_factor
    anneal_func = _anneal_cos if anneal == "cos" else _anneal_linear
    pct_start = warmup_steps / total_steps
    warmup_end = float(pct_start * total_steps) - 1
    last = total_steps - 1

    def factor(step):
        if step >= last:
            return anneal_func(1.0, minimum, 1.0) if warmup_end < last else 1.0
        if step <= warmup_end:
            if warmup_end == 0:
                return 1.0
            return anneal_func(initial, 1.0, step / warmup_end)
        return anneal_func(1.0, minimum, (step - warmup_end) / (last - warmup_end))
    return factor


def cos(warmup_steps, total_steps, **options) -> Schedule:
    """OneCycleLR with cosine annealing (see `one_cycle`)."""
    return one_cycle(warmup_steps, total_steps, anneal="cos", **options)


def linear(warmup_steps, total_steps, **options) -> Schedule:
    """OneCycleLR with linear annealing (see `one_cycle`)."""
    return one_cycle(warmup_steps, total_steps, anneal="linear", **options)


# -- cos_inf -----------------------------------------------------------------------------------

def cos_inf(warmup_steps, total_steps, *, div_factor=1e2, final_div_factor=0.1, cos_inf_steps=0,
            start=None, floor=None) -> Schedule:
    """Linear warm-up from 1/div_factor, then cosine from 1 down to the final factor
    1/(div_factor * final_div_factor) (0.1 by default) at step T - cos_inf_steps; it stays
    there beyond (the default schedule)."""
    div_factor = _div_factor(div_factor, start)
    _check(final_div_factor > 0, f"final_div_factor must be > 0, got {final_div_factor}")
    _check(cos_inf_steps >= 0, f"cos_inf_steps must be >= 0, got {cos_inf_steps}")
    final_lr = 1.0 / div_factor / final_div_factor if floor is None else floor
    _check(final_lr >= 0, f"floor must be >= 0, got {final_lr}")
    anneal_end = total_steps - cos_inf_steps

    def factor(step):
        if step < warmup_steps:
            return _warmup_from(step, warmup_steps, div_factor)
        if step < anneal_end:
            t = (step - warmup_steps) / (anneal_end - warmup_steps)
            return final_lr + 0.5 * (1.0 - final_lr) * (1 + math.cos(math.pi * t))
        return final_lr
    return factor


# -- wsd ---------------------------------------------------------------------------------------

# The decay of WSD as the release writes it: the factor at progress q in [0, 1) of the decay
# phase, for the final factor f. Its `exp` is f ** q (so with f = 0 it drops to 0 after the
# first decay step), and `miror_cosine` (the release's spelling) mirrors cosine about linear.
DECAY_TYPES: dict[str, Callable[[float, float], float]] = {
    "linear": lambda q, f: f + (1 - f) * (1 - q),
    "cosine": lambda q, f: f + (1 - f) * (1 + math.cos(math.pi * q)) * 0.5,
    "exp": lambda q, f: f ** q,
    "miror_cosine": lambda q, f: 2 * (f + (1 - f) * (1 - q))
    - (f + (1 - f) * (1 + math.cos(math.pi * q)) * 0.5),
    "square": lambda q, f: f + (1 - f) * (1 - q ** 2),
    "sqrt": lambda q, f: f + (1 - f) * (1 - math.sqrt(q)),
}


def wsd(warmup_steps, total_steps, *, wsd_fract_decay=0.1, wsd_final_lr_scale=0.0,
        decay_type="linear", decay_fraction=None, shape=None) -> Schedule:
    """Warm-up from 1/100, hold at 1, then decay to ``wsd_final_lr_scale`` over the last
    ``int(wsd_fract_decay * T)`` steps (rounded down, as the release does)."""
    fraction = wsd_fract_decay if decay_fraction is None else decay_fraction
    decay_type = decay_type if shape is None else shape
    _check(decay_type in DECAY_TYPES,
           f"unknown wsd decay_type {decay_type!r}; valid decay types: {', '.join(DECAY_TYPES)}")
    _check(0 <= fraction <= 1, f"wsd_fract_decay must be in [0, 1], got {fraction}")
    final = wsd_final_lr_scale
    _check(final >= 0, f"wsd_final_lr_scale must be >= 0, got {final}")
    decay_steps = int(fraction * total_steps)
    hold_end = total_steps - decay_steps
    decay = DECAY_TYPES[decay_type]

    def factor(step):
        if step < warmup_steps:
            return _warmup_from(step, warmup_steps, 1e2)
        if step < hold_end:
            return 1.0
        if step < total_steps:
            return decay((step - hold_end) / decay_steps, final)
        return final
    return factor


# -- powerlaw ----------------------------------------------------------------------------------

def powerlaw(warmup_steps, total_steps, *, powerlaw_init_value=1.0, powerlaw_saturation_value=0.0,
             powerlaw_power=-0.5, powerlaw_time_scale=1.0, rho=None, tau=None) -> Schedule:
    """Linear warm-up from 0 to ``init``, then ``init * (1 + (n - W) / time_scale) ** power``,
    bounded by the saturation value: a floor when power < 0, a ceiling otherwise (so a growing
    power law needs a saturation value above 0)."""
    init, saturation = powerlaw_init_value, powerlaw_saturation_value
    power = powerlaw_power if rho is None else rho
    time_scale = powerlaw_time_scale if tau is None else tau
    _check(time_scale > 0, f"powerlaw_time_scale must be > 0, got {time_scale}")

    def factor(step):
        if step < warmup_steps:
            return step / warmup_steps * init
        value = init * (1.0 + (step - warmup_steps) / time_scale) ** power
        return max(value, saturation) if power < 0 else min(value, saturation)
    return factor


def none(warmup_steps, total_steps) -> Schedule:
    """Constant 1 (no warm-up either)."""
    return lambda step: 1.0


SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "cos_inf": cos_inf, "cos": cos, "linear": linear, "wsd": wsd, "powerlaw": powerlaw,
    "none": none,
}

# The options (release names) each schedule takes, with their defaults; the training config
# has one field for each, and its dry run shows the values a run uses.
_ONE_CYCLE_OPTIONS = {"div_factor": 1e2, "final_div_factor": 1.0}
SCHEDULE_OPTIONS: dict[str, dict[str, object]] = {
    "cos_inf": {"div_factor": 1e2, "final_div_factor": 0.1, "cos_inf_steps": 0},
    "cos": _ONE_CYCLE_OPTIONS,
    "linear": _ONE_CYCLE_OPTIONS,
    "wsd": {"wsd_fract_decay": 0.1, "wsd_final_lr_scale": 0.0, "decay_type": "linear"},
    "powerlaw": {"powerlaw_init_value": 1.0, "powerlaw_saturation_value": 0.0,
                 "powerlaw_power": -0.5, "powerlaw_time_scale": 1.0},
    "none": {},
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


# -- continuing past the planned total -----------------------------------------------------------

# Schedules whose factor does not depend on the total: past T they go on as they are, whatever
# the rule.
TOTAL_FREE = ("none", "powerlaw")
# Where the decay of a schedule that ends low is over, as steps before its total: OneCycleLR's
# final factor is at T - 1, wsd's at T. cos_inf is not here: it holds its floor past T by design,
# so a finished cos_inf run goes on at its floor.
DECAYS_TO_AN_END = ("cos", "linear", "wsd")


def extended_schedule(name: str, warmup_steps: int, total_steps: int, new_total_steps: int,
                      from_step: int, rule: str = "stretch", *, rewarm_steps: int | None = None,
                      peak: float = 1.0, **options) -> Schedule:
    """The schedule ``name`` planned for ``total_steps`` (T1) steps, continued to
    ``new_total_steps`` (T2) from step ``from_step`` (s, the steps the run has taken: T1 for a
    finished run) by ``rule``:

    * ``"stretch"``: what was left of the decay after max(s, warmup_steps), stretched over the
      steps up to T2, ending at the same factor;
    * ``"reanchor"``: the remaining part of the schedule planned for T2, scaled so that it starts
      at the current factor and ends at the schedule's end factor;
    * ``"rewarm"``: linearly from the current factor up to ``peak`` (1: the run's peak LR) over
      ``rewarm_steps`` steps (default: ``warmup_steps``), then the schedule again, planned for
      the T2 − s steps left with that warm-up, times ``peak``.

    Equal to ``get_schedule(name, warmup_steps, total_steps, **options)`` before step s and at
    it. ``none`` and ``powerlaw`` do not depend on the total: they go on unchanged (``rewarm``
    is refused). A ``cos``, ``linear`` or ``wsd`` run whose decay is over has nothing left to
    stretch or re-anchor: refused, naming ``rewarm``; a finished ``cos_inf`` run stays at its
    floor (as the schedule does past T) unless re-warmed.
    """
    _check(warmup_steps <= total_steps,
           f"warmup_steps ({warmup_steps}) must be <= total_steps ({total_steps})")
    return continued_schedule(get_schedule(name, warmup_steps, total_steps, **options), name,
                              warmup_steps, total_steps, new_total_steps, from_step, rule,
                              rewarm_steps=rewarm_steps, peak=peak, **options)


def continued_schedule(old: Schedule, name: str, warmup_steps: int, total_steps: int,
                       new_total_steps: int, from_step: int, rule: str = "stretch", *,
                       rewarm_steps: int | None = None, peak: float = 1.0,
                       **options) -> Schedule:
    """``old``, the schedule ``name`` as a run has followed it for ``total_steps`` steps (the one
    planned for them, or one continued already), continued by ``rule`` as `extended_schedule`
    says: a run extended twice is its planned schedule continued twice."""
    _check(rule in LR_RULES, f"rule must be one of {', '.join(LR_RULES)}, got {rule!r}")
    check_extension(total_steps, new_total_steps, from_step)
    if name in TOTAL_FREE:
        _check(rule != "rewarm", f"{name} does not depend on the total steps, so it goes on as it "
              "is past them; there is no decay to restart (use rule 'stretch' or 'reanchor')")
        return old
    if rule == "rewarm":
        return _rewarmed(name, old, new_total_steps, from_step,
                         warmup_steps if rewarm_steps is None else rewarm_steps, peak, options)
    anchor = max(from_step, warmup_steps)  # the warm-up is kept as planned
    _check_decay_left(name, old, total_steps, anchor, rule)
    if rule == "stretch":
        return stretched_schedule(old, anchor, total_steps, new_total_steps)
    planned = get_schedule(name, warmup_steps, new_total_steps, **options)
    return reanchored_schedule(old, planned, anchor, new_total_steps)


def _check_decay_left(name: str, old: Schedule, total_steps: int, anchor: int,
                      rule: str) -> None:
    """Refuse to stretch or re-anchor a decay that is over: at its end factor already."""
    if name in DECAYS_TO_AN_END:
        _check(old(anchor) != old(total_steps),
               f"{name} has finished its decay by step {anchor} (factor {old(anchor):.3g}), so "
               f"there is nothing left to {rule}; use rule 'rewarm' (back up to the peak over "
               "rewarm_steps, then the schedule again up to the new total)")


def _rewarmed(name: str, old: Schedule, new_total_steps: int, from_step: int,
              rewarm_steps: int, peak: float, options: dict) -> Schedule:
    steps_left = new_total_steps - from_step
    _check(1 <= rewarm_steps <= steps_left,
           f"rewarm_steps must be in 1 .. {steps_left} (the steps left), got {rewarm_steps}"
           + (" (the run's warm-up, the default)" if rewarm_steps == 0 else ""))
    restarted = get_schedule(name, rewarm_steps, steps_left, **options)
    return rewarmed_schedule(old, restarted, from_step, rewarm_steps, peak)


def apply_schedule(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Set every group's LR to its peak LR (``initial_lr``) times ``factor``."""
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] * factor
