"""The per-step numbers a group's settings give every optimizer: the schedule factor s_t (current
LR over peak LR) and the independent weight decay's multiplier, on the host or, for capturable
steps, on the device."""

from __future__ import annotations

import torch

from danastar import hparams

from .scalar_math import divide


def decay_multiplier(weight_decay, schedule_factor, k, wd_ts):
    """Independent, decaying weight decay: the factor that multiplies the parameter, in [0, 1]
    (`danastar.hparams.decay_multiplier`, its one formula), with the capturable path's
    divisions rounded once (module scalar_math)."""
    return hparams.decay_multiplier(weight_decay, schedule_factor, k, wd_ts, divide)


def schedule_factor(group: dict) -> float:
    """s_t = current LR / peak LR of the group (0 when the group was built with lr 0)."""
    initial_lr = float(group["initial_lr"])
    return float(group["lr"]) / initial_lr if initial_lr != 0 else 0.0


def device_schedule_factor(group: dict):
    """`schedule_factor` without reading a tensor LR on the host: a 0-dim float64 tensor where
    ``lr`` or ``initial_lr`` is a tensor (the same value: both are widened before dividing),
    else the float (then a constant of a captured graph)."""
    lr, initial_lr = group["lr"], group["initial_lr"]
    if not torch.is_tensor(lr) and not torch.is_tensor(initial_lr):
        return schedule_factor(group)
    lr = lr.to(torch.float64) if torch.is_tensor(lr) else float(lr)
    if not torch.is_tensor(initial_lr):
        return lr / initial_lr if initial_lr != 0 else torch.zeros_like(lr)
    initial_lr = initial_lr.to(torch.float64)
    return torch.where(initial_lr != 0, divide(lr, initial_lr), 0.0)
