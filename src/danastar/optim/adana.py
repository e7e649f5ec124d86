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
from torch.distributed.tensor import DTensor

from ._kernel import PerTensorOptimizer, check, decay_multiplier


def adana_scalars(k, lr, schedule_factor, *, delta, kappa, weight_decay, wd_ts):
    """Per-step scalars of ADana at step k: the EMA coefficient a_k, the Nesterov factor
    alpha(k) = (1 + k)^(1 - kappa), the LR and the weight-decay multiplier."""
    return {"a": delta / (delta + k), "boost": (1 + k) ** (1 - kappa), "lr": lr,
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
    work = param if param.dtype == m.dtype else param.to(m.dtype)
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
    if work is not param:
        param.copy_(work)


def foreach_log_time_moments(ms, vs, grads, a, eps):
    """The DANA family's moment update over lists: m <- lerp(m, g, a), v <- (1 - a) v + a g^2;
    returns the denominators D = sqrt(v) + eps."""
    torch._foreach_lerp_(ms, grads, a)
    torch._foreach_mul_(vs, 1 - a)
    torch._foreach_addcmul_(vs, grads, grads, value=a)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_add_(denom, eps)
    return denom


def adana_foreach_update(params, grads, ms, vs, *, a, boost, lr, decay, clipsnr, eps):
    """`adana_update` over lists of tensors (Python-float scalars)."""
    work, grads = working_copies(params, grads, ms)
    denom = foreach_log_time_moments(ms, vs, grads, a, eps)
    damping = torch._foreach_abs(ms)
    torch._foreach_div_(damping, denom)
    torch._foreach_mul_(damping, boost)
    if clipsnr is not None:
        torch._foreach_clamp_max_(damping, clipsnr)
    torch._foreach_mul_(damping, torch._foreach_sign(ms))
    direction = torch._foreach_div(grads, denom)
    torch._foreach_add_(direction, damping)
    torch._foreach_addcdiv_(direction, ms, denom)
    torch._foreach_add_(work, direction, alpha=-lr)
    finish_foreach(params, work, decay)


def working_copies(params, grads, buffers):
    """Parameters and gradients in the state's dtype (float32 copies for bf16 parameters)."""
    work = [p if p.dtype == b.dtype else p.to(b.dtype) for p, b in zip(params, buffers)]
    grads = [g.to(b.dtype) for g, b in zip(grads, buffers)]
    return work, grads


def finish_foreach(params, work, decay):
    """Apply the weight-decay multiplier, then write float32 copies back to low-precision params."""
    if decay != 1:
        torch._foreach_mul_(work, decay)
    for param, updated in zip(params, work):
        if updated is not param:
            param.copy_(updated)


def check_dana_hyperparameters(lr, delta, kappa, clipsnr, weight_decay, wd_ts, eps):
    check(lr >= 0, f"lr must be >= 0, got {lr}")
    check(delta > 0, f"delta must be > 0 (default 8), got {delta}")
    check(0 < kappa <= 1, f"kappa must be in (0, 1] (default 0.85), got {kappa}")
    check(clipsnr is None or clipsnr > 0, f"clipsnr must be None or > 0, got {clipsnr}")
    check(weight_decay >= 0, f"weight_decay must be >= 0, got {weight_decay}")
    check(wd_ts is None or wd_ts > 0, f"wd_ts must be None or > 0, got {wd_ts}")
    check(eps >= 0, f"eps must be >= 0, got {eps}")


def _total(tensor: torch.Tensor) -> float:
    """Sum of all elements as a float; for a DTensor, over every rank's shard."""
    total = tensor.sum(dtype=torch.float64)
    return float(total.full_tensor() if isinstance(total, DTensor) else total)


class DanaBase(PerTensorOptimizer):
    """What ADana and DanaStar share: hyperparameters, validation and diagnostics."""

    update_constants = ("clipsnr", "eps")
    float32_scalars = True  # the kernel's 1 - a_k is at least 1 / (1 + delta), 1/9 by default

    def __init__(self, params, lr, *, delta=8.0, kappa=0.85, clipsnr=None, weight_decay=0.0,
                 wd_ts=None, eps=1e-8, impl=None):
        check_dana_hyperparameters(lr, delta, kappa, clipsnr, weight_decay, wd_ts, eps)
        defaults = dict(lr=lr, delta=delta, kappa=kappa, clipsnr=clipsnr,
                        weight_decay=weight_decay, wd_ts=wd_ts, eps=eps)
        super().__init__(params, defaults, impl)

    def diagnostic_terms(self, state: dict, k: float, group: dict) -> dict:
        raise NotImplementedError

    @torch.no_grad()
    def diagnostics(self) -> dict[str, float]:
        """Means of the damping factor A and SNR r (and tau for Dana-Star) over all
        coordinates, and the global norm of m, computed now from the state (DTensor-safe)."""
        sums: dict[str, float] = {}
        count, momentum_square = 0, 0.0
        for group in self.param_groups:
            for param in group["params"]:
                state = self.state.get(param)
                if not state:
                    continue
                terms = self.diagnostic_terms(state, state["step"].item(), group)
                for name, values in terms.items():
                    sums[name] = sums.get(name, 0.0) + _total(values)
                momentum_square += _total(state["exp_avg"].square())
                count += param.numel()
        if count == 0:
            return {}
        result = {f"{name}_mean": total / count for name, total in sums.items()}
        result["momentum_norm"] = momentum_square ** 0.5
        return result


class ADana(DanaBase):
    """ADana (``clipsnr=None``) and Dana-MK4 (``clipsnr=2.0``).

    ``impl`` picks the path: "reference" (plain per-tensor loop, any dtype), "foreach"
    (torch._foreach_* multi-tensor ops), "compiled" (torch.compile over the group's tensor lists),
    or None (automatic: compiled, except the reference loop for small groups on CPU).
    """

    buffer_names = ("exp_avg", "exp_avg_sq")
    step_scalars = staticmethod(adana_scalars)
    scalar_constants = ("delta", "kappa", "weight_decay", "wd_ts")
    update = staticmethod(adana_update)
    foreach_update = staticmethod(adana_foreach_update)

    def diagnostic_terms(self, state, k, group):
        denom = state["exp_avg_sq"].sqrt() + group["eps"]
        boost = self.scalars_for(group, k)["boost"]
        snr, damping = snr_and_damping(state["exp_avg"], denom, boost, group["clipsnr"])
        return {"snr": snr, "damping": damping}
