"""Which optimizer a saved state dict comes from, told by the keys its param groups and its
per-parameter state hold, so that loading another optimizer's state is refused when it is
loaded (with one sentence naming both) rather than failing, or computing with the wrong
buffers, at a later step.

torch's ``Optimizer.load_state_dict`` takes any state dict with as many groups and parameters:
the saved groups replace the optimizer's own, hyperparameters included, so that a DanaStar
state loaded into ADana, or torch AdamW's, is only found out by the ``KeyError`` of a step.
"""

from __future__ import annotations

from collections.abc import Iterable

# The hyperparameters by which each kind of state is known (first match wins), and the buffers
# one of danastar's optimizers keeps per parameter besides its step count.
DANA_KEYS = frozenset({"delta", "kappa"})
ADEMAMIX_KEYS = frozenset({"alpha", "decaying_wd"})


def saved_keys(state_dict: dict) -> tuple[set[str], set[str]]:
    """The keys of the saved param groups (``params`` left out) and of the per-parameter
    states, each over all groups and parameters."""
    group_keys = {key for group in state_dict.get("param_groups", []) for key in group
                  if key != "params"}
    state_keys = {key for state in state_dict.get("state", {}).values() for key in state}
    return group_keys, state_keys


def origins(group_keys: set[str], state_keys: set[str], groups: Iterable[dict]) -> set[str]:
    """The optimizers a state with these keys may come from: one class name, or two when the
    keys cannot tell them apart (ADana and DanaStar before their first step), or a description
    of an optimizer that is none of danastar's."""
    if DANA_KEYS <= group_keys:
        if not state_keys:
            return {"ADana", "DanaStar"}
        return {"DanaStar" if "tau" in state_keys else "ADana"}
    if ADEMAMIX_KEYS <= group_keys:
        return {"AdEMAMix"}
    if {"betas", "wd_ts"} <= group_keys:
        return {"AdamWDecayingWD"}
    if {"ns_coefficients", "ns_steps"} <= group_keys:  # torch's Muon, alone or with AdamW
        return {"MuonWithAdamW"} if "betas" in group_keys else {"MuonWithAdamW",
                                                                "torch.optim.Muon"}
    if {"betas", "amsgrad"} <= group_keys:  # torch's Adam family
        decoupled = any(group.get("decoupled_weight_decay") for group in groups)
        return {"torch.optim.AdamW" if decoupled else "torch.optim.Adam"}
    if "betas" in group_keys and "state_dtype" in group_keys:
        return {"AdamW"}
    if {"momentum", "dampening", "nesterov"} <= group_keys:
        return {"torch.optim.SGD"}
    shown = ", ".join(sorted(group_keys)) or "nothing"
    return {f"another optimizer (its param groups hold {shown})"}


def foreign_state_refusal(owner: str, buffer_names: tuple[str, ...],
                          state_dict: dict) -> str | None:
    """The sentence refusing ``state_dict`` for the optimizer class ``owner`` (whose
    per-parameter state is ``step`` and ``buffer_names``), or None when it is owner's own: the
    same kind of optimizer by its hyperparameters, with no other per-parameter state."""
    group_keys, state_keys = saved_keys(state_dict)
    found = origins(group_keys, state_keys, state_dict.get("param_groups", []))
    own_keys = {"step", *buffer_names}
    if owner in found and state_keys <= own_keys:
        return None
    origin = " or ".join(sorted(found)) if owner not in found else \
        f"an optimizer like {owner} with other buffers"
    state = ", ".join(sorted(state_keys)) or "no state yet"
    return (f"{owner}.load_state_dict: this state dict comes from {origin} (per-parameter "
            f"state: {state}), not from {owner}, whose state is {', '.join(sorted(own_keys))}; "
            f"load it into the optimizer that saved it, or give {owner} a state dict it saved")
