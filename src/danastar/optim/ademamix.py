"""AdEMAMix: Adam with a second, slow momentum m2 mixed in with weight alpha.

Both warm-ups are optional: alpha grows linearly to its value over ``alpha_warmup`` steps, and
beta3 grows linearly in half-life space over ``beta3_warmup`` steps. With ``decaying_wd`` the
weight decay is the DANA family's independent, decaying one (applied before the update);
otherwise it is AdamW's coupled p <- p - lr * weight_decay * p.
"""

from __future__ import annotations

import math

import torch

from danastar.hparams import check, check_betas, check_non_negative, check_positive_or_none

from .base import DEFAULT_LR, PerTensorOptimizer
from .group_scalars import decay_multiplier
from .scalar_math import divide, minimum, sqrt
from .weight_decay import (
    check_constant_decay,
    paper_call,
    resolve_weight_decay,
    warn_if_too_short,
)
from .working import working_copy, write_back


def half_life(beta: float) -> float:
    """Steps for an EMA with coefficient beta to halve a contribution, minus one."""
    return math.log(0.5) / math.log(beta + 1e-8) - 1


def warming_beta3(k, beta1, beta3, beta3_warmup):
    """beta3 at step k of its warm-up: linear in half-life from beta1's to beta3's."""
    fraction = k / beta3_warmup
    half_life_k = (1 - fraction) * half_life(beta1) + fraction * half_life(beta3)
    return 0.5 ** divide(1, half_life_k + 1)


def ademamix_scalars(k, lr, schedule_factor, *, betas, alpha, alpha_warmup, beta3_warmup,
                     weight_decay, wd_ts, decaying_wd):
    """Per-step scalars: warmed-up alpha and beta3, bias corrections, LR and weight decay (k a
    number, or a tensor of counts: capturable, where each count picks its warm-up branch on the
    device)."""
    beta1, beta2, beta3 = betas
    if alpha_warmup is not None:
        alpha = alpha * minimum(k / alpha_warmup, 1.0)
    if beta3_warmup is not None and torch.is_tensor(k):
        beta3 = torch.where(k < beta3_warmup, warming_beta3(k, beta1, beta3, beta3_warmup), beta3)
    elif beta3_warmup is not None and k < beta3_warmup:
        beta3 = warming_beta3(k, beta1, beta3, beta3_warmup)
    # Decaying: p * (1 - wd s_t / (1 + k / wd_ts)) before the update; coupled: p - lr wd p.
    decay = decay_multiplier(weight_decay, schedule_factor, k, wd_ts) if decaying_wd else 1.0
    coupled_decay = 0.0 if decaying_wd else weight_decay
    return {"alpha": alpha, "beta3": beta3, "bc1": 1 - beta1 ** k,
            "sqrt_bc2": sqrt(1 - beta2 ** k), "lr": lr, "decay": decay,
            "coupled_decay": coupled_decay}


def ademamix_update(param, grad, m1, m2, v, *, alpha, beta3, bc1, sqrt_bc2, lr, decay,
                    coupled_decay, betas, eps):
    """One step on one tensor (reference and compiled paths)."""
    beta1, beta2, _ = betas
    work = working_copy(param, m1)
    grad = grad.to(m1.dtype)
    work.mul_(decay)
    m1.lerp_(grad, 1 - beta1)
    m2.lerp_(grad, 1 - beta3)
    v.mul_(beta2).add_(grad * grad * (1 - beta2))
    direction = (m1 / bc1 + alpha * m2) / (v.sqrt() / sqrt_bc2 + eps)
    work.sub_(lr * (direction + coupled_decay * work))
    write_back(param, work)


class AdEMAMix(PerTensorOptimizer):
    """AdEMAMix (arXiv 2409.03137), optionally with the decaying, independent weight decay.

    Args:
        params: tensors, or param-group dicts (each may override any setting below).
        lr: peak learning rate γ*; the schedule scales it through ``group["lr"]``.
        betas: (β1, β2, β3): the fast EMA of the gradient, the EMA of its square, and the slow
            EMA m2, each in [0, 1).
        alpha: weight of the slow EMA in the update (m̂1 + α·m2) / (sqrt(v̂) + eps).
        alpha_warmup: steps over which α grows linearly from 0; None: no warm-up.
        beta3_warmup: steps over which β3 grows (linearly in half-life) from β1; None: no warm-up.
        eps: added to sqrt(v̂) in the denominator.
        weight_decay: λ. Coupled (AdamW's p ← p − lr·λ·p) unless ``decaying_wd``.
        wd_ts: with ``decaying_wd``, the time scale of the decay of λ in steps; None: constant.
        decaying_wd: use the DANA family's independent decay p ← p · (1 − λ·s_t [/ (1 + k/wd_ts)])
            (s_t the schedule factor), applied before the update; a constant λ that would
            remove more than 5% of a weight in 100 steps is refused, as for ADana.
        omega, total_steps: with ``decaying_wd``, the paper's form instead of ``weight_decay``
            and ``wd_ts``, as for :class:`ADana`.
        impl: "reference", "compiled" or None (automatic), as for :class:`ADana`.
        state_dtype, stochastic_rounding, flat, capturable: as for :class:`ADana`.
    """

    buffer_names = ("exp_avg_fast", "exp_avg_slow", "exp_avg_sq")
    step_scalars = staticmethod(ademamix_scalars)
    scalar_constants = ("betas", "alpha", "alpha_warmup", "beta3_warmup", "weight_decay",
                        "wd_ts", "decaying_wd")
    update = staticmethod(ademamix_update)
    update_constants = ("betas", "eps")

    def __init__(self, params, lr=DEFAULT_LR, *, betas=(0.9, 0.999, 0.9999), alpha=5.0,
                 alpha_warmup=None, beta3_warmup=None, eps=1e-8, weight_decay=0.0, wd_ts=None,
                 decaying_wd=False, omega=None, total_steps=None, impl=None,
                 state_dtype=torch.float32, stochastic_rounding=False, flat=False,
                 capturable=False):
        call = paper_call("AdEMAMix", "decaying_wd=True, ")
        if not decaying_wd and (omega is not None or total_steps is not None):
            raise ValueError(f"AdEMAMix: omega and total_steps set the decaying weight decay, so "
                             f"they need decaying_wd=True: {call}; the coupled decay "
                             "(decaying_wd=False) is weight_decay alone")
        params, weight_decay, wd_ts = resolve_weight_decay(
            "AdEMAMix", call, params, weight_decay, wd_ts, omega, total_steps)
        check(len(betas) == 3, f"betas must be (beta1, beta2, beta3), got {betas}")
        check_betas(betas)
        check_non_negative(alpha=alpha)
        check_positive_or_none(alpha_warmup=alpha_warmup, beta3_warmup=beta3_warmup)
        check_non_negative(eps=eps, weight_decay=weight_decay)
        check_positive_or_none(wd_ts=wd_ts)
        defaults = dict(lr=lr, betas=tuple(betas), alpha=alpha, alpha_warmup=alpha_warmup,
                        beta3_warmup=beta3_warmup, eps=eps, weight_decay=weight_decay,
                        wd_ts=wd_ts, decaying_wd=bool(decaying_wd))
        super().__init__(params, defaults, impl, state_dtype, stochastic_rounding,
                         flat, capturable)
        warn_if_too_short([g for g in self.param_groups if g["decaying_wd"]],
                          omega is not None)

    def check_param_group(self, group: dict) -> None:
        if group["decaying_wd"]:  # the coupled decay is AdamW's, scaled by the LR
            check_constant_decay("AdEMAMix", paper_call("AdEMAMix", "decaying_wd=True, "),
                                 group)
