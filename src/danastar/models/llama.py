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
from danastar.models.qwen3 import Qwen3Block
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


class LlamaBlock(Qwen3Block):
    """Qwen3's pre-norm block with Llama's attention (no q/k norms, no gate)."""

    attention = LlamaAttention


class Llama(Transformer):
    make_block = staticmethod(LlamaBlock)
    make_norm = staticmethod(RMSNorm)

    # tensor-parallel styles per block submodule (see danastar.models.parallelize)
    tp_colwise = ("self_attn.qkv_proj", "mlp.gate_proj", "mlp.up_proj")
    tp_rowwise = ("self_attn.o_proj", "mlp.down_proj")
