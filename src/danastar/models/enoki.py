"""Enoki: a GPT-3-like model with QK-LayerNorm and rotary embeddings.

Pre-norm blocks with bias-free LayerNorm; fused QKV projection; per-head LayerNorm on queries and
keys, then interleaved RoPE; causal SDPA; MLP d → 4d → d with exact GELU (with ``moe``, a mixture
of such MLPs, see ``danastar.models.moe``). head_dim 64.
"""

from __future__ import annotations

import torch
from torch import nn

from danastar.models.config import ModelConfig
from danastar.models.layers import KVCache, LayerNorm, apply_rope, causal_attention
from danastar.models.moe import make_mlp
from danastar.models.transformer import Transformer


class EnokiAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        inner = config.n_head * config.head_dim
        self.head_dim = config.head_dim
        # output laid out per head as (q, k, v), so a column split keeps whole heads together
        self.qkv_proj = nn.Linear(config.n_embd, 3 * inner, bias=False)
        self.o_proj = nn.Linear(inner, config.n_embd, bias=False)
        self.o_proj.is_residual_output = True
        self.q_norm = LayerNorm(config.head_dim, config.norm_eps)
        self.k_norm = LayerNorm(config.head_dim, config.norm_eps)

    def forward(self, x: torch.Tensor, rope: torch.Tensor,
                cache: KVCache | None = None, pos: int = 0) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        # the head count is read from the projection's output, so tensor parallelism works
        qkv = self.qkv_proj(x).view(batch, seq_len, -1, 3, self.head_dim)
        q, k, v = qkv.unbind(dim=3)
        q = apply_rope(self.q_norm(q), rope)
        k = apply_rope(self.k_norm(k), rope)
        out = causal_attention(q, k, v, cache, pos)
        return self.o_proj(out.flatten(2))


class EnokiBlock(nn.Module):
    def __init__(self, config: ModelConfig, layer: int = 0):
        super().__init__()
        self.residual_scale = config.residual_scale
        self.attn_norm = LayerNorm(config.n_embd, config.norm_eps)
        self.attn = EnokiAttention(config)
        self.mlp_norm = LayerNorm(config.n_embd, config.norm_eps)
        self.mlp = make_mlp(config, layer)

    def forward(self, x, rope, cache=None, pos=0):
        x = x.add(self.attn(self.attn_norm(x), rope, cache, pos), alpha=self.residual_scale)
        return x.add(self.mlp(self.mlp_norm(x)), alpha=self.residual_scale)


class Enoki(Transformer):
    make_block = staticmethod(EnokiBlock)
    make_norm = staticmethod(LayerNorm)

    # tensor-parallel styles per block submodule (see danastar.models.parallelize)
    tp_colwise = ("attn.qkv_proj", "mlp.up_proj")
    tp_rowwise = ("attn.o_proj", "mlp.down_proj")
    tp_per_head_norms = ("attn.q_norm", "attn.k_norm")
