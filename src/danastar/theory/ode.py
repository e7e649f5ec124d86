"""The deterministic ODE for the expected risk of generalised momentum SGD on the PLRF model.

Per mode j (eigenvalue lambda) the state v = (rho, sigma, chi) holds the second moment of the
error along the mode, of the momentum, and their cross moment. Twice the risk is
P(t) = 2 R_inf + sum_j lambda_j rho_j. With c = (B + 1) / B, a = g2 + g1 g3 and D = Delta(t),

    dv/dt = Omega(t) v + G(t) P(t),   G = lambda (a^2 / B, g1^2 / B, -(g1 g2 + g1^2 g3) / B)

(Omega's rows are written out in `_omega`). It is the one-step recursion of the second moments
(exact for Gaussian data) read as a differential equation.

Integration is backward Euler in log-time tau = ln(1 + t) with step dtau: t' = e^(tau + dtau),
h = dtau t', coefficients at t = t' - 1, and

    v+ = (I - h Omega)^-1 (v + h G P+),   P+ = 2 R_inf + sum_j lambda_j rho_j+.

The modes couple only through the scalar P+, a rank-one term, which the Sherman-Morrison formula
closes exactly: with X = M^-1 v and Y = M^-1 G per mode (M = I - h Omega),
P+ = (2 R_inf + sum lambda X_rho) / (1 - h sum lambda Y_rho) and v+ = X + h P+ Y. One 3x3 solve
per mode per step, vectorised over all modes and over several schedules at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from danastar.progress import SILENT, Stages

from .model import ODEInputs
from .schedules import Schedule


@dataclass
class ODEResult:
    """Risk curves of the ODE: `risks[i, k]` is schedule i's risk at `times[k]`."""

    names: list[str]
    times: np.ndarray
    risks: np.ndarray
    risk_infinity: float


def evaluation_times(t_max: float, base: float = 1.1) -> np.ndarray:
    """{0} U {floor(base^k)} U {t_max}: the evaluation grid of the simulator and the ODE."""
    t_max = int(t_max)
    k_max = int(np.floor(np.log(max(t_max, 1)) / np.log(base))) + 1
    grid = np.floor(base ** np.arange(k_max + 1)).astype(np.int64)
    grid = grid[grid <= t_max]
    return np.unique(np.concatenate([[0], grid, [t_max]]))


def _omega(lam, c, g1, g2, g3, D):
    """The 3x3 matrix Omega per (schedule, mode): a tuple of nine arrays, row-major."""
    a = g2 + g1 * g3
    one = 1.0 - D
    ones = np.ones_like(lam)
    return (
        -2 * a * lam + c * a * a * lam * lam,
        g3 * g3 * one * one * ones,
        -2 * g3 * one + 2 * (g2 * g3 + g1 * g3 * g3) * one * lam,
        c * g1 * g1 * lam * lam,
        (-2 * D + D * D) * ones,
        2 * g1 * lam * one,
        g1 * lam - c * lam * lam * (g1 * g2 + g1 * g1 * g3),
        (-g3 + g3 * D * (2 - D)) * ones,
        -D - (g2 - g2 * D + 2 * one * g1 * g3) * lam,
    )


def _solve3(m, rhs):
    """Solve the 3x3 systems m x = rhs elementwise (Cramer's rule on arrays)."""
    m11, m12, m13, m21, m22, m23, m31, m32, m33 = m
    c11 = m22 * m33 - m23 * m32
    c12 = m23 * m31 - m21 * m33
    c13 = m21 * m32 - m22 * m31
    det = m11 * c11 + m12 * c12 + m13 * c13
    inv = (c11, m13 * m32 - m12 * m33, m12 * m23 - m13 * m22,
           c12, m11 * m33 - m13 * m31, m13 * m21 - m11 * m23,
           c13, m12 * m31 - m11 * m32, m11 * m22 - m12 * m21)
    r1, r2, r3 = rhs
    return ((inv[0] * r1 + inv[1] * r2 + inv[2] * r3) / det,
            (inv[3] * r1 + inv[4] * r2 + inv[5] * r3) / det,
            (inv[6] * r1 + inv[7] * r2 + inv[8] * r3) / det)


def solve_ode(inputs: ODEInputs, schedules: Sequence[Schedule], batch: int, t_max: float,
              dtau: float = 1e-3, times: np.ndarray | None = None,
              stages: Stages = SILENT) -> ODEResult:
    """Integrate the ODE for every schedule (on the same inputs) up to t_max.

    Returns the risk at `times` (default: `evaluation_times(t_max)`), interpolated linearly in
    log(1 + t) between integration steps. `stages` counts the integration steps (a command's
    progress bar).
    """
    schedules = list(schedules)
    if not schedules:
        raise ValueError("solve_ode needs at least one schedule")
    times = evaluation_times(t_max) if times is None else np.asarray(times, dtype=np.float64)
    n_steps = int(np.ceil(np.log1p(t_max) / dtau))
    taus = dtau * np.arange(1, n_steps + 1)
    t_coef = np.expm1(taus)  # coefficients at t = t' - 1, t' = e^(tau + dtau)
    h_all = dtau * np.exp(taus)
    # every schedule's coefficients on the whole grid, shape (runs, steps)
    values = [np.stack(s.values(t_coef)) for s in schedules]
    g1_all, g2_all, g3_all, delta_all = (np.stack([v[i] for v in values]) for i in range(4))
    normalised = np.array([s.risk_normalised for s in schedules])[:, None]

    lam = inputs.eigenvalues[None, :]
    n_runs = len(schedules)
    rho = np.repeat(inputs.rho[None, :], n_runs, 0)
    sigma = np.repeat(inputs.sigma[None, :], n_runs, 0)
    chi = np.repeat(inputs.chi[None, :], n_runs, 0)
    twice_inf = 2.0 * inputs.risk_infinity
    c = (batch + 1.0) / batch
    twice_risk = twice_inf + np.sum(lam * rho, axis=1)
    history = np.empty((n_runs, n_steps + 1))
    history[:, 0] = twice_risk
    with np.errstate(over="ignore", invalid="ignore"):
        for step in stages.counted(range(n_steps), n_steps, "step"):
            h = h_all[step]
            g1, g2, g3, D = (arr[:, step:step + 1] for arr in
                             (g1_all, g2_all, g3_all, delta_all))
            if normalised.any():  # Adam-like: the step sizes scale as 1 / sqrt(2R), explicitly
                scale = np.where(normalised, 1.0 / np.sqrt(twice_risk)[:, None], 1.0)
                g2, g3 = g2 * scale, g3 * scale
            omega = _omega(lam, c, g1, g2, g3, D)
            m = tuple((1.0 if i in (0, 4, 8) else 0.0) - h * o for i, o in enumerate(omega))
            a = g2 + g1 * g3
            forcing = (lam * a * a / batch, lam * g1 * g1 / batch, -lam * a * g1 / batch)
            forcing = tuple(np.broadcast_to(f, lam.shape if n_runs == 1 else rho.shape)
                            for f in forcing)
            x = _solve3(m, (rho, sigma, chi))
            y = _solve3(m, forcing)
            twice_risk = ((twice_inf + np.sum(lam * x[0], axis=1))
                          / (1.0 - h * np.sum(lam * y[0], axis=1)))
            closure = h * twice_risk[:, None]
            rho, sigma, chi = (xi + closure * yi for xi, yi in zip(x, y, strict=True))
            history[:, step + 1] = twice_risk
    grid = np.concatenate([[0.0], taus])
    log_times = np.log1p(times)
    risks = 0.5 * np.stack([np.interp(log_times, grid, row) for row in history])
    return ODEResult([s.name for s in schedules], times, risks, inputs.risk_infinity)
