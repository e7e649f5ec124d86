"""Dana-Star and Dana-Star-MK4: ADana with a per-coordinate estimate tau of how often a coordinate
receives gradient, so rarely-updated coordinates (rare tokens, experts) get the right step.

For one tensor at step k (a = delta / (delta + k)); tau uses the already-updated v:

    m <- lerp(m, g, a);  v <- (1 - a) v + a g^2;  D = sqrt(v) + eps
    tau <- lerp(tau, |g| / (|g| + D), a)
    p_hat = min(tau, 1/2) / (1 - min(tau, 1/2));  tau_r = max(p_hat, 1 / (1 + k))
    T_eff = max(tau k, 1);  N = sqrt(tau_r) / D;  r = |m| N / tau_r
    A = T_eff^(1 - kappa) r   (Dana-Star-MK4: A = min(A, clipsnr))
    p <- p - lr * (g N + sign(m) (tau_r A + |m| N)), then the decaying weight decay.
"""

from __future__ import annotations

import torch

from .dana_family import DanaBase
from .group_scalars import decay_multiplier
from .scalar_math import divide
from .working import working_copy, write_back


def dana_star_scalars(k, lr, schedule_factor, *, delta, weight_decay, wd_ts):
    """Per-step scalars of Dana-Star at step k: a_k, k itself (for the effective time), the
    floor 1 / (1 + k) of the regularised probability, the LR and the weight-decay multiplier
    (k a number, or a tensor of counts: capturable)."""
    return {"a": divide(delta, delta + k), "k": k, "tau_floor": divide(1, 1 + k), "lr": lr,
            "decay": decay_multiplier(weight_decay, schedule_factor, k, wd_ts)}


def regularised_probability(tau, tau_floor):
    """tau_r = max(p_hat, 1 / (1 + k)) with p_hat = min(tau, 1/2) / (1 - min(tau, 1/2))."""
    tau_hat = tau.clamp(max=0.5)
    return torch.clamp(tau_hat / (1 - tau_hat), min=tau_floor)


def effective_time_factor(tau, k, kappa):
    """T_eff^(1 - kappa) with T_eff = max(tau k, 1), computed as exp((1 - kappa) log T_eff): the
    same value to a few ulps, and the vectorised CPU kernel computes it in two thirds of the time
    of pow."""
    return torch.exp((1 - kappa) * torch.log(torch.clamp(tau * k, min=1)))


def star_terms(m, denom, tau, k, tau_floor, kappa, clipsnr):
    """Regularised probability tau_r, normaliser N, SNR r and damping A of Dana-Star, as the
    specification writes them (the diagnostics report r and A)."""
    tau_reg = regularised_probability(tau, tau_floor)
    norm = tau_reg.sqrt() / denom
    snr = m.abs() * norm / tau_reg
    damping = effective_time_factor(tau, k, kappa) * snr
    if clipsnr is not None:
        damping = damping.clamp(max=clipsnr)
    return tau_reg, norm, snr, damping


def dana_star_update(param, grad, m, v, tau, *, a, k, tau_floor, lr, decay, kappa, clipsnr,
                     eps):
    """One Dana-Star / Dana-Star-MK4 step on one tensor (reference and compiled paths).

    Rearranged, with the same value up to rounding, so that the compiled CPU kernel (bound by
    its arithmetic, not by memory) does one division and the sign() fewer per element: the step
    is lr (N (g + m) + sign(m) tau_r A), and tau_r A = T_eff^(1 - kappa) |m| N, so
    sign(m) tau_r A = T_eff^(1 - kappa) N m; clipping A at clipsnr clamps that to
    [-clipsnr tau_r, clipsnr tau_r]. The lerps are written out as m + a (g - m): torch.lerp with
    a tensor weight compiles to both of its formulas and a blend.
    """
    work = working_copy(param, m)
    grad = grad.to(m.dtype)
    m.add_(a * (grad - m))
    v.mul_(1 - a).add_(grad * grad * a)
    denom = v.sqrt() + eps
    grad_size = grad.abs()
    tau.add_(a * (grad_size / (grad_size + denom) - tau))
    tau_reg = regularised_probability(tau, tau_floor)
    norm = tau_reg.sqrt() / denom
    momentum = m * (norm * effective_time_factor(tau, k, kappa))
    if clipsnr is not None:
        bound = clipsnr * tau_reg
        momentum = torch.minimum(torch.maximum(momentum, -bound), bound)
    work.sub_(lr * (norm * (grad + m) + momentum))
    work.mul_(decay)
    write_back(param, work)


class DanaStar(DanaBase):
    """Dana-Star (``clipsnr=None``) and Dana-Star-MK4 (``clipsnr=2.0``).

    Args:
        params: tensors, or param-group dicts (each may override any setting below).
        lr: peak learning rate γ*; the schedule scales it through ``group["lr"]``.
        delta: δ > 0 of the EMA coefficient a_k = δ / (δ + k) of m, v and tau (default 8).
        kappa: κ in (0, 1] of the effective-time factor T_eff^(1 − κ), T_eff = max(tau·k, 1)
            (default 0.85).
        clipsnr: Dana-Star-MK4's clip of the damping A at this value; None: no clip.
        weight_decay: λ of the independent decay p ← p · (1 − λ · s_t [/ (1 + k / wd_ts)]),
            s_t the schedule factor (current LR / peak LR); not multiplied by the LR. A
            constant λ (no ``wd_ts``) that would remove more than 5% of a weight in 100 steps
            (λ > 5.1e-4, e.g. AdamW's habitual 0.1) is refused.
        wd_ts: time scale of the decay of λ in steps (the paper uses T/10); None: constant λ.
        omega, total_steps: the paper's form instead of ``weight_decay`` and ``wd_ts``:
            ``wd_ts = total_steps // 10`` and ``weight_decay = omega / wd_ts`` (ω = 4 in the
            paper and the default; total_steps is the run's length T in optimizer steps).
            Neither ``total_steps`` nor ``weight_decay`` given: no weight decay.
        eps: added to sqrt(v) in the denominator D.
        impl: "reference", "compiled" or None (automatic), as for :class:`ADana`.
        state_dtype, stochastic_rounding, flat, capturable: as for :class:`ADana`.
    """

    buffer_names = ("exp_avg", "exp_avg_sq", "tau")
    step_scalars = staticmethod(dana_star_scalars)
    scalar_constants = ("delta", "weight_decay", "wd_ts")
    update = staticmethod(dana_star_update)
    update_constants = ("kappa", "clipsnr", "eps")

    def diagnostic_terms(self, state, k, group):
        denom = state["exp_avg_sq"].sqrt() + group["eps"]
        scalars = self.scalars_for(group, k)
        _, _, snr, damping = star_terms(state["exp_avg"], denom, state["tau"], k,
                                        scalars["tau_floor"], group["kappa"], group["clipsnr"])
        return {"snr": snr, "damping": damping, "tau": state["tau"]}
