"""danastar models as Hugging Face models: which class computes each one, its config, and the
renaming of the weights.

Native classes, where one computes the model exactly:

* ``llama`` (dense, residual scale 1) → ``LlamaForCausalLM``: the fused (q, k, v)-per-head
  projection split into q/k/v_proj;
* ``qwen3`` (dense) and ``qwen3next`` with the gated shared expert and no plain shared experts
  → ``Qwen3NextForCausalLM`` with every layer full attention and RoPE on the whole head: its
  attention is danastar's Qwen3 attention, output gate included (``Qwen3ForCausalLM`` has no
  gate); its norms are zero-centred (weight − 1 is stored); its MoE layers are listed in
  ``mlp_only_layers`` because its rule for them is (i + 1) % step, danastar's i % step.

Both classes rotate half-split pairs (i, i + hd/2) where danastar rotates interleaved pairs
(2i, 2i + 1), so the rows of q and k (and the q/k norm weights) are permuted within each head:
the scores q·k are unchanged. Everything else (Enoki, whose bias-free LayerNorm with per-head
QK-LayerNorm and GELU MLP no transformers class has; mixtures of experts without Qwen3-Next's
gated shared expert; a residual scale other than 1) exports as ``DanastarForCausalLM``
(``danastar.export.hf_model``, shipped with the export), whose weights keep danastar's names.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from danastar.models.config import ModelConfig, moe_layers

CUSTOM = "DanastarForCausalLM"


@dataclasses.dataclass
class Mapping:
    """How one model exports: the class, its config fields and the renamed weights."""

    architecture: str  # the transformers class, or CUSTOM
    config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    why_custom: str = ""  # for CUSTOM: what no native class computes

    @property
    def native(self) -> bool:
        return self.architecture != CUSTOM


def why_not_native(config: ModelConfig) -> str:
    """'' when a transformers class computes ``config``'s model exactly, else the reason."""
    if config.arch == "enoki":
        return ("Enoki's bias-free LayerNorm with per-head QK-LayerNorm and GELU MLP has no "
                "transformers class")
    if config.residual_scale != 1.0:
        return f"the residual scale {config.residual_scale:g} has no transformers counterpart"
    if config.moe and config.arch == "llama":
        return "Llama with mixture-of-experts MLPs has no transformers class"
    if config.moe and not config.moe.use_gated_shared_expert:
        return ("a mixture of experts without Qwen3-Next's gated shared expert has no "
                "transformers class with danastar's gated attention")
    if config.moe and config.moe.num_shared_experts:
        return "plain (ungated) shared experts have no counterpart in Qwen3-Next"
    return ""


def to_hf(config: ModelConfig, state_dict: dict[str, torch.Tensor],
          force_custom: bool = False) -> Mapping:
    """The Hugging Face form of the model ``config`` with weights ``state_dict``."""
    state = {name: tensor.detach().float().cpu() for name, tensor in state_dict.items()}
    why = "asked for" if force_custom else why_not_native(config)
    if why:
        return _custom(config, state, why)
    if config.arch == "llama":
        return _llama(config, state)
    return _qwen3next(config, state)


def custom_config(config: ModelConfig) -> dict[str, Any]:
    """``DanastarConfig``'s fields: the ModelConfig's, less what only training reads."""
    fields = config.to_dict()
    for training_only in ("init", "z_loss", "loss_chunk", "moe_router_loss",
                          "moe_aux_loss_factor", "moe_z_loss_factor", "moe_entropy_loss_factor",
                          "moe_expert_capacity_factor"):
        fields.pop(training_only)
    fields["mlp_only_layers"] = list(fields["mlp_only_layers"])
    return {**fields, "padded_vocab_size": config.padded_vocab_size}


def _custom(config: ModelConfig, state: dict[str, torch.Tensor], why: str) -> Mapping:
    if config.tie_embeddings:
        state.pop("lm_head.weight", None)  # the embedding, tied again on loading
    return Mapping(CUSTOM, custom_config(config), state, why)


def half_split_order(head_dim: int) -> torch.Tensor:
    """Rows of one head in Hugging Face's RoPE order: even dimensions, then odd ones."""
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


def _rows_per_head(weight: torch.Tensor, head_dim: int, order: torch.Tensor) -> torch.Tensor:
    """``weight`` (H·hd, ...) with each head's rows taken in ``order`` (``half_split_order``
    going out, its inverse coming back)."""
    return weight.unflatten(0, (-1, head_dim))[:, order].flatten(0, 1)


def _common(config: ModelConfig) -> dict[str, Any]:
    return dict(vocab_size=config.padded_vocab_size, hidden_size=config.n_embd,
                intermediate_size=config.mlp_hidden, num_hidden_layers=config.n_layer,
                num_attention_heads=config.n_head, num_key_value_heads=config.n_head,
                head_dim=config.head_dim, max_position_embeddings=config.max_seq_len,
                rms_norm_eps=config.norm_eps, tie_word_embeddings=config.tie_embeddings,
                hidden_act="silu", attention_bias=False,
                rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta,
                                 "partial_rotary_factor": 1.0})


def _embeddings(config: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {"model.embed_tokens.weight": state["embed.weight"],
           "model.norm.weight": state["norm.weight"]}
    if not config.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    return out


def _llama(config: ModelConfig, state: dict[str, torch.Tensor]) -> Mapping:
    hd, out = config.head_dim, _embeddings(config, state)
    order = half_split_order(hd)
    for i in range(config.n_layer):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        qkv = state[src + "self_attn.qkv_proj.weight"].unflatten(0, (-1, 3, hd))
        q, k, v = (qkv[:, j].flatten(0, 1) for j in range(3))
        out[dst + "self_attn.q_proj.weight"] = _rows_per_head(q, hd, order)
        out[dst + "self_attn.k_proj.weight"] = _rows_per_head(k, hd, order)
        out[dst + "self_attn.v_proj.weight"] = v
        for name in ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                     "input_layernorm", "post_attention_layernorm"):
            out[dst + name + ".weight"] = state[src + name + ".weight"]
    return Mapping("LlamaForCausalLM",
                   {**_common(config), "model_type": "llama", "mlp_bias": False}, out)


def _qwen3next(config: ModelConfig, state: dict[str, torch.Tensor]) -> Mapping:
    out = _embeddings(config, state)
    out["model.norm.weight"] = out["model.norm.weight"] - 1  # zero-centred: x̂·(1 + w)
    for i in range(config.n_layer):
        out.update(_qwen3next_layer(config, i, state, outward=True))
    fields = {**_common(config), "model_type": "qwen3_next",
              "layer_types": ["full_attention"] * config.n_layer, "num_experts": 0}
    if config.moe:
        fields.update(num_experts=config.moe.routed_experts,
                      num_experts_per_tok=config.moe.num_experts_per_tok,
                      moe_intermediate_size=config.mlp_hidden,
                      shared_expert_intermediate_size=(config.moe.shared_expert_intermediate_size
                                                       or config.mlp_hidden),
                      norm_topk_prob=config.moe.softmax_order == "topk_softmax",
                      decoder_sparse_step=1,  # the MoE layers are listed below instead
                      mlp_only_layers=[i for i in range(config.n_layer)
                                       if i not in moe_layers(config)])
    return Mapping("Qwen3NextForCausalLM", fields, out)


# A Qwen3-Next MoE layer's weights: danastar's name and Hugging Face's (the experts' gate and up
# projections, one tensor there, are joined and split apart by `_qwen3next_layer`).
QWEN3NEXT_MOE_NAMES = (
    ("router.weight", "gate.weight"),
    ("experts.down_proj", "experts.down_proj"),
    ("shared_expert_gate.weight", "shared_expert_gate.weight"),
    *((f"shared_expert.{name}.weight",) * 2 for name in ("gate_proj", "up_proj", "down_proj")),
)


def _qwen3next_layer(config: ModelConfig, layer: int, state: dict[str, torch.Tensor],
                     outward: bool) -> dict[str, torch.Tensor]:
    """Block ``layer``'s weights renamed to Hugging Face's (``outward``) or back to danastar's:
    outward each head's rows go to RoPE's half-split order and the norms' weights w to w − 1
    (Hugging Face's are zero-centred); inward the inverse order and w + 1."""
    hd, out = config.head_dim, {}
    ours, theirs = f"blocks.{layer}.", f"model.layers.{layer}."
    src, dst = (ours, theirs) if outward else (theirs, ours)
    order = half_split_order(hd) if outward else torch.argsort(half_split_order(hd))
    shift = -1 if outward else 1
    # each head's query rows, then its gate's rows (the gate is not rotated)
    q_and_gate = state[src + "self_attn.q_proj.weight"].unflatten(0, (-1, 2 * hd))
    q_and_gate = torch.cat((q_and_gate[:, :hd][:, order], q_and_gate[:, hd:]), dim=1)
    out[dst + "self_attn.q_proj.weight"] = q_and_gate.flatten(0, 1)
    out[dst + "self_attn.k_proj.weight"] = _rows_per_head(
        state[src + "self_attn.k_proj.weight"], hd, order)
    for name in ("self_attn.v_proj", "self_attn.o_proj"):
        out[dst + name + ".weight"] = state[src + name + ".weight"]
    for name in ("q_norm", "k_norm"):
        out[dst + f"self_attn.{name}.weight"] = state[src + f"self_attn.{name}.weight"][
            order] + shift
    for name in ("input_layernorm", "post_attention_layernorm"):
        out[dst + name + ".weight"] = state[src + name + ".weight"] + shift
    if not config.is_moe_layer(layer):
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[dst + f"mlp.{name}.weight"] = state[src + f"mlp.{name}.weight"]
        return out
    for our_name, their_name in QWEN3NEXT_MOE_NAMES:
        read, write = (our_name, their_name) if outward else (their_name, our_name)
        out[dst + "mlp." + write] = state[src + "mlp." + read]
    if outward:
        out[dst + "mlp.experts.gate_up_proj"] = torch.cat(
            (state[src + "mlp.experts.gate_proj"], state[src + "mlp.experts.up_proj"]), dim=1)
    else:
        gate, up = state[src + "mlp.experts.gate_up_proj"].chunk(2, dim=1)
        out[dst + "mlp.experts.gate_proj"], out[dst + "mlp.experts.up_proj"] = gate, up
    return out


def from_hf(config: ModelConfig, architecture: str,
            hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """danastar's weights for ``config`` from a transformers model's (``architecture``, the
    names ``to_hf`` gives): ``to_hf`` undone. Exact but for Qwen3-Next's norm weights outside
    [0.5, 2], whose w − 1 may round by one unit in the last place. Meta tensors give meta
    tensors: the names and shapes alone, to check an export without reading it."""
    state = {name: _float32_cpu(tensor) for name, tensor in hf_state.items()}
    if architecture == CUSTOM:
        out = dict(state)
    elif architecture == "LlamaForCausalLM":
        out = _from_llama(config, state)
    elif architecture == "Qwen3NextForCausalLM":
        out = _from_qwen3next(config, state)
    else:
        raise ValueError(f"no danastar model is exported as {architecture}")
    if config.tie_embeddings:
        out["lm_head.weight"] = out["embed.weight"]
    elif "lm_head.weight" not in out:
        out["lm_head.weight"] = state["lm_head.weight"]
    return out


def _float32_cpu(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach().float()
    return tensor if tensor.is_meta else tensor.cpu()


def _from_embeddings(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {"embed.weight": state["model.embed_tokens.weight"],
           "norm.weight": state["model.norm.weight"]}
    if "lm_head.weight" in state:
        out["lm_head.weight"] = state["lm_head.weight"]
    return out


def _from_llama(config: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    hd, out = config.head_dim, _from_embeddings(state)
    inverse = torch.argsort(half_split_order(hd))
    for i in range(config.n_layer):
        src, dst = f"model.layers.{i}.", f"blocks.{i}."
        q = _rows_per_head(state[src + "self_attn.q_proj.weight"], hd, inverse)
        k = _rows_per_head(state[src + "self_attn.k_proj.weight"], hd, inverse)
        v = state[src + "self_attn.v_proj.weight"]
        per_head = [t.unflatten(0, (-1, hd)) for t in (q, k, v)]
        out[dst + "self_attn.qkv_proj.weight"] = torch.stack(per_head, dim=1).flatten(0, 2)
        for name in ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                     "input_layernorm", "post_attention_layernorm"):
            out[dst + name + ".weight"] = state[src + name + ".weight"]
    return out


def _from_qwen3next(config: ModelConfig,
                    state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = _from_embeddings(state)
    out["norm.weight"] = out["norm.weight"] + 1
    for i in range(config.n_layer):
        out.update(_qwen3next_layer(config, i, state, outward=False))
    return out
