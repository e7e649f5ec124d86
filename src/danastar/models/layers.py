"""Building blocks shared by both architectures: norms, rotary embeddings, causal attention with
an optional KV cache, and the two MLPs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm(nn.LayerNorm):
    """LayerNorm with a learnable weight and no bias, computed in float32 whatever the input
    dtype (CUDA autocast would do so, CPU autocast would not)."""

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps=eps, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.layer_norm(x.float(), self.normalized_shape, self.weight.float(), None, self.eps)
        return out.to(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm with a learnable weight, computed in float32 whatever the input dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)
        return out.to(x.dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def rope_frequencies(head_dim: int, max_seq_len: int, theta: float,
                     device: torch.device | None = None) -> torch.Tensor:
    """e^(i·pos·θ^(−2i/hd)) for pos < max_seq_len, i < hd/2: float32 (T, hd/2, 2), the real
    view of the complex numbers (real buffers are safe to broadcast and to move across devices)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
    positions = torch.arange(max_seq_len, dtype=torch.float32, device=device)
    angles = torch.outer(positions, theta ** -exponents)
    return torch.view_as_real(torch.polar(torch.ones_like(angles), angles))


def apply_rope(x: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (2i, 2i+1) of x (B, T, H, hd) by ``frequencies`` (T, hd/2, 2,
    from ``rope_frequencies``): each pair, as a complex number, is multiplied by e^(i·angle),
    in float32. The result has x's dtype.

    The complex product is written out in real arithmetic, (a + ib)(c + is) = (ac − bs) +
    i(as + bc): the same values (bitwise on CPU), and torch.compile fuses it with its
    neighbours, while complex tensors would leave inductor to run them as separate kernels."""
    real, imag = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = frequencies[:, None, :, 0], frequencies[:, None, :, 1]  # broadcast over heads
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


class KVCache:
    """Keys and values of one attention layer for incremental decoding, preallocated to
    (B, H, max_len, hd) on the first update."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor,
               pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, H, T, hd) at positions pos..pos+T; return everything up to pos+T."""
        if self.keys is None:
            shape = (*k.shape[:2], self.max_len, k.shape[-1])
            self.keys = k.new_empty(shape)
            self.values = v.new_empty(shape)
        end = pos + k.shape[2]
        self.keys[:, :, pos:end] = k
        self.values[:, :, pos:end] = v
        return self.keys[:, :, :end], self.values[:, :, :end]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cache: KVCache | None = None, pos: int = 0) -> torch.Tensor:
    """Causal SDPA over (B, T, H, hd) inputs, returning (B, T, H, hd).

    With a cache, the new keys/values are appended at ``pos`` and the queries (positions
    pos..pos+T) attend to everything up to themselves.
    """
    # q and k come out of the fp32 norms and RoPE; attend in the dtype of v (bf16 under autocast)
    q, k, v = (t.to(v.dtype).transpose(1, 2) for t in (q, k, v))
    mask, is_causal = None, q.shape[2] > 1
    if cache is not None:
        k, v = cache.update(k, v, pos)
        if pos > 0 and q.shape[2] > 1:  # a block of queries after a cached prefix
            rows = torch.arange(pos, pos + q.shape[2], device=q.device)[:, None]
            mask, is_causal = rows >= torch.arange(k.shape[2], device=q.device), False
        elif pos > 0:  # one new query sees the whole prefix
            is_causal = False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
    return out.transpose(1, 2)


class GeluMLP(nn.Module):
    """d → hidden, exact GELU, hidden → d."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.down_proj.is_residual_output = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.up_proj(x)))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) ⊙ up(x))."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.down_proj.is_residual_output = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
