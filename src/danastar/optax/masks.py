"""Which parameters decay: the rule of `danastar.optim.param_groups` for a JAX pytree.

The torch rule reads module types: no decay on embeddings, on normalisation layers, or on any
parameter with fewer than 2 dimensions; every other parameter decays. A pytree of JAX arrays has
no module types, only the keys on the path to each leaf, so `decay_mask` reads those: the
names that flax, haiku, equinox and GPT-style code give embeddings and norms. A mask of
`ndim >= 2` alone would decay embedding tables (2-D), which danastar's models never do.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import jax

# A path key names an embedding when it contains "emb" (flax's Embed_0/embedding, haiku's
# embed/embeddings, tok_emb, pos_embedding) or is GPT-2's wte/wpe; a normalisation layer when,
# with any trailing digits and underscores dropped, it ends in "norm" (LayerNorm_0, RMSNorm,
# norm1, layer_norm, final_norm) or is GPT-2's ln_1, ln_2, ln_f (any "ln" or "ln_*").
EMBEDDING_KEY = re.compile(r"emb|^wte$|^wpe$")
NORM_KEY = re.compile(r"norm$|^ln$|^ln_")


def path_keys(path: Sequence) -> list[str]:
    """The keys of a `jax.tree_util` key path as strings (dict keys, attribute names, list
    indices)."""
    keys = []
    for entry in path:
        for field in ("key", "name", "idx"):
            if hasattr(entry, field):
                keys.append(str(getattr(entry, field)))
                break
        else:
            keys.append(str(entry))
    return keys


def exempt_key(key: str) -> bool:
    """Whether one path key names an embedding or a normalisation layer."""
    key = key.lower()
    return bool(EMBEDDING_KEY.search(key) or NORM_KEY.search(key.rstrip("0123456789_")))


def decays(path: Sequence, leaf, exempt: Callable[[str], bool] | None = None) -> bool:
    """The rule for one leaf: at least 2 dimensions and no key on its path that names an
    embedding or a norm (nor, when given, one for which `exempt(key)` is true)."""
    if getattr(leaf, "ndim", 0) < 2:
        return False
    return not any(exempt_key(key) or (exempt is not None and exempt(key))
                   for key in path_keys(path))


def decay_mask(params, exempt: Callable[[str], bool] | None = None):
    """A tree of booleans like ``params``: True where the parameter decays, by the rule of
    `danastar.optim.param_groups` (no decay on embeddings, norms, or parameters with fewer
    than 2 dimensions). Pass it as the optimizer's ``mask``::

        dana_star_mk4(3e-4, schedule=..., omega=4.0, total_steps=T, mask=decay_mask)

    ``exempt``: a function of one path key (a string) that exempts more parameters, for names
    the rule does not know (``lambda key: key == "lm_head"``).
    """
    return jax.tree_util.tree_map_with_path(lambda path, leaf: decays(path, leaf, exempt),
                                            params)
