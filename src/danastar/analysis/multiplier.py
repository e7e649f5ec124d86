"""Compute multiplier of an optimizer against a baseline (AdamW), and compute saved by crossing.

* measured: the baseline compute C* that reaches each of the optimizer's losses, by
  piecewise-linear interpolation of log C_b against log L_b; outside the baseline's range, the
  log-log line through its two lowest-loss points (below) or two highest-loss points (above),
  marked as extrapolated. Multiplier = C*/C.
* fitted: with both curves from one joint fit (``fits``), solve L_base(C') = L_opt(C) for C'
  by Brent's method on ln C'; multiplier = C'/C.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy.optimize import brentq

INTERPOLATED = "interpolated"
EXTRAPOLATED_LOW = "extrapolated below"  # loss below the baseline's lowest
EXTRAPOLATED_HIGH = "extrapolated above"  # loss above the baseline's highest


@dataclasses.dataclass(frozen=True)
class MeasuredPoint:
    compute: float
    loss: float
    baseline_compute: float  # C*: the baseline's compute at this loss
    multiplier: float  # C*/C
    kind: str  # INTERPOLATED, EXTRAPOLATED_LOW or EXTRAPOLATED_HIGH


def _line(x0: float, y0: float, x1: float, y1: float, x: float) -> float:
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def baseline_compute_at(baseline: Sequence[tuple[float, float]], loss: float) -> tuple[float, str]:
    """C* at ``loss`` from the baseline's (compute, loss) points, and how it was obtained."""
    points = sorted(baseline)
    if len(points) < 2:
        raise ValueError("the baseline needs at least two sizes to interpolate")
    log_c = np.log([c for c, _ in points])
    log_l = np.log([v for _, v in points])
    x = math.log(loss)
    if x < log_l.min():
        # the two largest-compute points: the baseline's lowest losses on a decreasing curve
        return math.exp(_line(log_l[-2], log_c[-2], log_l[-1], log_c[-1], x)), EXTRAPOLATED_LOW
    if x > log_l.max():
        return math.exp(_line(log_l[0], log_c[0], log_l[1], log_c[1], x)), EXTRAPOLATED_HIGH
    order = np.argsort(log_l)
    return math.exp(float(np.interp(x, log_l[order], log_c[order]))), INTERPOLATED


def measured_multipliers(baseline: Sequence[tuple[float, float]],
                         points: Sequence[tuple[float, float]]) -> list[MeasuredPoint]:
    """The measured multiplier at each (compute, loss) of the other optimizer."""
    result = []
    for compute, loss in points:
        c_star, kind = baseline_compute_at(baseline, loss)
        result.append(MeasuredPoint(compute, loss, c_star, c_star / compute, kind))
    return result


def fitted_multipliers(base_curve: Callable[[float], float], opt_curve: Callable[[float], float],
                       c_min: float, c_max: float, *, floor: float,
                       n: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """(C, C'/C) on ``n`` log-spaced C from 0.5·c_min to 2·c_max, where L_base(C') = L_opt(C).

    Points where L_opt(C) ≤ floor (no baseline compute reaches it) or no bracket is found are
    left out."""
    grid = np.geomspace(0.5 * c_min, 2.0 * c_max, n)
    computes, multipliers = [], []
    for c in grid:
        target = float(opt_curve(c))
        if target <= floor:
            continue

        def gap(log_c: float, target: float = target) -> float:
            return float(base_curve(math.exp(log_c))) - target

        lo, hi = math.log(c) - 5.0, math.log(c) + 5.0
        for _ in range(20):  # widen until L_base(lo) > target > L_base(hi)
            if gap(lo) > 0 and gap(hi) < 0:
                break
            lo, hi = lo - 5.0, hi + 5.0
        else:
            continue
        c_prime = math.exp(brentq(gap, lo, hi, xtol=1e-12, rtol=1e-12))
        computes.append(c)
        multipliers.append(c_prime / c)
    return np.asarray(computes), np.asarray(multipliers)


@dataclasses.dataclass(frozen=True)
class Crossing:
    target_loss: float  # the baseline's best final loss at this size
    final_compute: float  # the crossing run's total compute
    cross_compute: float  # the first compute at which it reached target_loss
    saved: float  # final_compute − cross_compute

    @property
    def fraction_saved(self) -> float:
        return self.saved / self.final_compute


def first_crossing(compute: Sequence[float], loss: Sequence[float], target: float) -> float | None:
    """The first compute at which ``loss`` reaches ``target``, interpolating log loss linearly
    in log compute between the two evaluations around it (None if it never does)."""
    for i, (c, value) in enumerate(zip(compute, loss)):
        if value <= target:
            if i == 0 or compute[i - 1] <= 0:
                return float(c)
            c0, l0 = compute[i - 1], loss[i - 1]
            x = _line(math.log(l0), math.log(c0), math.log(value), math.log(c), math.log(target))
            return math.exp(x)
    return None


def compute_saved(target_loss: float,
                  curves: Sequence[tuple[Sequence[float], Sequence[float]]]) -> Crossing | None:
    """Compute saved at one size: among the other optimizer's runs (each a (compute, loss)
    curve ending at its final evaluation), the earliest crossing of the baseline's best final
    loss; None if no run reaches it."""
    best: Crossing | None = None
    for compute, loss in curves:
        cross = first_crossing(compute, loss, target_loss)
        if cross is None:
            continue
        final = float(compute[-1])
        if best is None or cross < best.cross_compute:
            best = Crossing(target_loss, final, cross, final - cross)
    return best
