"""Loss exponents: measured decade slopes of log(R - R_inf) against log t, and predictions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def sgd_exponent(alpha: float, beta: float) -> float:
    """SGD's risk exponent before saturation:
    R - R_inf ~ t^(-(2 alpha + 2 beta - 1) / (2 alpha))."""
    return (2 * alpha + 2 * beta - 1) / (2 * alpha)


def dana_decaying_exponent(alpha: float, beta: float) -> float:
    """DANA-decaying's exponent from its effective time t^(2 - 1/(2 alpha)) (DANA paper):
    SGD's exponent times 2 - 1/(2 alpha)."""
    return sgd_exponent(alpha, beta) * (2 - 1 / (2 * alpha))


def predicted_exponents(alpha: float, beta: float) -> dict[str, float]:
    """Predicted exponents by preset name (before saturation; DANA-constant only before t ~ d)."""
    sgd = sgd_exponent(alpha, beta)
    return {"sgd": sgd, "momentum": sgd, "dana-constant": sgd,
            "dana-decaying": dana_decaying_exponent(alpha, beta)}


@dataclass(frozen=True)
class DecadeSlope:
    start: float
    stop: float
    exponent: float  # minus the slope: R - R_inf ~ t^(-exponent) over [start, stop]


def decade_slopes(times, risks, risk_infinity: float, first: float = 1.0,
                  last: float | None = None) -> list[DecadeSlope]:
    """The exponent on each decade [10^k, 10^(k+1)] within [first, last]: minus the
    least-squares slope of log(R - R_inf) against log t over the points in the decade."""
    times = np.asarray(times, dtype=np.float64)
    excess = np.asarray(risks, dtype=np.float64) - risk_infinity
    last = times.max() if last is None else last
    slopes = []
    k = int(np.floor(np.log10(max(first, 1.0)) + 1e-9))
    while 10.0 ** (k + 1) <= last * (1 + 1e-9):
        inside = (times >= 10.0 ** k) & (times <= 10.0 ** (k + 1)) & (excess > 0)
        if inside.sum() >= 3:
            slope = np.polyfit(np.log(times[inside]), np.log(excess[inside]), 1)[0]
            slopes.append(DecadeSlope(10.0 ** k, 10.0 ** (k + 1), float(-slope)))
        k += 1
    return slopes


def exponent_between(times, risks, risk_infinity: float, start: float, stop: float) -> float:
    """Minus the least-squares slope of log(R - R_inf) against log t over [start, stop]."""
    times = np.asarray(times, dtype=np.float64)
    excess = np.asarray(risks, dtype=np.float64) - risk_infinity
    inside = (times >= start) & (times <= stop) & (excess > 0)
    if inside.sum() < 3:
        raise ValueError(f"fewer than 3 evaluation times in [{start:g}, {stop:g}]")
    return float(-np.polyfit(np.log(times[inside]), np.log(excess[inside]), 1)[0])
