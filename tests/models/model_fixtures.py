"""Tiny models shared by the model tests."""

import torch

from danastar.models import ModelConfig, build_model

VOCAB = 300  # pads to 320: the padded rows are exercised too


def tiny_config(arch: str, **overrides) -> ModelConfig:
    """A two-layer model small enough for fast CPU tests (head_dim 16, not the ladder's)."""
    fields = dict(arch=arch, n_layer=2, n_head=2, n_embd=32, head_dim=16, mlp_hidden=64,
                  vocab_size=VOCAB, max_seq_len=64, loss_chunk=8)
    return ModelConfig.from_dict({**fields, **overrides})


def tiny_model(arch: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return build_model(tiny_config(arch, **overrides))
