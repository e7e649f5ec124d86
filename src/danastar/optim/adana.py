"""ADana and Dana-MK4: log-time momentum with damped Nesterov acceleration (no tau buffer).

For one tensor at step k (a = delta / (delta + k), no bias correction):

    m <- lerp(m, g, a);  v <- (1 - a) v + a g^2;  D = sqrt(v) + eps
    r = |m| / D;  A = (1 + k)^(1 - kappa) * r   (Dana-MK4: A = min(A, clipsnr))
    p <- p - lr * (g / D + sign(m) * A + m / D)
    p <- p * (1 - weight_decay * s_t [/ (1 + k / wd_ts)])

Unclipped this is p - lr * (g + (1 + (1 + k)^(1 - kappa)) m) / D: the momentum coefficient is
1 + alpha(t), as in the authors' released kernel (the paper's text prints alpha(t) alone).
"""

from __future__ import annotations

import torch

from .dana_family import DanaBase
from .group_scalars import decay_multiplier
from .scalar_math import divide
from .working import working_copy, write_back


def adana_scalars(k, lr, schedule_factor, *, delta, kappa, weight_decay, wd_ts):
    """Per-step scalars of ADana at step k: the EMA coefficient a_k, the Nesterov factor
    alpha(k) = (1 + k)^(1 - kappa), the LR and the weight-decay multiplier (k a number, or a
    tensor of counts: capturable)."""
    return {"a": divide(delta, delta + k), "boost": (1 + k) ** (1 - kappa), "lr": lr,
            "decay": decay_multiplier(weight_decay, schedule_factor, k, wd_ts)}


def snr_and_damping(m, denom, boost, clipsnr):
    """Per-coordinate signal-to-noise ratio r = |m| / D and damping A = alpha(k) r."""
    snr = m.abs() / denom
    damping = snr * boost
    if clipsnr is not None:
        damping = damping.clamp(max=clipsnr)
    return snr, damping


def adana_update(param, grad, m, v, *, a, boost, lr, decay, clipsnr, eps):
    """One ADana / Dana-MK4 step on one tensor (reference and compiled paths).

    Rearranged so that the compiled CPU kernel does one division per element instead of three
    and no sign(): sign(m) A = alpha(k) m / D, and clipping A at clipsnr clamps alpha(k) m to
    [-clipsnr D, clipsnr D], so the step is lr (g + m + clamped alpha(k) m) / D. The lerp is
    written out as m + a (g - m): torch.lerp with a tensor weight compiles to both of its
    formulas and a blend.
    """
    work = working_copy(param, m)
    grad = grad.to(m.dtype)
    m.add_(a * (grad - m))
    v.mul_(1 - a).add_(grad * grad * a)
    denom = v.sqrt() + eps
    momentum = boost * m
    if clipsnr is not None:
        bound = clipsnr * denom
        momentum = torch.minimum(torch.maximum(momentum, -bound), bound)
    work.sub_(lr * ((grad + m + momentum) / denom))
    work.mul_(decay)
    write_back(param, work)


class ADana(DanaBase):
    """ADana (``clipsnr=None``) and Dana-MK4 (``clipsnr=2.0``).

    Args:
        params: tensors, or param-group dicts (each may override any setting below).
        lr: peak learning rate γ*; the schedule scales it through ``group["lr"]``.
        delta: δ > 0 of the EMA coefficient a_k = δ / (δ + k) of both moments (default 8):
            the moments average over a window that grows with the step, in log time.
        kappa: κ in (0, 1] of the Nesterov factor α(k) = (1 + k)^(1 − κ) (default 0.85);
            smaller κ gives the momentum more weight as training goes on.
        clipsnr: Dana-MK4's clip of the damping A = α(k)·|m|/D at this value; None: no clip.
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
        impl: the path: "reference" (plain per-tensor loop, any dtype), "compiled"
            (torch.compile over the group's tensor lists), or None (automatic: compiled, except
            the reference loop for small groups on CPU).
        state_dtype: torch.float32 (default) or torch.bfloat16: m and v kept in bf16 with
            stochastic rounding on every write (the update computes in float32).
        stochastic_rounding: round bf16 parameters stochastically too.
        flat: keep each group's parameters, gradients and state in one flat tensor each, the
            parameters' ``.data`` becoming views into it, so that a step is one update over the
            group whatever its number of tensors (plain tensors of one device and dtype per
            group, float32 state; see ``danastar.optim.flat``).
        capturable: keep the step counts on the parameters' device and compute the per-step
            scalars there, so that ``step()`` reads nothing on the host and a CUDA graph can
            capture it (as torch's Adam(capturable=True)); a float ``group["lr"]`` is then a
            constant of the graph, a 0-dim tensor on the device can be changed between replays.
            Not with ``flat=True``.
    """

    buffer_names = ("exp_avg", "exp_avg_sq")
    step_scalars = staticmethod(adana_scalars)
    scalar_constants = ("delta", "kappa", "weight_decay", "wd_ts")
    update = staticmethod(adana_update)

    def diagnostic_terms(self, state, k, group):
        denom = state["exp_avg_sq"].sqrt() + group["eps"]
        boost = self.scalars_for(group, k)["boost"]
        snr, damping = snr_and_damping(state["exp_avg"], denom, boost, group["clipsnr"])
        return {"snr": snr, "damping": damping}
