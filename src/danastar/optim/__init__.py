"""danastar.optim: the ADana family of optimizers, the baselines, the registry and LR schedules.

    from danastar.optim import ADana, build_optimizer, param_groups
    optimizer = ADana(param_groups(model), lr=3e-4, omega=4.0, total_steps=T)   # or
    optimizer = build_optimizer("dana-star-mk4", model.named_parameters(), lr=3e-4)
    optimizer.extend_to(T2)   # a longer run (the LR: extended_schedule); docs/optimizers.md
"""

from .adamw import AdamW, AdamWDecayingWD
from .adana import ADana
from .ademamix import AdEMAMix
from .dana_star import DanaStar
from .extension import extend_optimizer
from .muon import MuonWithAdamW
from .registry import OPTIMIZERS, build_optimizer
from .schedules import apply_schedule, extended_schedule, get_schedule
from .weight_decay import ShortRunWeightDecayWarning, log_time_weight_decay, param_groups

__all__ = [
    "ADana", "DanaStar", "AdamW", "AdamWDecayingWD", "AdEMAMix", "MuonWithAdamW", "OPTIMIZERS",
    "build_optimizer", "get_schedule", "apply_schedule", "param_groups", "log_time_weight_decay",
    "ShortRunWeightDecayWarning", "extended_schedule", "extend_optimizer",
]
