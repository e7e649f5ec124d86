"""Qwen3-style model with an elementwise sigmoid gate on the attention output.

Pre-norm blocks with float32 RMSNorm; separate q/k/v/o projections (Hugging Face's per-layer
names, so exporting is a renaming); per-head RMSNorm on queries and keys, then interleaved RoPE;
q_proj also emits, per head, a gate whose sigmoid multiplies that head's attention output before
o_proj; SwiGLU MLP with hidden 3d (with ``moe``, a mixture of such MLPs, see
``danastar.models.moe``). head_dim 128.
"""

from __future__ import annotations

import torch
from torch import nn

from danastar.models.config import ModelConfig
from danastar.models.layers import KVCache, RMSNorm, apply_rope, causal_attention
from danastar.models.moe import make_mlp
from danastar.models.transformer import Transformer


class Qwen3Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        inner = config.n_head * config.head_dim
        self.head_dim = config.head_dim
        # per head: the query (first head_dim outputs), then its gate (last head_dim)
        self.q_proj = nn.Linear(config.n_embd, 2 * inner, bias=False)
        self.k_proj = nn.Linear(config.n_embd, inner, bias=False)
        self.v_proj = nn.Linear(config.n_embd, inner, bias=False)
        self.o_proj = nn.Linear(inner, config.n_embd, bias=False)
        self.o_proj.is_residual_output = True
        self.q_norm = RMSNorm(config.head_dim, config.norm_eps)
        self.k_norm = RMSNorm(config.head_dim, config.norm_eps)

    def forward(self, x: torch.Tensor, rope: torch.Tensor,
                cache: KVCache | None = None, pos: int = 0) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        # head counts come from the projections' outputs, so tensor parallelism works
        q, gate = self.q_proj(x).view(batch, seq_len, -1, 2 * self.head_dim).chunk(2, dim=-1)
        k = self.k_proj(x).view(batch, seq_len, -1, self.head_dim)
        v = self.v_proj(x).view(batch, seq_len, -1, self.head_dim)
        q = apply_rope(self.q_norm(q), rope)
        k = apply_rope(self.k_norm(k), rope)
        out = causal_attention(q, k, v, cache, pos) * torch.sigmoid(gate)
        return self.o_proj(out.flatten(2))


class Qwen3Block(nn.Module):
    attention = Qwen3Attention  # Llama's block is this one with its own attention

    def __init__(self, config: ModelConfig, layer: int = 0):
        super().__init__()
        self.residual_scale = config.residual_scale
        self.input_layernorm = RMSNorm(config.n_embd, config.norm_eps)
        self.self_attn = self.attention(config)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = make_mlp(config, layer)

    def forward(self, x, rope, cache=None, pos=0):
        x = x.add(self.self_attn(self.input_layernorm(x), rope, cache, pos),
                  alpha=self.residual_scale)
        return x.add(self.mlp(self.post_attention_layernorm(x)), alpha=self.residual_scale)


class Qwen3(Transformer):
    make_block = staticmethod(Qwen3Block)
    make_norm = staticmethod(RMSNorm)

    # tensor-parallel styles per block submodule (see danastar.models.parallelize)
    tp_colwise = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
                  "mlp.up_proj")
    tp_rowwise = ("self_attn.o_proj", "mlp.down_proj")
    tp_per_head_norms = ("self_attn.q_norm", "self_attn.k_norm")
