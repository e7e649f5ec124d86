"""Joint power-law fits of loss against compute with one floor shared by all curves.

For each curve i (one optimizer):  L_i(C) = a + b_i·C^(−c_i) + e_i·C^(−f_i)  (broken), or
L_i(C) = a + b_i·C^(−c_i) (single), with a = σ(a_raw)·0.99·min(all losses) so the floor stays
below every observed loss, b_i = exp(β_i), e_i = exp(ε_i). The objective is the mean over all
points of (log L_i(C) − log y)², solved by ``scipy.optimize.least_squares`` from the release's
start (a_raw = −3.1, b = 0.4, c = 0.2, e = 2.5, f = 0.03). C is in petaflop-hours, the unit
that start was chosen for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.optimize import least_squares

START = {"a_raw": -3.1, "b": 0.4, "c": 0.2, "e": 2.5, "f": 0.03}


@dataclasses.dataclass(frozen=True)
class CurveParams:
    b: float
    c: float
    e: float = 0.0  # 0 for a single power law
    f: float = 0.0
    r2: float = float("nan")  # in linear loss space, over this curve's points


@dataclasses.dataclass(frozen=True)
class PowerLawFit:
    floor: float  # a, shared by every curve
    curves: dict[str, CurveParams]
    broken: bool
    r2: float  # over all points, linear loss space

    def predict(self, name: str, compute: float | np.ndarray) -> np.ndarray:
        p = self.curves[name]
        compute = np.asarray(compute, dtype=float)
        value = self.floor + p.b * compute ** (-p.c)
        if self.broken:
            value = value + p.e * compute ** (-p.f)
        return value

    def to_dict(self) -> dict:
        return {"floor": self.floor, "broken": self.broken, "r2": self.r2,
                "curves": {k: dataclasses.asdict(v) for k, v in self.curves.items()}}


def _r2(observed: np.ndarray, predicted: np.ndarray) -> float:
    total = float(np.sum((observed - observed.mean()) ** 2))
    if total == 0:
        return float("nan")
    return 1.0 - float(np.sum((observed - predicted) ** 2)) / total


def fit_power_laws(points: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
                   broken: bool = True, weight_by_compute: bool = False) -> PowerLawFit:
    """Fit every curve ``name -> (compute, loss)`` jointly (see the module docstring).

    ``weight_by_compute`` weights each point's squared log error by its compute (normalised to
    mean 1) instead of equally."""
    names = list(points)
    data = [(np.asarray(points[n][0], float), np.asarray(points[n][1], float)) for n in names]
    if not names or any(len(c) == 0 or len(c) != len(y) for c, y in data):
        raise ValueError("every curve needs as many compute values as losses, at least one")
    all_c = np.concatenate([c for c, _ in data])
    all_y = np.concatenate([y for _, y in data])
    if np.any(all_c <= 0) or np.any(all_y <= 0):
        raise ValueError("compute and loss must be positive to fit in log space")
    weights = all_c / all_c.mean() if weight_by_compute else np.ones_like(all_c)
    sqrt_w = np.sqrt(weights / len(all_c))
    cap = 0.99 * float(all_y.min())
    per_curve = 4 if broken else 2

    def unpack(theta: np.ndarray) -> tuple[float, list[np.ndarray]]:
        floor = cap / (1.0 + np.exp(-theta[0]))
        return floor, [theta[1 + i * per_curve: 1 + (i + 1) * per_curve]
                       for i in range(len(names))]

    def curve_value(floor: float, p: np.ndarray, c: np.ndarray) -> np.ndarray:
        value = floor + np.exp(p[0]) * c ** (-p[1])
        if broken:
            value = value + np.exp(p[2]) * c ** (-p[3])
        return value

    def residuals(theta: np.ndarray) -> np.ndarray:
        floor, params = unpack(theta)
        predicted = np.concatenate([curve_value(floor, p, c) for p, (c, _) in zip(params, data)])
        return sqrt_w * (np.log(predicted) - np.log(all_y))

    one = [np.log(START["b"]), START["c"]]
    if broken:
        one += [np.log(START["e"]), START["f"]]
    theta0 = np.array([START["a_raw"]] + one * len(names))
    solution = least_squares(residuals, theta0, method="trf", x_scale="jac", max_nfev=20000,
                             xtol=1e-12, ftol=1e-12, gtol=1e-12)
    floor, params = unpack(solution.x)
    curves = {}
    predicted_all = []
    for name, p, (c, y) in zip(names, params, data):
        predicted = curve_value(floor, p, c)
        predicted_all.append(predicted)
        curves[name] = CurveParams(
            b=float(np.exp(p[0])), c=float(p[1]),
            e=float(np.exp(p[2])) if broken else 0.0, f=float(p[3]) if broken else 0.0,
            r2=_r2(y, predicted))
    return PowerLawFit(floor=float(floor), curves=curves, broken=broken,
                       r2=_r2(all_y, np.concatenate(predicted_all)))
