"""danastar's language models as a Hugging Face model (loaded with ``trust_remote_code=True``).

An export of a model that no transformers class computes exactly (Enoki; a mixture of experts
without Qwen3-Next's gated shared expert) ships this file as ``modeling_danastar.py``, so it
imports torch and transformers only. The parameters keep danastar's own names and the config
holds danastar's ``ModelConfig`` fields, so an export of this kind is a copy, not a mapping.

What it computes, for every architecture (``arch``):

* pre-norm blocks x ← x + c·Attn(Norm(x)), x ← x + c·MLP(Norm(x)), c = ``residual_scale``;
  bias-free LayerNorm (enoki) or RMSNorm (the others), computed in float32;
* attention: enoki a fused (q, k, v)-per-head projection with per-head LayerNorm on q and k;
  llama the same projection without norms; qwen3 and qwen3next separate projections, per-head
  RMSNorm on q and k, and a per-head sigmoid gate (the second half of each head's q_proj
  output) on the attention output; RoPE on interleaved pairs after the norms, in float32;
* MLP: GELU d → h → d (enoki) or SwiGLU; with ``moe``, in the layers ``is_moe_layer`` names, a
  top-k mixture of such experts stored stacked (E, out, in), plus the shared experts (summed)
  and Qwen3-Next's gated shared expert σ(x·w_g)·SwiGLU(x).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationMixin,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import CausalLMOutputWithPast


class DanastarConfig(PretrainedConfig):
    model_type = "danastar"

    def __init__(self, arch: str = "enoki", n_layer: int = 1, n_head: int = 1,
                 n_embd: int = 64, head_dim: int = 64, mlp_hidden: int = 256,
                 vocab_size: int = 256, padded_vocab_size: int = 256, max_seq_len: int = 256,
                 tie_embeddings: bool = False, residual_scale: float = 1.0,
                 rope_theta: float = 10000.0, norm_eps: float = 1e-5, moe: bool = False,
                 moe_num_experts: int = 8, moe_num_shared_experts: int = 0,
                 moe_num_experts_per_tok: int = 2, moe_softmax_order: str = "topk_softmax",
                 use_gated_shared_expert: bool = False,
                 shared_expert_intermediate_size: int | None = None,
                 decoder_sparse_step: int = 1, mlp_only_layers: tuple[int, ...] = (),
                 **kwargs):
        self.arch = arch
        self.n_layer, self.n_head, self.n_embd, self.head_dim = n_layer, n_head, n_embd, head_dim
        self.mlp_hidden = mlp_hidden
        self.padded_vocab_size = padded_vocab_size
        self.max_seq_len = max_seq_len
        self.tie_embeddings = tie_embeddings
        self.residual_scale = residual_scale
        self.rope_theta = rope_theta
        self.norm_eps = norm_eps
        self.moe = moe
        self.moe_num_experts = moe_num_experts
        self.moe_num_shared_experts = moe_num_shared_experts
        self.moe_num_experts_per_tok = moe_num_experts_per_tok
        self.moe_softmax_order = moe_softmax_order
        self.use_gated_shared_expert = use_gated_shared_expert
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.decoder_sparse_step = decoder_sparse_step
        self.mlp_only_layers = list(mlp_only_layers)
        # the names transformers' generic code reads, derived here (config.json holds them too)
        for derived in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                        "max_position_embeddings"):
            kwargs.pop(derived, None)
        kwargs.setdefault("tie_word_embeddings", tie_embeddings)
        super().__init__(vocab_size=vocab_size, hidden_size=n_embd, num_hidden_layers=n_layer,
                         num_attention_heads=n_head, max_position_embeddings=max_seq_len,
                         **kwargs)

    def is_moe_layer(self, layer: int) -> bool:
        return (self.moe and layer not in self.mlp_only_layers
                and layer % self.decoder_sparse_step == 0)


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.layer_norm(x.float(), (x.shape[-1],), self.weight.float(), None,
                            self.eps).to(x.dtype)


class RMSNorm(LayerNorm):
    def forward(self, x):
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


def rotate(x, cos, sin):
    """Interleaved RoPE: pairs (2i, 2i+1) of x (B, T, H, hd) rotated by angles (B, T, hd/2)."""
    real, imag = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[:, :, None], sin[:, :, None]
    return torch.stack((real * cos - imag * sin, real * sin + imag * cos), -1).flatten(-2).to(
        x.dtype)


class Attention(nn.Module):
    def __init__(self, config: DanastarConfig, layer: int):
        super().__init__()
        inner, self.head_dim, self.layer = config.n_head * config.head_dim, config.head_dim, layer
        self.arch = config.arch
        if self.arch in ("enoki", "llama"):
            self.qkv_proj = nn.Linear(config.n_embd, 3 * inner, bias=False)
        else:
            self.q_proj = nn.Linear(config.n_embd, 2 * inner, bias=False)  # query, then gate
            self.k_proj = nn.Linear(config.n_embd, inner, bias=False)
            self.v_proj = nn.Linear(config.n_embd, inner, bias=False)
        self.o_proj = nn.Linear(inner, config.n_embd, bias=False)
        if self.arch != "llama":
            norm = LayerNorm if self.arch == "enoki" else RMSNorm
            self.q_norm = norm(config.head_dim, config.norm_eps)
            self.k_norm = norm(config.head_dim, config.norm_eps)

    def forward(self, x, cos, sin, mask, cache):
        batch, seq_len, _ = x.shape
        gate = None
        if self.arch in ("enoki", "llama"):
            q, k, v = self.qkv_proj(x).view(batch, seq_len, -1, 3, self.head_dim).unbind(3)
        else:
            q, gate = self.q_proj(x).view(batch, seq_len, -1, 2 * self.head_dim).chunk(2, -1)
            k = self.k_proj(x).view(batch, seq_len, -1, self.head_dim)
            v = self.v_proj(x).view(batch, seq_len, -1, self.head_dim)
        if self.arch != "llama":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        q, k, v = (t.to(v.dtype).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(k, v, self.layer)
        if mask is None:  # no padding, no cached prefix: plain causal attention
            out = F.scaled_dot_product_attention(q, k, v, is_causal=seq_len > 1)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out.flatten(2))


class GeluMLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.gelu(self.up_proj(x)))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Experts(nn.Module):
    """Expert e's Linear weights are slice e of each stacked parameter (E, out, in)."""

    def __init__(self, count: int, dim: int, hidden: int, swiglu: bool):
        super().__init__()
        self.swiglu = swiglu
        if swiglu:
            self.gate_proj = nn.Parameter(torch.empty(count, hidden, dim))
        self.up_proj = nn.Parameter(torch.empty(count, hidden, dim))
        self.down_proj = nn.Parameter(torch.empty(count, dim, hidden))

    def expert(self, e: int, x):
        up = x @ self.up_proj[e].T
        hidden = F.silu(x @ self.gate_proj[e].T) * up if self.swiglu else F.gelu(up)
        return hidden @ self.down_proj[e].T


class MoE(nn.Module):
    def __init__(self, config: DanastarConfig):
        super().__init__()
        dim, hidden, swiglu = config.n_embd, config.mlp_hidden, config.arch != "enoki"
        routed = config.moe_num_experts - config.moe_num_shared_experts
        self.top_k, self.softmax_order = config.moe_num_experts_per_tok, config.moe_softmax_order
        self.router = nn.Linear(dim, routed, bias=False)
        self.experts = Experts(routed, dim, hidden, swiglu)
        self.shared_experts = (Experts(config.moe_num_shared_experts, dim, hidden, swiglu)
                               if config.moe_num_shared_experts else None)
        if config.use_gated_shared_expert:
            self.shared_expert = SwiGLU(dim, config.shared_expert_intermediate_size or hidden)
            self.shared_expert_gate = nn.Linear(dim, 1, bias=False)
        else:
            self.shared_expert = None

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = F.linear(x.float(), self.router.weight.float())  # routing in float32
        if self.softmax_order == "topk_softmax":
            top, chosen = logits.topk(self.top_k, dim=-1)
            weights = torch.softmax(top, dim=-1)
        else:
            weights, chosen = torch.softmax(logits, dim=-1).topk(self.top_k, dim=-1)
        y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in chosen.unique().tolist():
            token, slot = (chosen == e).nonzero(as_tuple=True)
            out = self.experts.expert(e, x[token]).float() * weights[token, slot, None]
            y = y.index_add(0, token, out)
        if self.shared_experts is not None:
            for e in range(self.shared_experts.up_proj.shape[0]):
                y = y + self.shared_experts.expert(e, x).float()
        if self.shared_expert is not None:
            gate = torch.sigmoid(F.linear(x.float(), self.shared_expert_gate.weight.float()))
            y = y + gate * self.shared_expert(x).float()
        return y.to(x.dtype).view(shape)


class Block(nn.Module):
    def __init__(self, config: DanastarConfig, layer: int):
        super().__init__()
        self.enoki = config.arch == "enoki"
        self.residual_scale = config.residual_scale
        norm = LayerNorm if self.enoki else RMSNorm
        first, attention, second = (("attn_norm", "attn", "mlp_norm") if self.enoki else
                                    ("input_layernorm", "self_attn", "post_attention_layernorm"))
        self.first, self.attention, self.second = first, attention, second
        setattr(self, first, norm(config.n_embd, config.norm_eps))
        setattr(self, attention, Attention(config, layer))
        setattr(self, second, norm(config.n_embd, config.norm_eps))
        if config.is_moe_layer(layer):
            self.mlp = MoE(config)
        elif self.enoki:
            self.mlp = GeluMLP(config.n_embd, config.mlp_hidden)
        else:
            self.mlp = SwiGLU(config.n_embd, config.mlp_hidden)

    def forward(self, x, cos, sin, mask, cache):
        attention = getattr(self, self.attention)
        x = x.add(attention(getattr(self, self.first)(x), cos, sin, mask, cache),
                  alpha=self.residual_scale)
        return x.add(self.mlp(getattr(self, self.second)(x)), alpha=self.residual_scale)


class DanastarForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = DanastarConfig
    base_model_prefix = "danastar"
    _no_split_modules = ["Block"]
    _supports_sdpa = True
    _tied_weights_keys = {"lm_head.weight": "embed.weight"}

    def __init__(self, config: DanastarConfig):
        super().__init__(config)
        vocab = config.padded_vocab_size
        self.embed = nn.Embedding(vocab, config.n_embd)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.norm = (LayerNorm if config.arch == "enoki" else RMSNorm)(config.n_embd,
                                                                       config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, vocab, bias=False)
        self.post_init()

    def _init_weights(self, module):
        # a fresh model (training starts from danastar, not here): small normal weights
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, Experts):
            for param in module.parameters():
                nn.init.normal_(param, std=0.02)
        elif isinstance(module, LayerNorm):
            nn.init.ones_(module.weight)

    def get_input_embeddings(self):
        return self.embed

    def set_input_embeddings(self, value):
        self.embed = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                past_key_values=None, labels=None, use_cache=None, logits_to_keep=0,
                **kwargs):
        cache = cache if cache is not None else past_key_values
        batch, seq_len = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + seq_len, device=input_ids.device)
            position_ids = position_ids.expand(batch, -1)
        # RoPE depends on position differences only, so left padding needs no special positions
        config = self.config
        exponents = torch.arange(0, config.head_dim, 2, dtype=torch.float32,
                                 device=input_ids.device) / config.head_dim
        angles = position_ids.float()[..., None] * config.rope_theta ** -exponents
        cos, sin = torch.cos(angles), torch.sin(angles)
        mask = self._mask(attention_mask, batch, seq_len, past, input_ids.device)
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, cos, sin, mask, cache)
        hidden = self.norm(x)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        # the padding ids' logits stay, as in danastar's loss (generation_config suppresses them)
        logits = self.lm_head(hidden).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                                   ignore_index=-100)
        cache_field = ("cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__
                       else "past_key_values")
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{cache_field: cache})

    @staticmethod
    def _mask(attention_mask, batch, seq_len, past, device):
        """None for plain causal attention, else a boolean (B, 1, T, past+T) mask: causal, no
        padded key, and each query sees itself (a padded query row is never empty)."""
        padded = attention_mask is not None and not bool(attention_mask.all())
        if not padded and past == 0:
            return None
        total = past + seq_len
        rows = torch.arange(past, total, device=device)[:, None]
        allowed = (torch.arange(total, device=device)[None] <= rows)[None, None]
        if padded:
            keys = attention_mask[:, -total:].bool()[:, None, None, :]
            allowed = allowed & (keys | (torch.arange(total, device=device) == rows)[None, None])
        return allowed.expand(batch, 1, seq_len, total)


# transformers 5 reads a model's config (AutoConfig) before its tokenizer's, so an unknown
# model type sends `AutoTokenizer.from_pretrained(path)` to ask again whether to run this file.
# Registered once it is imported (the model loaded with trust_remote_code=True, or danastar
# itself), "danastar" is a known type: the tokenizer then loads without a question or warning.
AutoConfig.register(DanastarConfig.model_type, DanastarConfig, exist_ok=True)
AutoModelForCausalLM.register(DanastarConfig, DanastarForCausalLM, exist_ok=True)
