"""The model configuration shared by every architecture, and the facts that describe a model
without building it: the architectures and how each grows with its number of heads, vocabulary
padding, and the parameter-count convention of the LR laws."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

INITS = ("ScaledGPT", "KarpathyGPT2")
VOCAB_MULTIPLE = 64  # vocabularies are padded to a multiple of this for fast matmuls


@dataclasses.dataclass(frozen=True)
class Ladder:
    """How an architecture grows with its number of heads h: n_embd = h · head_dim,
    n_layer = ⌊h · layers_per_head⌋, MLP hidden = mlp_ratio · n_embd."""

    head_dim: int
    layers_per_head: Fraction
    mlp_ratio: int


# The architectures (build_model's registry has one class per name) and their ladders.
LADDERS: dict[str, Ladder] = {
    "enoki": Ladder(head_dim=64, layers_per_head=Fraction(3, 4), mlp_ratio=4),
    "qwen3": Ladder(head_dim=128, layers_per_head=Fraction(2), mlp_ratio=3),
}
ARCHITECTURES = tuple(LADDERS)


def check_arch(arch: str) -> Ladder:
    if arch not in LADDERS:
        raise ValueError(f"unknown arch {arch!r}; valid choices: {', '.join(ARCHITECTURES)}")
    return LADDERS[arch]


def dimensions(arch: str, heads: int) -> dict[str, int]:
    """Model shape for ``heads`` attention heads: n_layer, n_head, n_embd, head_dim, mlp_hidden."""
    ladder = check_arch(arch)
    if not isinstance(heads, int) or heads < 1:
        raise ValueError(f"heads must be an integer >= 1, got {heads!r}")
    n_layer = math.floor(heads * ladder.layers_per_head)
    if n_layer < 1:
        raise ValueError(f"{arch} with {heads} heads has no layers; use more heads")
    n_embd = heads * ladder.head_dim
    return dict(n_layer=n_layer, n_head=heads, n_embd=n_embd, head_dim=ladder.head_dim,
                mlp_hidden=ladder.mlp_ratio * n_embd)


def padded_vocab_size(vocab_size: int) -> int:
    """Round up to a multiple of 64 (GPT-2: 50257 → 50304)."""
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def non_embedding_params(n_embd: int, n_layer: int) -> int:
    """The LR laws' parameter count P = 12·d²·n_layer (exact for Enoki's matrices)."""
    return 12 * n_embd**2 * n_layer


def embedding_params(n_embd: int, padded_vocab: int, tie_embeddings: bool = False) -> int:
    """The token embedding and the output head (one matrix when tied)."""
    return (1 if tie_embeddings else 2) * n_embd * padded_vocab


@dataclasses.dataclass
class ModelConfig:
    """Shape and options of a decoder-only language model.

    ``vocab_size`` is the tokenizer's; the embedding and head use ``padded_vocab_size``.
    """

    arch: str
    n_layer: int
    n_head: int
    n_embd: int
    head_dim: int
    mlp_hidden: int
    vocab_size: int
    max_seq_len: int
    tie_embeddings: bool = False
    init: str = "ScaledGPT"
    residual_scale: float = 1.0
    z_loss: float = 1e-4
    loss_chunk: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        check_arch(self.arch)
        for name in ("n_layer", "n_head", "n_embd", "head_dim", "mlp_hidden", "vocab_size",
                     "max_seq_len", "loss_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.init not in INITS:
            raise ValueError(f"unknown init {self.init!r}; valid choices: {', '.join(INITS)}")
        if self.z_loss < 0:
            raise ValueError(f"z_loss must be >= 0, got {self.z_loss}")

    @property
    def padded_vocab_size(self) -> int:
        return padded_vocab_size(self.vocab_size)

    @classmethod
    def from_heads(cls, arch: str, heads: int, vocab_size: int, max_seq_len: int,
                   **overrides: Any) -> ModelConfig:
        """The ladder model with ``heads`` heads (see ``LADDERS``)."""
        fields = dict(arch=arch, **dimensions(arch, heads), vocab_size=vocab_size,
                      max_seq_len=max_seq_len)
        return cls(**{**fields, **overrides})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}; "
                             f"valid: {', '.join(sorted(known))}")
        return cls(**values)
