"""The power-law random-features (PLRF) model: sampling, exact risk, and the inputs of the ODE.

Hidden dimension v, model dimension d. W in R^{v x d} has i.i.d. N(0, 1/d) entries; with
D = diag(j^-alpha), j = 1..v, the features are W_hat = D W and the target b_hat_j = j^(-alpha-beta).
A sample draws z ~ N(0, I_v) and gives x = W_hat^T z, y = <z, b_hat>; the model predicts <x, theta>.
The population risk is exact: R(theta) = 1/2 ||W_hat theta - b_hat||^2.

The ODE needs, per mode of K = W_hat^T W_hat, its eigenvalue, the initial error along it and
the limit risk R_inf. `ODEInputs` holds them, either exactly for one W (`PLRF.spectral_inputs`,
through one thin SVD) or in the deterministic limit d, v -> infinity (`theory_inputs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import integrate, optimize


def trace_k(alpha: float, v: int) -> float:
    """Tr K = sum_{j<=v} j^(-2 alpha), the population trace of the feature covariance."""
    return float(np.sum(np.arange(1, v + 1, dtype=np.float64) ** (-2.0 * alpha)))


def base_learning_rate(alpha: float, v: int, batch: int) -> float:
    """lr0 = min(1, B / Tr K): the scale every preset's step size is a fraction of."""
    return min(1.0, batch / trace_k(alpha, v))


@dataclass
class ODEInputs:
    """Per-mode inputs of the ODE: eigenvalues of K, initial second moments, and R_inf.

    `rho` is the initial error along each mode, `sigma` and `chi` the momentum's second moment
    and the cross moment (zero when the optimizer starts with zero momentum). `risk_infinity`
    is R_inf itself (not twice it).
    """

    eigenvalues: np.ndarray
    rho: np.ndarray
    risk_infinity: float
    sigma: np.ndarray = field(default=None)  # type: ignore[assignment]
    chi: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self):
        self.eigenvalues = np.asarray(self.eigenvalues, dtype=np.float64)
        self.rho = np.asarray(self.rho, dtype=np.float64)
        zeros = np.zeros_like(self.eigenvalues)
        self.sigma = zeros.copy() if self.sigma is None else np.asarray(self.sigma, np.float64)
        self.chi = zeros.copy() if self.chi is None else np.asarray(self.chi, np.float64)
        self.risk_infinity = float(self.risk_infinity)

    @property
    def initial_risk(self) -> float:
        """R(0) = R_inf + 1/2 sum_j lambda_j rho_j."""
        return self.risk_infinity + 0.5 * float(np.sum(self.eigenvalues * self.rho))


class PLRF:
    """One draw of the PLRF model (one W), with its exact spectral decomposition.

    All the simulator needs is the thin SVD W_hat = U S V^T: in the eigenbasis of K a sample is
    x = V S xi, y = (U^T b_hat)^T xi + ||r|| eta with xi ~ N(0, I_d) and eta ~ N(0, 1)
    independent, r = (I - U U^T) b_hat. This has exactly the law of (W_hat^T z, <z, b_hat>) and
    costs O(d) per sample instead of O(v d).
    """

    # Peak memory of a draw, in v x d float64 matrices: W_hat, LAPACK's copy of it, U and the
    # SVD's workspace (measured: 5.26 at d = 1000, v = 5000; 5.55 at d = 500, v = 2500).
    PEAK_MATRICES = 6.0

    @classmethod
    def peak_bytes(cls, d: int, v: int | None = None) -> int:
        """About the most memory drawing a model of these dimensions takes."""
        return int(cls.PEAK_MATRICES * 8 * d * (v if v is not None else 5 * d))

    def __init__(self, alpha: float, beta: float, d: int, v: int | None = None, seed: int = 0):
        self.alpha, self.beta, self.d = float(alpha), float(beta), int(d)
        self.v = int(v if v is not None else 5 * d)
        if self.d < 1 or self.v < self.d:
            raise ValueError(f"need 1 <= d <= v, got d={self.d}, v={self.v}")
        rng = np.random.default_rng(seed)
        index = np.arange(1, self.v + 1, dtype=np.float64)
        # W_hat = diag(j^-alpha) W with W ~ N(0, 1/d), built in place: W itself is not kept
        # (at d = 20,000 each v x d matrix is 16 GB)
        self.W_hat = rng.standard_normal((self.v, self.d))
        self.W_hat /= np.sqrt(self.d)
        self.W_hat *= index[:, None] ** (-self.alpha)
        self.b_hat = index ** (-self.alpha - self.beta)
        U, s, Vt = np.linalg.svd(self.W_hat, full_matrices=False)
        self.U, self.singular_values, self.V = U, s, Vt.T
        self.target_coefficients = U.T @ self.b_hat  # c = U^T b_hat
        residual = self.b_hat - U @ self.target_coefficients
        self.residual_norm = float(np.linalg.norm(residual))

    @property
    def trace_k(self) -> float:
        """Tr K for this model's alpha and v (the population value, not of this W)."""
        return trace_k(self.alpha, self.v)

    @property
    def eigenvalues(self) -> np.ndarray:
        """Eigenvalues s^2 of K = W_hat^T W_hat, largest first."""
        return self.singular_values ** 2

    @property
    def risk_infinity(self) -> float:
        """The empirical limit risk 1/2 ||(I - U U^T) b_hat||^2 (the least-squares residual)."""
        return 0.5 * self.residual_norm ** 2

    @property
    def optimum(self) -> np.ndarray:
        """theta* = argmin R, in the original coordinates."""
        return self.V @ (self.target_coefficients / self.singular_values)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n samples (x, y) drawn as the model defines them: z ~ N(0, I_v), x = W_hat^T z."""
        z = rng.standard_normal((n, self.v))
        return z @ self.W_hat, z @ self.b_hat

    def risk(self, theta: np.ndarray) -> np.ndarray:
        """Exact population risk 1/2 ||W_hat theta - b_hat||^2 for theta of shape (..., d)."""
        theta = np.asarray(theta, dtype=np.float64)
        error = theta @ self.W_hat.T - self.b_hat
        return 0.5 * np.sum(error * error, axis=-1)

    def spectral_inputs(self) -> ODEInputs:
        """The exact ODE inputs of this W: lambda = s^2 and, from theta0 = 0,
        rho_j = (u_j^T b_hat)^2 / s_j^2."""
        rho = (self.target_coefficients / self.singular_values) ** 2
        return ODEInputs(self.eigenvalues, rho, self.risk_infinity)


# ---------------------------------------------------------------------------------------------
# The deterministic limit


def _kappa_integral(kappa: float, two_alpha: float, upper: float) -> float:
    value, _ = integrate.quad(lambda x: 1.0 / (kappa + x ** two_alpha), 0.0, upper, limit=200)
    return value


def kappa_fixed_point(alpha: float, d: int, v: int, rtol: float = 1e-3) -> float:
    """kappa = 1 / int_0^{v/d} dx / (kappa + x^(2 alpha)) for 2 alpha >= 1, by fixed-point
    iteration from kappa0 = (int_0^inf dx / (1 + x^(2 alpha)))^(-2 alpha) to relative change
    rtol."""
    two_alpha = 2.0 * alpha
    if two_alpha < 1:
        raise ValueError("kappa_fixed_point needs 2 alpha >= 1; use tau_fixed_point")
    if two_alpha > 1:
        full, _ = integrate.quad(lambda x: 1.0 / (1.0 + x ** two_alpha), 0.0, np.inf)
        kappa = full ** (-two_alpha)
    else:
        kappa = 1.0
    for _ in range(10_000):
        new = 1.0 / _kappa_integral(kappa, two_alpha, v / d)
        if abs(new - kappa) <= rtol * abs(kappa):
            return new
        kappa = new
    raise RuntimeError(f"kappa fixed point did not converge (alpha={alpha}, d={d}, v={v})")


def tau_fixed_point(alpha: float, d: int, v: int, rtol: float = 1e-3) -> float:
    """tau = 1 / sum_{j<v} 1 / (d (j^(2 alpha) + tau)), the discrete fixed point (used for
    2 alpha < 1, where the continuum integral of `kappa_fixed_point` does not apply)."""
    powers = np.arange(1, v, dtype=np.float64) ** (2.0 * alpha)
    tau = float(d) ** (2.0 * alpha)
    for _ in range(100_000):
        new = 1.0 / np.sum(1.0 / (d * (powers + tau)))
        if abs(new - tau) <= rtol * abs(tau):
            return float(new)
        tau = new
    raise RuntimeError(f"tau fixed point did not converge (alpha={alpha}, d={d}, v={v})")


def limit_risk(alpha: float, beta: float, d: int, v: int | None = None,
               branch: str = "auto") -> float:
    """The deterministic-limit R_inf = 1/2 sum_{j<v} j^(-2(alpha+beta)) / (j^(-2 alpha) tau + 1).

    tau = kappa d^(2 alpha) from the continuum fixed point when 2 alpha >= 1 ("kappa"), or the
    discrete fixed point otherwise ("tau"); `branch` forces one of them.
    """
    v = int(v if v is not None else 5 * d)
    if branch == "auto":
        branch = "kappa" if 2 * alpha >= 1 else "tau"
    if branch == "kappa":
        scale = kappa_fixed_point(alpha, d, v) * float(d) ** (2 * alpha)
    elif branch == "tau":
        scale = tau_fixed_point(alpha, d, v)
    else:
        raise ValueError(f"branch must be 'auto', 'kappa' or 'tau', got {branch!r}")
    j = np.arange(1, v, dtype=np.float64)
    return float(0.5 * np.sum(j ** (-2 * (alpha + beta)) / (j ** (-2 * alpha) * scale + 1.0)))


def solve_scale_directly(alpha: float, d: int, v: int) -> float:
    """tau by a bracketing root finder on the discrete equation (a check of the iterations)."""
    powers = np.arange(1, v, dtype=np.float64) ** (2.0 * alpha)

    def equation(log_tau):
        tau = np.exp(log_tau)
        return tau * np.sum(1.0 / (d * (powers + tau))) - 1.0

    upper = 50.0 + 2 * alpha * np.log(v)
    return float(np.exp(optimize.brentq(equation, -50.0, upper, xtol=1e-12)))


def theory_inputs(alpha: float, beta: float, d: int, v: int | None = None) -> ODEInputs:
    """Deterministic-limit inputs: lambda_j = j^(-2 alpha), rho_j = j^(-2 beta) (+ c_beta / d
    with c_beta = sum_{j<=d} j^(-2 beta) when alpha > 1/2 and beta > 1/2), j = 1..d, and R_inf."""
    v = int(v if v is not None else 5 * d)
    j = np.arange(1, d + 1, dtype=np.float64)
    rho = j ** (-2 * beta)
    if alpha > 0.5 and beta > 0.5:
        rho = rho + np.sum(rho) / d
    return ODEInputs(j ** (-2 * alpha), rho, limit_risk(alpha, beta, d, v))
