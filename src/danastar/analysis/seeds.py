"""Seed statistics: mean ± standard error, and the difference of two means with its t-statistic
(Welch), so that a gain can be compared with the seed noise."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class MeanSE:
    mean: float
    se: float  # standard error of the mean; nan with a single seed
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.4f}" if self.n < 2 else f"{self.mean:.4f} ± {self.se:.4f}"


def mean_se(values: Sequence[float]) -> MeanSE:
    n = len(values)
    if n == 0:
        raise ValueError("mean of no values")
    mean = sum(values) / n
    if n < 2:
        return MeanSE(mean, float("nan"), n)
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return MeanSE(mean, math.sqrt(variance / n), n)


@dataclasses.dataclass(frozen=True)
class Difference:
    difference: float  # mean(a) − mean(b)
    se: float
    t: float  # difference / se; nan when either side has a single seed


def difference(a: Sequence[float], b: Sequence[float]) -> Difference:
    ma, mb = mean_se(a), mean_se(b)
    diff = ma.mean - mb.mean
    se = math.sqrt(ma.se ** 2 + mb.se ** 2)
    t = diff / se if se > 0 else (float("nan") if math.isnan(se) or diff == 0 else math.inf)
    return Difference(diff, se, t)


def best_lr(losses: dict[float, dict[int, float]]) -> float:
    """The best of several LRs from their final losses by seed (``{lr: {seed: loss}}``): the
    lowest mean over the seeds that every LR has, a paired comparison (same data orders), so
    that an LR run with more seeds, whose extra seeds may land worse, is not judged against
    another LR's single lucky seed; with no seed in common, the lowest mean of each LR's own."""
    common = set.intersection(*(set(by_seed) for by_seed in losses.values()))

    def score(lr: float) -> float:
        kept = [loss for seed, loss in losses[lr].items() if seed in common] if common \
            else list(losses[lr].values())
        return sum(kept) / len(kept)

    return min(losses, key=score)
