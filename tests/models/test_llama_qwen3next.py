"""Llama (the dense baseline) and Qwen3-Next (Qwen3 blocks with mixture-of-experts MLPs)."""

import pytest
import torch
import torch.nn.functional as F

from danastar.models import Llama, ModelConfig, Qwen3Next, build_model, param_counts
from danastar.models.config import dimensions, moe_layers
from danastar.models.layers import SwiGLU, apply_rope
from danastar.models.moe import MoE
from danastar.models.parallelize import tensor_parallel_plan

from model_fixtures import VOCAB, tiny_config, tiny_model


def test_llama_ladder_and_defaults():
    # SwiGLU hidden 256·⌈⌊8d/3⌋/256⌉: d 192 → 512 exactly, d 256 → ⌊682.7⌋ rounded up to 768
    assert dimensions("llama", 3) == dict(n_layer=2, n_head=3, n_embd=192, head_dim=64,
                                          mlp_hidden=512)
    assert dimensions("llama", 4)["mlp_hidden"] == 768
    config = ModelConfig.from_heads("llama", 4, VOCAB, 32)
    assert config.tie_embeddings and config.z_loss == 0 and not config.moe
    assert ModelConfig.from_heads("llama", 4, VOCAB, 32, z_loss=1e-4).z_loss == 1e-4
    assert isinstance(build_model(config), Llama)
    qwen3next = ModelConfig.from_heads("qwen3next", 2, VOCAB, 32)
    assert qwen3next.moe and qwen3next.n_embd == 256 and qwen3next.mlp_hidden == 768


def test_llama_block_is_qwen3_without_qk_norm_and_gate():
    model = tiny_model("llama", tie_embeddings=True, z_loss=0.0)
    assert model.lm_head.weight is model.embed.weight
    block = model.blocks[0]
    assert isinstance(block.mlp, SwiGLU)
    assert {name for name, _ in block.self_attn.named_parameters()} == {"qkv_proj.weight",
                                                                        "o_proj.weight"}
    attention, x, rope = block.self_attn, torch.randn(1, 8, 32), model.rope[:8]
    with torch.no_grad():
        # per head the fused projection gives (q, k, v) of head_dim each, as in Enoki
        q, k, v = attention.qkv_proj(x).view(1, 8, 2, 3, 16).unbind(3)
        q, k = (apply_rope(t, rope).transpose(1, 2) for t in (q, k))
        heads = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True)
        expected = attention.o_proj(heads.transpose(1, 2).flatten(2))
        torch.testing.assert_close(attention(x, rope), expected)
    idx = torch.randint(0, VOCAB, (2, 16))
    out = model(idx, idx)
    assert out.z == 0 and out.moe == {}


def test_llama_tensor_parallel_plan_splits_whole_heads_and_mlp_columns():
    plan = tensor_parallel_plan(tiny_model("llama"), tp_size=2)
    styles = {path: type(style).__name__ for path, style in plan.items()}
    assert styles == {
        f"blocks.{i}.{name}": style
        for i in range(2)
        for name, style in (("self_attn.qkv_proj", "ColwiseParallel"),
                            ("self_attn.o_proj", "RowwiseParallel"),
                            ("mlp.gate_proj", "ColwiseParallel"),
                            ("mlp.up_proj", "ColwiseParallel"),
                            ("mlp.down_proj", "RowwiseParallel"))
    }


def test_qwen3next_layer_rule():
    config = tiny_config("qwen3next", n_layer=8, moe=True, decoder_sparse_step=2,
                         mlp_only_layers=[2])
    assert config.moe.mlp_only_layers == (2,)  # lists (JSON, YAML) become tuples
    model = build_model(config)
    assert isinstance(model, Qwen3Next)
    moe = [i for i, block in enumerate(model.blocks) if isinstance(block.mlp, MoE)]
    assert moe == list(moe_layers(config)) == [0, 4, 6]
    assert all(isinstance(block.mlp, SwiGLU) for i, block in enumerate(model.blocks)
               if i not in moe)
    assert ModelConfig.from_dict(config.to_dict()) == config
    dense = tiny_config("qwen3next")  # without moe it is dense Qwen3
    assert not moe_layers(dense)
    with pytest.raises(ValueError, match="no MoE layer"):
        tiny_config("qwen3next", moe=True, mlp_only_layers=(0, 1))
    with pytest.raises(ValueError, match="names layer 5, but the model has layers 0 to 1"):
        tiny_config("qwen3next", moe=True, mlp_only_layers=(5,))
    with pytest.raises(ValueError, match="moe_num_shared_experts to 0"):
        tiny_config("qwen3next", moe=True, use_gated_shared_expert=True,
                    moe_num_shared_experts=1)
    with pytest.raises(ValueError, match="sizes the gated shared expert; add "
                       "use_gated_shared_expert"):
        tiny_config("qwen3next", moe=True, shared_expert_intermediate_size=16)


@pytest.mark.parametrize("arch, overrides", [
    ("enoki", {}), ("qwen3", {}), ("llama", {}), ("qwen3next", {}),
    ("enoki", dict(moe=True, moe_num_experts=5, moe_num_shared_experts=1)),
    ("qwen3", dict(moe=True, moe_num_experts_per_tok=1)),
    ("llama", dict(moe=True, tie_embeddings=True)),
    ("qwen3next", dict(moe=True, n_layer=4, decoder_sparse_step=2, use_gated_shared_expert=True,
                       shared_expert_intermediate_size=48)),
    ("qwen3next", dict(moe=True, use_gated_shared_expert=True)),
])
@pytest.mark.filterwarnings("ignore:with one expert per token")
def test_parameter_counts_equal_the_modules(arch, overrides):
    config = tiny_config(arch, **overrides)
    with torch.device("meta"):
        model = build_model(config)
    counts = param_counts(config)
    assert model.num_params(non_embedding=True) == counts.non_embedding
    assert model.num_params(non_embedding=True, active=True) == counts.active_non_embedding
    assert model.num_params() - model.num_params(non_embedding=True) == counts.embedding


@pytest.mark.parametrize("arch", ["llama", "qwen3next"])
def test_causal_generation_and_training_step(arch):
    model = tiny_model(arch, moe=arch == "qwen3next", moe_num_experts=4)
    idx = torch.randint(0, VOCAB, (2, 12))
    model.eval()
    cached = model.generate(idx[:, :4], 6, temperature=0)
    with torch.no_grad():
        full = idx[:, :4]
        for _ in range(6):
            next_token = model(full)[:, -1, :VOCAB].argmax(dim=-1, keepdim=True)
            full = torch.cat((full, next_token), dim=1)
    assert torch.equal(cached, full)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        loss = model(idx, idx).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
