"""`danastar.optax.decay_mask` decays what `danastar.optim.param_groups` decays: the same
parameters of equivalent models, the torch one sorted by module type, the JAX one by path."""

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")
torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from danastar.optax import dana_star_mk4, decay_mask  # noqa: E402
from danastar.optim import param_groups  # noqa: E402


class RMSNorm(nn.Module):
    """A norm that torch does not know: param_groups finds it by its class name."""

    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.Linear(width, 3 * width)
        self.norm2 = RMSNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width, bias=False))


class GPT(nn.Module):
    """GPT-2's names: wte, wpe, h.<i>, ln_f; a head tied to the token embedding, a 2-D
    position embedding, a convolution and a 1-D scalar gain."""

    def __init__(self, vocab=50, width=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(16, width)
        self.tok_embeddings = nn.EmbeddingBag(vocab, width)
        self.conv = nn.Conv1d(width, width, 3)
        self.h = nn.ModuleList([Block(width) for _ in range(2)])
        self.ln_f = nn.LayerNorm(width)
        self.final_norm = nn.RMSNorm(width)
        self.gain = nn.Parameter(torch.ones(1))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied: one parameter, named once


def as_pytree(model: nn.Module) -> dict:
    """The model's parameters as nested dicts keyed by the parts of their torch names (list
    indices as dict keys), zeros of the same shapes."""
    tree: dict = {}
    for name, param in model.named_parameters():
        *parents, leaf = name.split(".")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = jnp.zeros(tuple(param.shape))
    return tree


def decaying_names(mask: dict) -> set[str]:
    leaves = jax.tree_util.tree_leaves_with_path(mask)
    return {".".join(str(entry.key) for entry in path) for path, value in leaves if value}


def test_decay_mask_decays_what_param_groups_decays():
    model = GPT()
    groups = param_groups(model)
    torch_decays = set(groups[0]["names"])
    assert "wte.weight" in groups[1]["names"] and "h.0.attn.weight" in torch_decays
    assert decaying_names(decay_mask(as_pytree(model))) == torch_decays
    # what ndim >= 2 alone would decay besides: the embedding tables
    everything = {name for name, p in model.named_parameters() if p.ndim >= 2}
    assert everything - torch_decays == {"wte.weight", "wpe.weight", "tok_embeddings.weight"}


def test_decay_mask_reads_flax_and_haiku_names():
    flax_like = {
        "Embed_0": {"embedding": jnp.zeros((50, 8))},
        "LayerNorm_0": {"scale": jnp.zeros(8), "bias": jnp.zeros(8)},
        "RMSNorm_1": {"scale": jnp.zeros(8)},
        "Dense_0": {"kernel": jnp.zeros((8, 32)), "bias": jnp.zeros(32)},
        "Conv_0": {"kernel": jnp.zeros((3, 3, 1, 8))},
        "layers": [{"mlp": {"w": jnp.zeros((8, 8))}, "layer_norm": {"scale": jnp.zeros(8)}}],
    }
    haiku_like = {"embed": {"embeddings": jnp.zeros((50, 8))},
                  "linear": {"w": jnp.zeros((8, 8)), "b": jnp.zeros(8)}}
    assert decaying_names(decay_mask(haiku_like)) == {"linear.w"}
    decaying = [value for path, value in jax.tree_util.tree_leaves_with_path(
        decay_mask(flax_like)) if value]
    assert len(decaying) == 3  # Dense_0's kernel, Conv_0's kernel, layers[0]'s mlp matrix
    mask = decay_mask(flax_like)
    assert mask["Dense_0"]["kernel"] and mask["Conv_0"]["kernel"] and mask["layers"][0]["mlp"]["w"]


def test_decay_mask_takes_more_exemptions():
    tree = {"lm_head": {"w": jnp.zeros((8, 50))}, "mlp": {"w": jnp.zeros((8, 8))}}
    assert decay_mask(tree, exempt=lambda key: key == "lm_head") == {
        "lm_head": {"w": False}, "mlp": {"w": True}}


def test_decay_mask_as_the_optimizers_mask_leaves_embeddings_alone():
    params = {"embed": {"weight": jnp.ones((4, 2))}, "dense": {"kernel": jnp.ones((2, 2))}}
    optimizer = dana_star_mk4(0.0, weight_decay=1e-4, mask=decay_mask)  # LR 0: the decay alone
    state = optimizer.init(params)
    grads = jax.tree.map(jnp.zeros_like, params)
    updates, _ = optimizer.update(grads, state, params)
    new = optax.apply_updates(params, updates)
    assert jnp.array_equal(new["embed"]["weight"], params["embed"]["weight"])
    assert float(new["dense"]["kernel"][0, 0]) == pytest.approx(1 - 1e-4)
