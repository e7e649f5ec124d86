"""AdamW with the independent, decaying weight decay of the DANA family.

Standard Adam moments with bias correction, then (after the update) the weight decay
p <- p * (1 - weight_decay * s_t [/ (1 + k / wd_ts)]), scaled by the schedule but not by the LR.
Plain AdamW with coupled weight decay is torch.optim.AdamW; `AdamW` here is the same update
for what torch's cannot do: bf16 state with stochastic rounding (``build_optimizer("adamw",
..., state_dtype=torch.bfloat16)`` builds it).
"""

from __future__ import annotations

import torch

from danastar.hparams import check, check_betas, check_non_negative, check_positive_or_none

from .base import DEFAULT_LR, PerTensorOptimizer
from .group_scalars import decay_multiplier
from .scalar_math import divide, sqrt
from .weight_decay import (
    check_constant_decay,
    paper_call,
    resolve_weight_decay,
    warn_if_too_short,
)
from .working import working_copy, write_back


def adamw_decaying_wd_scalars(k, lr, schedule_factor, *, betas, weight_decay, wd_ts):
    """Per-step scalars: the step size lr / bc1, sqrt(bc2) and the weight-decay multiplier."""
    beta1, beta2 = betas
    return {"step_size": divide(lr, 1 - beta1 ** k), "sqrt_bc2": sqrt(1 - beta2 ** k),
            "decay": decay_multiplier(weight_decay, schedule_factor, k, wd_ts)}


def adamw_decaying_wd_update(param, grad, m, v, *, step_size, sqrt_bc2, decay, betas, eps):
    """One step on one tensor (reference and compiled paths)."""
    beta1, beta2 = betas
    work = working_copy(param, m)
    grad = grad.to(m.dtype)
    m.lerp_(grad, 1 - beta1)
    v.mul_(beta2).add_(grad * grad * (1 - beta2))
    work.sub_(step_size * m / (v.sqrt() / sqrt_bc2 + eps))
    work.mul_(decay)
    write_back(param, work)


class AdamWDecayingWD(PerTensorOptimizer):
    """AdamW whose weight decay is independent of the LR and decays as 1 / (1 + k / wd_ts).

    Args:
        params: tensors, or param-group dicts (each may override any setting below).
        lr: peak learning rate γ*; the schedule scales it through ``group["lr"]``.
        betas: (β1, β2), the EMA coefficients of the gradient and of its square, each in [0, 1).
        eps: added to sqrt(v̂) in the denominator.
        weight_decay: λ of the decay p ← p · (1 − λ · s_t [/ (1 + k / wd_ts)]), where s_t is
            the schedule factor (current LR / peak LR); not multiplied by the LR. A constant λ
            that would remove more than 5% of a weight in 100 steps is refused, as for ADana.
        wd_ts: time scale of the decay of λ in steps (the paper uses T/10); None keeps λ constant.
        omega, total_steps: the paper's form instead of ``weight_decay`` and ``wd_ts``, as for
            :class:`ADana`.
        impl: "reference", "compiled" or None (automatic), as for :class:`ADana`.
        state_dtype, stochastic_rounding, flat, capturable: as for :class:`ADana`.
    """

    buffer_names = ("exp_avg", "exp_avg_sq")
    step_scalars = staticmethod(adamw_decaying_wd_scalars)
    scalar_constants = ("betas", "weight_decay", "wd_ts")
    update = staticmethod(adamw_decaying_wd_update)
    update_constants = ("betas", "eps")

    def __init__(self, params, lr=DEFAULT_LR, *, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 wd_ts=None, omega=None, total_steps=None, impl=None,
                 state_dtype=torch.float32, stochastic_rounding=False, flat=False,
                 capturable=False):
        owner = type(self).__name__
        params, weight_decay, wd_ts = resolve_weight_decay(
            owner, paper_call(owner), params, weight_decay, wd_ts, omega, total_steps)
        check(len(betas) == 2, f"betas must be (beta1, beta2), got {betas}")
        check_betas(betas)
        check_non_negative(eps=eps, weight_decay=weight_decay)
        check_positive_or_none(wd_ts=wd_ts)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        wd_ts=wd_ts)
        super().__init__(params, defaults, impl, state_dtype, stochastic_rounding,
                         flat, capturable)
        warn_if_too_short(self.param_groups, omega is not None)

    def check_param_group(self, group: dict) -> None:
        owner = type(self).__name__
        check_constant_decay(owner, paper_call(owner), group)


def adamw_scalars(k, lr, schedule_factor, *, betas, weight_decay):
    """Per-step scalars of torch's AdamW: lr / bc1, sqrt(bc2) and the coupled decay 1 - lr wd."""
    beta1, beta2 = betas
    return {"step_size": divide(lr, 1 - beta1 ** k), "sqrt_bc2": sqrt(1 - beta2 ** k),
            "decay": 1 - lr * weight_decay}


def adamw_update(param, grad, m, v, *, step_size, sqrt_bc2, decay, betas, eps):
    """torch.optim.AdamW's step on one tensor: the decay first, then the Adam update."""
    beta1, beta2 = betas
    work = working_copy(param, m)
    grad = grad.to(m.dtype)
    work.mul_(decay)
    m.lerp_(grad, 1 - beta1)
    v.mul_(beta2).add_(grad * grad * (1 - beta2))
    work.sub_(step_size * m / (v.sqrt() / sqrt_bc2 + eps))
    write_back(param, work)


class AdamW(PerTensorOptimizer):
    """torch.optim.AdamW's update (coupled weight decay p <- p (1 - lr wd), bias-corrected
    moments) with danastar's state options: ``state_dtype=torch.bfloat16`` keeps m and v in
    bf16 with stochastic rounding, ``stochastic_rounding=True`` rounds bf16 parameters so too.
    For float32 state use torch.optim.AdamW (fused), which `build_optimizer` picks then.

    Args:
        params, lr, betas, eps, weight_decay: as torch.optim.AdamW (default weight_decay 0.01).
        impl: "reference", "compiled" or None (automatic), as for :class:`ADana`.
        state_dtype, stochastic_rounding, flat, capturable: as for :class:`ADana`.
    """

    buffer_names = ("exp_avg", "exp_avg_sq")
    step_scalars = staticmethod(adamw_scalars)
    scalar_constants = ("betas", "weight_decay")
    update = staticmethod(adamw_update)
    update_constants = ("betas", "eps")

    def __init__(self, params, lr=DEFAULT_LR, *, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2, impl=None, state_dtype=torch.float32,
                 stochastic_rounding=False, flat=False, capturable=False):
        check(len(betas) == 2, f"betas must be (beta1, beta2), got {betas}")
        check_betas(betas)
        check_non_negative(eps=eps, weight_decay=weight_decay)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults, impl, state_dtype, stochastic_rounding,
                         flat, capturable)
