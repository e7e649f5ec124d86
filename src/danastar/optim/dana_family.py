"""What the DANA family (ADana, Dana-MK4, Dana-Star, Dana-Star-MK4) shares: the defaults of its
hyperparameters and their checks, the log-time moment update, and the diagnostics."""

from __future__ import annotations

import torch

from danastar.hparams import (
    DEFAULT_CLIPSNR,
    DEFAULT_DELTA,
    DEFAULT_KAPPA,
    check_dana,
    check_non_negative,
    check_positive_or_none,
)

from .base import DEFAULT_LR, PerTensorOptimizer, check_lr
from .dtensors import is_dtensor
from .weight_decay import (
    check_constant_decay,
    paper_call,
    resolve_weight_decay,
    warn_if_too_short,
)

__all__ = ["DEFAULT_CLIPSNR", "DEFAULT_DELTA", "DEFAULT_KAPPA", "DanaBase"]


def check_dana_hyperparameters(lr, delta, kappa, clipsnr, weight_decay, wd_ts, eps):
    check_lr(lr)
    check_dana(delta, kappa, clipsnr, eps)
    check_non_negative(weight_decay=weight_decay)
    check_positive_or_none(wd_ts=wd_ts)


def _total(tensor: torch.Tensor) -> float:
    """Sum of all elements as a float; for a DTensor, over every rank's shard."""
    total = tensor.sum(dtype=torch.float64)
    return float(total.full_tensor() if is_dtensor(total) else total)


class DanaBase(PerTensorOptimizer):
    """What ADana and DanaStar share: hyperparameters, validation and diagnostics."""

    update_constants = ("clipsnr", "eps")
    float32_scalars = True  # the kernel's 1 - a_k is at least 1 / (1 + delta), 1/9 by default

    def __init__(self, params, lr=DEFAULT_LR, *, delta=DEFAULT_DELTA, kappa=DEFAULT_KAPPA,
                 clipsnr=None, weight_decay=0.0, wd_ts=None, omega=None, total_steps=None,
                 eps=1e-8, impl=None, state_dtype=torch.float32, stochastic_rounding=False,
                 flat=False, capturable=False):
        owner = type(self).__name__
        params, weight_decay, wd_ts = resolve_weight_decay(
            owner, paper_call(owner), params, weight_decay, wd_ts, omega, total_steps)
        check_dana_hyperparameters(lr, delta, kappa, clipsnr, weight_decay, wd_ts, eps)
        # The paper's form is stored as what it derives (weight_decay, wd_ts), so state_dict and
        # load_state_dict carry it like the explicit form.
        defaults = dict(lr=lr, delta=delta, kappa=kappa, clipsnr=clipsnr,
                        weight_decay=weight_decay, wd_ts=wd_ts, eps=eps)
        super().__init__(params, defaults, impl, state_dtype, stochastic_rounding,
                         flat, capturable)
        warn_if_too_short(self.param_groups, omega is not None)

    def check_param_group(self, group: dict) -> None:
        owner = type(self).__name__
        check_constant_decay(owner, paper_call(owner), group)

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
                state = {name: value.float() if torch.is_tensor(value)  # bf16 state
                         and value.dtype == torch.bfloat16 else value
                         for name, value in state.items()}
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
