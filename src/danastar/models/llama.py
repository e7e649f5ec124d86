"""Llama: the release's dense baseline, Qwen3's block without QK-norm and attention gate.

Pre-norm blocks with float32 RMSNorm; one fused QKV projection laid out per head as (q, k, v)
like Enoki's, so a column split keeps whole heads together; interleaved RoPE on queries and
keys; causal SDPA; SwiGLU MLP with hidden 256·⌈⌊8d/3⌋/256⌉ (the ladder's). The architecture's
defaults tie the embeddings and turn the z-loss off, as the release always does. head_dim 64.
"""

from __future__ import annotations

import torch
from torch import nn

from danastar.models.config import ModelConfig
from danastar.models.layers import KVCache, RMSNorm, apply_rope, causal_attention
from danastar.models.moe import make_mlp
from danastar.models.transformer import Transformer


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        inner = config.n_head * config.head_dim
        self.head_dim = config.head_dim
        self.qkv_proj = nn.Linear(config.n_embd, 3 * inner, bias=False)
        self.o_proj = nn.Linear(inner, config.n_embd, bias=False)
        self.o_proj.is_residual_output = True

    def forward(self, x: torch.Tensor, rope: torch.Tensor,
                cache: KVCache | None = None, pos: int = 0) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        # the head count is read from the projection's output, so tensor parallelism works
        q, k, v = self.qkv_proj(x).view(batch, seq_len, -1, 3, self.head_dim).unbind(dim=3)
        out = causal_attention(apply_rope(q, rope), apply_rope(k, rope), v, cache, pos)
        return self.o_proj(out.flatten(2))


class LlamaBlock(nn.Module):
    def __init__(self, config: ModelConfig, layer: int = 0):
        super().__init__()
        self.residual_scale = config.residual_scale
        self.input_layernorm = RMSNorm(config.n_embd, config.norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = make_mlp(config, layer)

    def forward(self, x, rope, cache=None, pos=0):
        x = x.add(self.self_attn(self.input_layernorm(x), rope, cache, pos),
                  alpha=self.residual_scale)
        return x.add(self.mlp(self.post_attention_layernorm(x)), alpha=self.residual_scale)


class Llama(Transformer):
    make_block = staticmethod(LlamaBlock)
    make_norm = staticmethod(RMSNorm)

    # tensor-parallel styles per block submodule (see danastar.models.parallelize)
    tp_colwise = ("self_attn.qkv_proj", "mlp.gate_proj", "mlp.up_proj")
    tp_rowwise = ("self_attn.o_proj", "mlp.down_proj")
