"""AdamW with the independent, decaying weight decay of the DANA family.

Standard Adam moments with bias correction, then (after the update) the weight decay
p <- p * (1 - weight_decay * s_t [/ (1 + k / wd_ts)]), scaled by the schedule but not by the LR.
Plain AdamW with coupled weight decay is torch.optim.AdamW.
"""

from __future__ import annotations

import math

from ._kernel import PerTensorOptimizer, check, decay_multiplier


def adamw_decaying_wd_scalars(k, lr, schedule_factor, *, betas, weight_decay, wd_ts):
    """Per-step scalars: the step size lr / bc1, sqrt(bc2) and the weight-decay multiplier."""
    beta1, beta2 = betas
    return {"step_size": lr / (1 - beta1 ** k), "sqrt_bc2": math.sqrt(1 - beta2 ** k),
            "decay": decay_multiplier(weight_decay, schedule_factor, k, wd_ts)}


def adamw_decaying_wd_update(param, grad, m, v, *, step_size, sqrt_bc2, decay, betas, eps):
    """One step on one tensor (reference and compiled paths)."""
    beta1, beta2 = betas
    work = param if param.dtype == m.dtype else param.to(m.dtype)
    grad = grad.to(m.dtype)
    m.lerp_(grad, 1 - beta1)
    v.mul_(beta2).add_(grad * grad * (1 - beta2))
    work.sub_(step_size * m / (v.sqrt() / sqrt_bc2 + eps))
    work.mul_(decay)
    if work is not param:
        param.copy_(work)


def check_betas(betas) -> None:
    check(all(0 <= beta < 1 for beta in betas), f"betas must each be in [0, 1), got {betas}")


class AdamWDecayingWD(PerTensorOptimizer):
    """AdamW whose weight decay is independent of the LR and decays as 1 / (1 + k / wd_ts)."""

    buffer_names = ("exp_avg", "exp_avg_sq")
    step_scalars = staticmethod(adamw_decaying_wd_scalars)
    scalar_constants = ("betas", "weight_decay", "wd_ts")
    update = staticmethod(adamw_decaying_wd_update)
    update_constants = ("betas", "eps")

    def __init__(self, params, lr, *, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 wd_ts=None, impl=None):
        check(len(betas) == 2, f"betas must be (beta1, beta2), got {betas}")
        check_betas(betas)
        check(eps >= 0, f"eps must be >= 0, got {eps}")
        check(weight_decay >= 0, f"weight_decay must be >= 0, got {weight_decay}")
        check(wd_ts is None or wd_ts > 0, f"wd_ts must be None or > 0, got {wd_ts}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        wd_ts=wd_ts)
        super().__init__(params, defaults, impl)
