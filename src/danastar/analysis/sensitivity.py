"""LR sensitivity: per size, a parabola in x = ln lr through the final losses of an LR sweep.

loss ≈ A·x² + B·x + C₀: curvature ζ = A, lr* = exp(−B/2A), L* = C₀ − B²/4A; the cost of a
relative LR error ε is ΔL = ζ·ln²(1 + ε). With A ≤ 0 (no minimum in the swept range) the fit is
redone on the 3 lowest losses.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from danastar.analysis.sweeps import merge_close_lrs

MIN_LRS = 5


@dataclasses.dataclass(frozen=True)
class Parabola:
    A: float
    B: float
    C0: float
    lrs: tuple[float, ...]  # the points the parabola was fitted on
    losses: tuple[float, ...]
    refit_on_lowest: bool  # the first fit had A ≤ 0

    @property
    def curvature(self) -> float:
        return self.A

    @property
    def has_minimum(self) -> bool:
        """A minimum inside the LRs it was fitted on: a convex fit whose vertex lies outside
        them (a loss still falling at the sweep's edge) is a trend, not an optimum."""
        if self.A <= 0:
            return False
        vertex = -self.B / (2 * self.A)  # in ln lr
        return math.log(min(self.lrs)) <= vertex <= math.log(max(self.lrs))

    @property
    def best_lr(self) -> float:
        return math.exp(-self.B / (2 * self.A)) if self.has_minimum else float("nan")

    @property
    def best_loss(self) -> float:
        return self.C0 - self.B ** 2 / (4 * self.A) if self.has_minimum else float("nan")

    def loss(self, lr: float | np.ndarray) -> np.ndarray:
        x = np.log(np.asarray(lr, dtype=float))
        return self.A * x ** 2 + self.B * x + self.C0


def fit_parabola(points: Sequence[tuple[float, float]], *, min_lrs: int = MIN_LRS) -> Parabola:
    """Fit one size's (lr, final loss) points; needs ``min_lrs`` LRs after merging."""
    merged = merge_close_lrs(points)
    if len(merged) < max(3, min_lrs):
        raise ValueError(f"an LR-sensitivity parabola needs {max(3, min_lrs)} or more distinct "
                         f"LRs, got {len(merged)}")
    lrs = np.array([lr for lr, _ in merged])
    losses = np.array([loss for _, loss in merged])
    A, B, C0 = np.polyfit(np.log(lrs), losses, 2)
    refit = False
    if A <= 0:
        lowest = np.argsort(losses)[:3]
        lrs, losses = lrs[lowest], losses[lowest]
        A, B, C0 = np.polyfit(np.log(lrs), losses, 2)
        refit = True
    return Parabola(float(A), float(B), float(C0), tuple(lrs.tolist()), tuple(losses.tolist()),
                    refit)


def lr_error_cost(curvature: float, relative_error: float) -> float:
    """ΔL = ζ·ln²(1 + ε): the loss paid for an LR off by a factor (1 + ε)."""
    return curvature * math.log1p(relative_error) ** 2


def mean_curvature(parabolas: Sequence[Parabola]) -> float:
    """Mean ζ over sizes (sizes without a minimum left out)."""
    values = [p.curvature for p in parabolas if p.has_minimum]
    return float(np.mean(values)) if values else float("nan")
