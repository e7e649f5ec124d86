"""An independent float64 NumPy transcription of the optimizer specification: one step, one tensor.

Written from the formulas alone (no danastar code) so the tests check the library against the
specification rather than against itself.
"""

from __future__ import annotations

import math

import numpy as np


def decay(p, weight_decay, s, k, wd_ts):
    """The independent decay's multiplication; the factor never leaves [0, 1]."""
    if wd_ts is None:
        factor = 1 - weight_decay * s
    else:
        factor = 1 - weight_decay * s / (1 + k / wd_ts)
    return p * min(max(factor, 0.0), 1.0)


def dana_step(p, g, state, k, lr, s, *, star, delta=8.0, kappa=0.85, clipsnr=None,
              weight_decay=0.0, wd_ts=None, eps=1e-8):
    """ADana / Dana-MK4 (star=False) or Dana-Star / Dana-Star-MK4 (star=True)."""
    a = delta / (delta + k)
    m = state["m"] + a * (g - state["m"])
    v = (1 - a) * state["v"] + a * g * g
    D = np.sqrt(v) + eps
    if not star:
        r = np.abs(m) / D
        A = (1 + k) ** (1 - kappa) * r
        if clipsnr is not None:
            A = np.minimum(A, clipsnr)
        p = p - lr * g / D - lr * (np.sign(m) * A + m / D)
        state.update(m=m, v=v)
    else:
        tau = state["tau"] + a * (np.abs(g) / (np.abs(g) + D) - state["tau"])
        tau_hat = np.minimum(tau, 0.5)
        p_hat = tau_hat / (1 - tau_hat)
        tau_r = np.maximum(p_hat, 1 / (1 + k))
        Te = np.maximum(tau * k, 1.0)
        N = np.sqrt(tau_r) / D
        r = np.abs(m) * N / tau_r
        A = Te ** (1 - kappa) * r
        if clipsnr is not None:
            A = np.minimum(A, clipsnr)
        p = p - lr * g * N - lr * np.sign(m) * (tau_r * A + np.abs(m) * N)
        state.update(m=m, v=v, tau=tau)
    return decay(p, weight_decay, s, k, wd_ts)


def adamw_decaying_wd_step(p, g, state, k, lr, s, *, betas=(0.9, 0.999), eps=1e-8,
                           weight_decay=0.0, wd_ts=None):
    b1, b2 = betas
    m = b1 * state["m"] + (1 - b1) * g
    v = b2 * state["v"] + (1 - b2) * g * g
    bc1, bc2 = 1 - b1 ** k, 1 - b2 ** k
    p = p - (lr / bc1) * m / (np.sqrt(v) / math.sqrt(bc2) + eps)
    state.update(m=m, v=v)
    return decay(p, weight_decay, s, k, wd_ts)


def ademamix_step(p, g, state, k, lr, s, *, betas=(0.9, 0.999, 0.9999), alpha=5.0,
                  alpha_warmup=None, beta3_warmup=None, eps=1e-8, weight_decay=0.0, wd_ts=None,
                  decaying_wd=False):
    b1, b2, b3 = betas
    alpha_k = alpha * min(k / alpha_warmup, 1) if alpha_warmup else alpha
    if beta3_warmup and k < beta3_warmup:
        h = lambda beta: math.log(0.5) / math.log(beta + 1e-8) - 1  # noqa: E731
        f = k / beta3_warmup
        b3 = 0.5 ** (1 / ((1 - f) * h(b1) + f * h(b3) + 1))
    if decaying_wd:
        p = decay(p, weight_decay, s, k, wd_ts)
    m1 = b1 * state["m1"] + (1 - b1) * g
    m2 = b3 * state["m2"] + (1 - b3) * g
    v = b2 * state["v"] + (1 - b2) * g * g
    bc1, bc2 = 1 - b1 ** k, 1 - b2 ** k
    u = (m1 / bc1 + alpha_k * m2) / (np.sqrt(v) / math.sqrt(bc2) + eps)
    p = p - lr * u if decaying_wd else p - lr * (u + weight_decay * p)
    state.update(m1=m1, m2=m2, v=v)
    return p


def initial_state(shape):
    zeros = np.zeros(shape)
    return {name: zeros.copy() for name in ("m", "v", "tau", "m1", "m2")}
