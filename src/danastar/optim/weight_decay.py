"""The independent weight decay as users set it: the paper's form (ω and the run's length), the
explicit form (``weight_decay``, ``wd_ts``), the refusal of a constant decay that an AdamW habit
would make destructive, the warning when a run is too short for its decay, and which
parameters decay (`param_groups`).

The decay multiplies a parameter by ``1 − λ·s_t / (1 + k/wd_ts)`` at every step, clamped to
[0, 1] (`danastar.hparams.decay_multiplier`, shared with danastar.optax): scaled by the
schedule factor s_t but **not** by the LR, unlike AdamW's coupled ``p ← p − lr·λ·p``. So
AdamW's habit ``weight_decay=0.1`` here, with no ``wd_ts``, would multiply every weight by 0.9
at every step.
"""

from __future__ import annotations

import torch
from torch import nn

from danastar.hparams import (
    EARLY_STEPS,
    FIX_EXPLICIT_FORM,
    FIX_PAPER_FORM,
    MAX_EARLY_DECAY,
    PAPER_OMEGA,
    SHORT_RUN_MAX_SHARE,
    SHORT_RUN_STEPS,
    WD_TS_DIVISOR,
    ShortRunWeightDecayWarning,
    check_paper_form,
    early_decay_share,
    fraction_kept,
    largest_constant_weight_decay,
    warn_short_run,
)
from danastar.hparams import paper_weight_decay as log_time_weight_decay

# The numbers and formulas of the decay live in danastar.hparams (danastar.optax shares them);
# this module holds what the torch optimizers do with them, and which parameters decay.
__all__ = [
    "EARLY_STEPS", "MAX_EARLY_DECAY", "PAPER_OMEGA", "SHORT_RUN_MAX_SHARE", "SHORT_RUN_STEPS",
    "WD_TS_DIVISOR", "ShortRunWeightDecayWarning", "check_constant_decay", "early_decay_share",
    "fraction_kept", "is_norm", "largest_constant_weight_decay", "log_time_weight_decay",
    "paper_call", "param_groups", "resolve_weight_decay", "warn_if_too_short", "warn_short_run",
]


def warn_if_too_short(groups: list[dict], paper_form: bool) -> str | None:
    """Warn once (ShortRunWeightDecayWarning) when the log-time decay of some group removes more
    than SHORT_RUN_MAX_SHARE of a weight in its first SHORT_RUN_STEPS steps (a run too short for
    it), naming the fix in the form the constructor was given (``paper_form``: omega and
    total_steps); called at the end of each constructor with that decay."""
    return warn_short_run(groups, FIX_PAPER_FORM if paper_form else FIX_EXPLICIT_FORM)


def check_constant_decay(owner: str, call: str, group: dict) -> None:
    """Refuse a param group whose constant decay removes more than MAX_EARLY_DECAY of a weight
    over its first EARLY_STEPS steps (``owner`` names the optimizer, ``call`` is the paper's
    form of its constructor)."""
    weight_decay, wd_ts = group["weight_decay"], group["wd_ts"]
    if wd_ts is not None or weight_decay == 0:
        return
    removed = 1 - fraction_kept(weight_decay, None)
    if removed > MAX_EARLY_DECAY:
        amount = "all" if removed == 1 else f"{removed:.3%}" if removed > 0.999 else \
            f"{removed:.1%}"
        raise ValueError(
            f"{owner}: weight_decay={weight_decay:g} with wd_ts=None multiplies every weight by "
            f"1 − {weight_decay:g}·s_t at every step, not scaled by the LR as AdamW's is, and "
            f"would remove {amount} of it in {EARLY_STEPS} steps; use the paper's form "
            f"{call} (T the run's length in optimizer steps), give the decay a time scale "
            f"(weight_decay={weight_decay:g}, wd_ts=T // {WD_TS_DIVISOR}), or keep a constant "
            f"weight_decay at most {largest_constant_weight_decay():.1e}")


def paper_call(owner: str, extra: str = "") -> str:
    """The paper's form of ``owner``'s constructor, as the refusals show it."""
    return f"{owner}(params, lr=..., {extra}omega=4.0, total_steps=T)"


def resolve_weight_decay(owner: str, call: str, params, weight_decay: float,
                         wd_ts: int | None, omega: float | None, total_steps: int | None):
    """``(params, weight_decay, wd_ts)`` from either form a constructor takes: the paper's
    (``omega`` and ``total_steps``, `log_time_weight_decay`) or the explicit one. Giving both,
    or half the paper's, is refused with the right call (``call``) shown. With the paper's form
    a param group may turn the decay off (``weight_decay=0``) but not set a decay or time scale
    of its own (``params`` comes back as a list then, having been read)."""
    if omega is None and total_steps is None:
        return params, weight_decay, wd_ts
    if total_steps is None:
        raise ValueError(f"{owner}: omega needs total_steps as well: {call}, with T the run's "
                         "length in optimizer steps")
    if omega is None:  # total_steps alone: the paper's omega
        omega = PAPER_OMEGA
    if weight_decay != 0 or wd_ts is not None:
        raise ValueError(f"{owner}: give the weight decay either as omega and total_steps, "
                         f"{call}, or explicitly, {owner}(params, lr=..., weight_decay=..., "
                         "wd_ts=...), not both")
    check_paper_form(omega, total_steps)
    if not torch.is_tensor(params):  # a lone tensor is left for torch to refuse
        params = list(params)
        for group in params:
            if isinstance(group, dict) and (group.get("weight_decay", 0) != 0
                                            or group.get("wd_ts") is not None):
                raise ValueError(
                    f"{owner}: a param group sets its own weight_decay or wd_ts while the "
                    "constructor has omega and total_steps; leave them out of the group (or "
                    f"set weight_decay=0 to turn the decay off there) and call {call}")
    weight_decay, wd_ts = log_time_weight_decay(omega, int(total_steps))
    return params, weight_decay, wd_ts


# Normalisation layers of torch; any module whose class name ends in "Norm" (RMSNorm of a
# model library, LlamaRMSNorm, T5LayerNorm ...) counts as one too.
NORMS = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.LocalResponseNorm,
         nn.modules.batchnorm._NormBase)
EMBEDDINGS = (nn.Embedding, nn.EmbeddingBag)


def is_norm(module: nn.Module) -> bool:
    return isinstance(module, NORMS) or type(module).__name__.endswith("Norm")


def param_groups(model: nn.Module, weight_decay: float | None = None) -> list[dict]:
    """Parameter groups for any ``nn.Module``: the parameters that decay, then those that
    don't (``"weight_decay": 0.0``). Each group has a ``"names"`` list parallel to
    ``"params"`` (the qualified names, which the ``muon`` route of `build_optimizer` reads).

    The rule: no decay on embeddings (parameters of ``nn.Embedding``/``nn.EmbeddingBag``,
    including an output head tied to one), on normalisation layers (torch's, and any module
    whose class name ends in ``Norm``), or on any parameter with fewer than 2 dimensions
    (biases, gains, scalars); every other parameter — the weight matrices of linear and
    convolution layers, stacked expert matrices — decays. Frozen parameters
    (``requires_grad=False``) are left out; an empty group is left out.

    ``weight_decay``: the decaying group's; None leaves it to the optimizer (for example the
    paper's form, ``ADana(param_groups(model), lr=..., omega=4.0, total_steps=T)``).
    """
    exempt = set()
    for module in model.modules():
        if isinstance(module, EMBEDDINGS) or is_norm(module):
            exempt.update(id(param) for param in module.parameters(recurse=False))
    decay = {"params": [], "names": []}
    if weight_decay is not None:
        decay["weight_decay"] = weight_decay
    no_decay = {"params": [], "names": [], "weight_decay": 0.0}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        group = no_decay if id(param) in exempt or param.ndim < 2 else decay
        group["params"].append(param)
        group["names"].append(name)
    return [group for group in (decay, no_decay) if group["params"]]
