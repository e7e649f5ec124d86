"""danastar.optax: ADana, Dana-MK4, Dana-Star and Dana-Star-MK4 for JAX, as optax
transformations equal to danastar.optim's torch optimizers step for step.

    import optax
    from danastar.optax import dana_star_mk4
    optimizer = dana_star_mk4(3e-4, schedule=optax.warmup_cosine_decay_schedule(0.01, 1.0, 100, T),
                              omega=4.0, total_steps=T)

The aliases chain three pieces that can be used alone: `scale_by_adana` / `scale_by_dana_star`
(the direction), ``optax.scale_by_learning_rate`` and `log_time_weight_decay`. Needs the ``jax``
extra (``pip install 'danastar[jax]'``), or, without torch, ``pip install danastar-optax``: this
package and danastar.hparams alone. It imports nothing else of danastar, and nothing else of
danastar imports it.
"""

try:
    import jax  # noqa: F401
    import optax  # noqa: F401
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        f"danastar.optax needs the 'jax' extra ({error.name} is missing): "
        "pip install 'danastar[jax]'", name=error.name) from None

from danastar.hparams import ShortRunWeightDecayWarning

from .alias import adana, dana_mk4, dana_star, dana_star_mk4
from .extension import (
    extended_weight_decay,
    reanchor_schedule,
    rewarm_schedule,
    stretch_schedule,
)
from .masks import decay_mask
from .transforms import (
    CONVENTIONS,
    ScaleByAdanaState,
    ScaleByDanaStarState,
    scale_by_adana,
    scale_by_dana_star,
)
from .weight_decay import LogTimeWeightDecayState, log_time_weight_decay, paper_weight_decay

# The registry names of danastar.optim (``--opt``) and their optax aliases.
OPTIMIZERS = {"adana": adana, "dana-mk4": dana_mk4, "dana-star": dana_star,
              "dana-star-mk4": dana_star_mk4}

__all__ = [
    "adana", "dana_mk4", "dana_star", "dana_star_mk4", "OPTIMIZERS", "CONVENTIONS",
    "scale_by_adana", "scale_by_dana_star", "ScaleByAdanaState", "ScaleByDanaStarState",
    "log_time_weight_decay", "LogTimeWeightDecayState", "paper_weight_decay",
    "ShortRunWeightDecayWarning",
    "decay_mask",
    "stretch_schedule", "reanchor_schedule", "rewarm_schedule", "extended_weight_decay",
]
