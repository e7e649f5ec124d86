"""The LR law γ*(P) = a·(b + P)^d fitted from LR sweeps over several sizes.

Per size: keep the runs at the ω closest to the target, merge LRs within 5% (lower loss kept),
take the top K by final loss with rank weights K…1. Fit log γ = log a + d·log(b + P) on every
size's top-K points with weights w²·P, a and b kept positive (fitted as logs), from a = 10,
b = 3e4, d = −0.5. Intervals: percentile bootstrap over sizes (seeded).

Three free parameters need three sizes, and with exactly three every resample that can be fitted
is the same three sizes reordered: such a fit has no interval (NaN), not a zero-width one. With b
held fixed (e.g. at the paper's b, for a few nearby sizes that cannot pin it down) two parameters
remain: two sizes suffice and three already give a bootstrap.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import least_squares

from danastar.analysis.sweeps import merge_close_lrs
from danastar.hparams import PAPER_OMEGA as DEFAULT_OMEGA  # scaling.DEFAULT_OMEGA, without torch
from danastar.progress import SILENT, Stages

START = (10.0, 3e4, -0.5)


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    params: float  # P, non-embedding parameters (12·d²·L)
    lr: float
    loss: float  # final validation loss
    omega: float = DEFAULT_OMEGA


@dataclasses.dataclass(frozen=True)
class WeightedPoint:
    params: float
    lr: float
    loss: float
    weight: float  # rank weight: K for the best, 1 for the K-th


def top_k(points: Sequence[SweepPoint], *, k: int = 5,
          omega: float = DEFAULT_OMEGA) -> dict[float, list[WeightedPoint]]:
    """Per size, the top-K points with their rank weights (see the module docstring)."""
    by_size: dict[float, list[SweepPoint]] = {}
    for p in points:
        by_size.setdefault(p.params, []).append(p)
    chosen = {}
    for size, runs in sorted(by_size.items()):
        nearest = min(abs(r.omega - omega) for r in runs)
        kept = [(r.lr, r.loss) for r in runs if abs(r.omega - omega) == nearest]
        ranked = sorted(merge_close_lrs(kept), key=lambda p: p[1])[:k]
        chosen[size] = [WeightedPoint(size, lr, loss, float(k - rank))
                        for rank, (lr, loss) in enumerate(ranked)]
    return chosen


def law(a: float, b: float, d: float, params: float | np.ndarray) -> np.ndarray:
    return a * (b + np.asarray(params, dtype=float)) ** d


def _fit(points: Sequence[WeightedPoint], b: float | None = None) -> tuple[float, float, float]:
    params = np.array([p.params for p in points])
    log_lr = np.log([p.lr for p in points])
    weights = np.array([p.weight for p in points]) ** 2 * params
    sqrt_w = np.sqrt(weights / weights.sum())
    a0, b0, d0 = START
    if b is not None:  # log γ is linear in (log a, d): one exact weighted least-squares solve
        design = np.stack([np.ones_like(params), np.log(b + params)], axis=1) * sqrt_w[:, None]
        (log_a, d), *_ = np.linalg.lstsq(design, sqrt_w * log_lr, rcond=None)
        return float(math.exp(log_a)), float(b), float(d)

    def residuals(theta: np.ndarray) -> np.ndarray:
        log_a, log_b, d = theta
        return sqrt_w * (log_a + d * np.log(np.exp(log_b) + params) - log_lr)

    # b within [1, 1e12] and d within [−3, 1]: a resample of few sizes can leave b undetermined,
    # and the fit must not run off to values whose exponentials overflow
    solution = least_squares(residuals, [math.log(a0), math.log(b0), d0], method="trf",
                             bounds=([-200.0, 0.0, -3.0], [200.0, math.log(1e12), 1.0]),
                             x_scale="jac", max_nfev=5000)
    log_a, log_b, d = solution.x
    return float(math.exp(log_a)), float(math.exp(log_b)), float(d)


@dataclasses.dataclass(frozen=True)
class LRLawFit:
    a: float
    b: float
    d: float
    interval: dict[str, tuple[float, float]]  # 95% percentile intervals of a, b, d
    predictions: dict[float, tuple[float, float, float]]  # P -> (γ, low, high)
    points: dict[float, list[WeightedPoint]]  # the top-K points used, per size
    samples: np.ndarray  # (a, b, d) of each bootstrap resample that could be fitted
    fixed_b: bool = False  # b was given, not fitted

    @property
    def has_interval(self) -> bool:
        return len(self.samples) > 0

    def interval_text(self) -> str | None:
        """The fitted parameters' 95% intervals as text (b left out when it was held); None
        without a bootstrap."""
        if not self.has_interval:
            return None
        return ", ".join(f"{name} [{low:.3g}, {high:.3g}]" for name, (low, high)
                         in self.interval.items() if not (self.fixed_b and name == "b"))

    @property
    def bootstrap_samples(self) -> int:
        return len(self.samples)

    def band(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The 95% bootstrap band of γ at each P."""
        if not len(self.samples):
            return self.lr(params), self.lr(params)
        spread = law(self.samples[:, :1], self.samples[:, 1:2], self.samples[:, 2:3],
                     np.asarray(params, dtype=float)[None, :])
        return np.percentile(spread, 2.5, axis=0), np.percentile(spread, 97.5, axis=0)

    def lr(self, params: float | np.ndarray) -> np.ndarray:
        return law(self.a, self.b, self.d, params)

    def rules_row(self, optimizer: str, kappa: float | None = None) -> str:
        """The fit as a line of ``scaling_rules.yaml`` (under lr_laws: <arch>: <batch>:)."""
        fields = ([f"kappa: {kappa:g}"] if kappa is not None else []) + [
            f"a: {self.a:.3g}", f"b: {self.b:.3g}", f"d: {self.d:.3f}"]
        return f"{optimizer}: [{{{', '.join(fields)}}}]"


def fit_lr_law(points: Sequence[SweepPoint], *, k: int = 5, omega: float = DEFAULT_OMEGA,
               bootstrap: int = 1000, seed: int = 0, predict_at: Sequence[float] = (),
               b: float | None = None, stages: Stages = SILENT) -> LRLawFit:
    """Fit the LR law with bootstrap intervals (see the module docstring); b held at the given
    value if one is given. Needs ≥ 3 sizes (≥ 2 with b given). `stages` counts the resamples (a
    command's progress bar: a thousand fits take tens of seconds)."""
    chosen = top_k(points, k=k, omega=omega)
    sizes = list(chosen)
    free = 3 if b is None else 2
    if len(sizes) < free:
        raise ValueError(f"an LR law a·(b+P)^d with {free} free parameters needs sweeps at "
                         f"{free} or more sizes, got {len(sizes)}")
    a, b_fit, d = _fit([p for size in sizes for p in chosen[size]], b)
    rng = np.random.default_rng(seed)
    samples = []
    # with as many sizes as free parameters, each fittable resample only reorders the sizes
    resamples = bootstrap if len(sizes) > free else 0
    for _ in stages.counted(range(resamples), resamples, "fit"):
        drawn = rng.choice(len(sizes), size=len(sizes), replace=True)
        if len(set(drawn.tolist())) < free:  # each free parameter needs its own size
            continue
        samples.append(_fit([p for i in drawn for p in chosen[sizes[i]]], b))
    arr = np.array(samples) if samples else np.full((1, 3), np.nan)
    interval = {name: (float(np.percentile(arr[:, i], 2.5)), float(np.percentile(arr[:, i], 97.5)))
                for i, name in enumerate("abd")}
    predictions = {}
    for size in predict_at:
        spread = law(arr[:, 0], arr[:, 1], arr[:, 2], size)
        predictions[float(size)] = (float(law(a, b_fit, d, size)),
                                    float(np.percentile(spread, 2.5)),
                                    float(np.percentile(spread, 97.5)))
    return LRLawFit(a, b_fit, d, interval, predictions, chosen, np.array(samples).reshape(-1, 3),
                    fixed_b=b is not None)
