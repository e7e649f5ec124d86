"""danastar.optim: the ADana family of optimizers, the baselines, the registry and LR schedules.

    from danastar.optim import ADana, build_optimizer
    optimizer = ADana(model.parameters(), lr=3e-4)                 # or
    optimizer = build_optimizer("dana-star-mk4", model.named_parameters(), lr=3e-4)
"""

from .adamw import AdamWDecayingWD
from .adana import ADana
from .ademamix import AdEMAMix
from .dana_star import DanaStar
from .muon import MuonWithAdamW
from .registry import OPTIMIZERS, build_optimizer
from .schedules import apply_schedule, get_schedule

__all__ = [
    "ADana", "DanaStar", "AdamWDecayingWD", "AdEMAMix", "MuonWithAdamW", "OPTIMIZERS",
    "build_optimizer", "get_schedule", "apply_schedule",
]
