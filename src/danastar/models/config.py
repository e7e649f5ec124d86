"""The model configuration shared by every architecture."""

from __future__ import annotations

import dataclasses
from typing import Any

from danastar import scaling

INITS = ("ScaledGPT", "KarpathyGPT2")


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
        if self.arch not in scaling.architectures():
            raise ValueError(f"unknown arch {self.arch!r}; valid choices: "
                             f"{', '.join(scaling.architectures())}")
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
        return scaling.padded_vocab_size(self.vocab_size)

    @classmethod
    def from_heads(cls, arch: str, heads: int, vocab_size: int, max_seq_len: int,
                   **overrides: Any) -> "ModelConfig":
        """The ladder model with ``heads`` heads (dimensions from ``danastar.scaling``)."""
        fields = dict(arch=arch, **scaling.dimensions(arch, heads), vocab_size=vocab_size,
                      max_seq_len=max_seq_len)
        return cls(**{**fields, **overrides})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ModelConfig":
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}; valid: {', '.join(sorted(known))}")
        return cls(**values)
