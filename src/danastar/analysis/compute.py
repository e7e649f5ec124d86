"""Training compute: C = 6 · N_ne · D in FLOPs and petaflop-hours.

N_ne is the LR laws' convention 12·d²·L for Enoki (exact for it) and the model's exact
non-embedding count for Qwen3, whose gated attention and SwiGLU do not follow 12·d²·L.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FLOP_PER_PFH = 3.6e18  # one petaflop/s sustained for an hour
TOKENS_PER_PARAM = 20  # Chinchilla


def flops(non_embedding: float, tokens: float) -> float:
    """C = 6 · N_ne · tokens (forward + backward)."""
    return 6.0 * float(non_embedding) * float(tokens)


def pfh(flop: float) -> float:
    """FLOPs in petaflop-hours."""
    return float(flop) / FLOP_PER_PFH


def chinchilla_flops(non_embedding: float, total: float) -> float:
    """Compute of a whole Chinchilla run: 6 · N_ne · 20 · N_total."""
    return flops(non_embedding, TOKENS_PER_PARAM * float(total))


def compute_non_embedding(plan: Mapping[str, Any]) -> int:
    """The N_ne that compute uses for a run's plan (see the module docstring); for a mixture
    of experts, the parameters a token is multiplied by (the active ones), not all experts."""
    if plan.get("active_non_embedding_params") is not None:
        if plan.get("arch") == "enoki":
            return int(plan["active_non_embedding_params"])
        return int(plan.get("exact_active_non_embedding_params")
                   or plan["active_non_embedding_params"])
    if plan.get("arch") == "enoki":
        return int(plan["non_embedding_params"])
    return int(plan.get("exact_non_embedding_params") or plan["non_embedding_params"])
