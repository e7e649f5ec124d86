import math

import pytest
import torch
import torch.nn.functional as F

from danastar import scaling
from danastar.models import LossOutput, ModelConfig, build_model
from danastar.models.config import embedding_params, non_embedding_params
from danastar.models.layers import KVCache, apply_rope, rope_frequencies

from model_fixtures import VOCAB, tiny_config, tiny_model


@pytest.mark.parametrize("heads", [2, 3, 5])
def test_parameter_count_matches_formulas(arch, heads):
    config = ModelConfig.from_heads(arch, heads, vocab_size=VOCAB, max_seq_len=16)
    model = build_model(config)
    non_embedding = scaling.exact_non_embedding_params(
        arch, config.n_layer, config.n_head, config.n_embd, config.head_dim, config.mlp_hidden
    )
    embedding = embedding_params(config.n_embd, config.padded_vocab_size)
    assert model.num_params() == non_embedding + embedding
    assert model.num_params(non_embedding=True) == non_embedding
    matrices = sum(
        p.numel()
        for name, p in model.named_parameters()
        if p.dim() == 2 and name.startswith("blocks.")
    )
    per_d2l = {"enoki": 12, "qwen3": 14}[arch]  # Qwen3's gate and SwiGLU: 14·d²·L
    assert matrices == per_d2l * config.n_embd**2 * config.n_layer
    assert model.num_params(exact=False) == (
        non_embedding_params(config.n_embd, config.n_layer) + embedding
    )


def test_tied_embeddings_share_one_matrix(arch):
    model = tiny_model(arch, tie_embeddings=True)
    assert model.lm_head.weight is model.embed.weight
    untied = tiny_model(arch)
    assert untied.num_params() - model.num_params() == model.embed.weight.numel()


def test_vocabulary_is_padded_to_multiple_of_64(arch):
    model = tiny_model(arch)
    assert model.config.padded_vocab_size == 320
    assert model.embed.weight.shape[0] == model.lm_head.weight.shape[0] == 320
    assert ModelConfig.from_heads("enoki", 3, 50257, 16).padded_vocab_size == 50304


def test_logits_are_causal(arch):
    model = tiny_model(arch)
    idx = torch.randint(0, VOCAB, (2, 24))
    changed = idx.clone()
    t = 13
    changed[:, t] = (idx[:, t] + 1) % VOCAB
    with torch.no_grad():
        before, after = model(idx), model(changed)
    assert before.shape == (2, 24, 320)
    torch.testing.assert_close(before[:, :t], after[:, :t], rtol=0, atol=0)
    assert not torch.allclose(before[:, t:], after[:, t:])


@pytest.mark.parametrize("init", ["ScaledGPT", "KarpathyGPT2"])
def test_initial_loss_is_that_of_random_logits(arch, init):
    # A classifier whose logits are i.i.d. N(0, σ²) has expected loss ln V + σ²/2; ScaledGPT's
    # unit-variance head gives σ² ≈ 1, KarpathyGPT2's small weights σ² ≈ 0.02²·d.
    vocab = 4096  # a multiple of 64: no padded classes
    model = tiny_model(arch, init=init, vocab_size=vocab, n_embd=64, n_head=4, mlp_hidden=128)
    idx = torch.randint(0, vocab, (4, 64))
    with torch.no_grad():
        out = model(idx, idx)
        logit_variance = model(idx).var().item()
    assert abs(out.ce.item() - (math.log(vocab) + logit_variance / 2)) < 0.1
    assert abs(out.ce.item() - math.log(vocab)) < 0.6
    assert out.z.item() == pytest.approx(1e-4 * out.ce.item() ** 2, rel=0.2)


def test_initialisation_scales():
    model = tiny_model("enoki", n_layer=4, n_embd=64, n_head=4, mlp_hidden=256, vocab_size=8192)
    block = model.blocks[0]
    assert block.attn.qkv_proj.weight.std().item() == pytest.approx(64**-0.5, rel=0.05)
    assert block.mlp.down_proj.weight.std().item() == pytest.approx((2 * 256 * 4) ** -0.5, rel=0.05)
    assert model.embed.weight.std().item() == pytest.approx(64**-0.5, rel=0.05)
    assert torch.equal(block.attn_norm.weight, torch.ones(64))
    gpt2 = tiny_model(
        "enoki",
        init="KarpathyGPT2",
        n_layer=4,
        n_embd=64,
        n_head=4,
        mlp_hidden=256,
        vocab_size=8192,
    )
    assert gpt2.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert gpt2.blocks[0].mlp.down_proj.weight.std().item() == pytest.approx(
        0.02 / math.sqrt(8), rel=0.05
    )


def reference_loss(logits, targets, z_loss):
    """The unchunked computation: cross-entropy + z·mean(lse²) over non-ignored positions."""
    logits = logits.float().flatten(0, 1)
    targets = targets.flatten()
    valid = targets != -1
    ce = F.cross_entropy(logits, targets, ignore_index=-1)
    z = z_loss * logits[valid].logsumexp(dim=-1).square().mean()
    return ce + z, ce, z


@pytest.mark.parametrize("tie", [False, True])
def test_chunked_loss_equals_plain_loss_and_gradients(arch, tie):
    model = tiny_model(arch, tie_embeddings=tie, z_loss=1e-2, loss_chunk=5)  # ragged last chunk
    idx = torch.randint(0, VOCAB, (3, 32))
    targets = torch.randint(0, VOCAB, (3, 32))
    targets[0, :7] = -1
    targets[2, -3:] = -1
    out = model(idx, targets)
    assert isinstance(out, LossOutput)
    out.loss.backward()
    chunked_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    loss, ce, z = reference_loss(model(idx), targets, 1e-2)
    loss.backward()
    torch.testing.assert_close(out.loss, loss)
    torch.testing.assert_close(out.ce, ce)
    torch.testing.assert_close(out.z, z)
    assert not out.ce.requires_grad and not out.z.requires_grad
    for name, p in model.named_parameters():
        torch.testing.assert_close(chunked_grads[name], p.grad, msg=name)


def test_loss_gradient_scales_with_upstream_gradient():
    model = tiny_model("enoki")
    idx = torch.randint(0, VOCAB, (2, 16))
    (3.0 * model(idx, idx).loss).backward()
    tripled = model.lm_head.weight.grad.clone()
    model.zero_grad()
    model(idx, idx).loss.backward()
    torch.testing.assert_close(tripled, 3 * model.lm_head.weight.grad)


def test_loss_without_gradients_matches(arch):
    model = tiny_model(arch)
    idx = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        no_grad = model(idx, idx).loss
    torch.testing.assert_close(no_grad, model(idx, idx).loss.detach())


def test_generation_with_cache_equals_full_recompute(arch):
    model = tiny_model(arch).eval()
    prompt = torch.randint(0, VOCAB, (2, 5))
    cached = model.generate(prompt, 20, temperature=0)
    idx = prompt
    with torch.no_grad():
        for _ in range(20):
            next_token = model(idx)[:, -1, :VOCAB].argmax(dim=-1, keepdim=True)
            idx = torch.cat((idx, next_token), dim=1)
    assert torch.equal(cached, idx)


def test_sampling_respects_top_k_and_vocabulary(arch):
    model = tiny_model(arch).eval()
    prompt = torch.randint(0, VOCAB, (3, 4))
    torch.manual_seed(1)
    out = model.generate(prompt, 30, temperature=1.5, top_k=1)
    assert torch.equal(out, model.generate(prompt, 30, temperature=0))  # top-1 is greedy
    sampled = model.generate(prompt, 40, temperature=2.0)
    assert sampled.shape == (3, 44) and sampled.max() < VOCAB
    with pytest.raises(ValueError, match="max_seq_len"):
        model.generate(prompt, 64)


def test_param_groups_decay_linear_weights_only(arch):
    model = tiny_model(arch)
    decay, no_decay = model.param_groups(0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    linear = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(decay["names"]) == {f"{n}.weight" for n in linear}
    assert "lm_head.weight" in decay["names"] and "embed.weight" in no_decay["names"]
    assert all(
        p.dim() == 1 for n, p in zip(no_decay["names"], no_decay["params"]) if n != "embed.weight"
    )
    params = decay["params"] + no_decay["params"]
    assert len(params) == len(list(model.parameters()))
    assert {id(p) for p in params} == {id(p) for p in model.parameters()}
    tied_decay, tied_no_decay = tiny_model(arch, tie_embeddings=True).param_groups(0.1)
    assert "embed.weight" in tied_no_decay["names"] and "lm_head.weight" not in tied_decay["names"]


def test_flops_per_token(arch):
    model = tiny_model(arch)
    config = model.config
    weights = model.num_params() - model.embed.weight.numel()
    expected = 6 * weights + 12 * config.n_layer * config.n_head * config.head_dim * 64
    assert model.flops_per_token(64) == expected


def test_rope_rotates_interleaved_pairs():
    frequencies = rope_frequencies(head_dim=4, max_seq_len=3, theta=10000.0)
    x = torch.randn(1, 3, 1, 4)
    out = apply_rope(x, frequencies)
    for pos in range(3):
        for i in range(2):
            angle = pos * 10000.0 ** (-2 * i / 4)
            a, b = x[0, pos, 0, 2 * i], x[0, pos, 0, 2 * i + 1]
            expected = torch.stack(
                (
                    a * math.cos(angle) - b * math.sin(angle),
                    a * math.sin(angle) + b * math.cos(angle),
                )
            )
            torch.testing.assert_close(out[0, pos, 0, 2 * i : 2 * i + 2], expected)


def test_qwen3_gate_multiplies_each_head_output():
    # q_proj's output per head is (query: first hd, gate: last hd); the gate is neither
    # normalised nor rotated, and sigmoid(gate) scales that head's attention output.
    model = tiny_model("qwen3")
    attention = model.blocks[0].self_attn
    x = torch.randn(1, 8, 32)
    rope = model.rope[:8]
    with torch.no_grad():
        query_and_gate = attention.q_proj(x).view(1, 8, 2, 32)
        q, gate = query_and_gate[..., :16], query_and_gate[..., 16:]
        k = attention.k_proj(x).view(1, 8, 2, 16)
        v = attention.v_proj(x).view(1, 8, 2, 16)
        q = apply_rope(attention.q_norm(q), rope).transpose(1, 2)
        k = apply_rope(attention.k_norm(k), rope).transpose(1, 2)
        heads = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True)
        expected = attention.o_proj((heads.transpose(1, 2) * torch.sigmoid(gate)).flatten(2))
        torch.testing.assert_close(attention(x, rope), expected)


def test_cache_accepts_a_block_of_tokens_after_a_prefix(arch):
    model = tiny_model(arch).eval()
    idx = torch.randint(0, VOCAB, (2, 12))
    caches = [KVCache(12) for _ in model.blocks]
    with torch.no_grad():
        model.hidden_states(idx[:, :5], caches, pos=0)
        continued = model.hidden_states(idx[:, 5:], caches, pos=5)
        full = model.hidden_states(idx)
    torch.testing.assert_close(continued, full[:, 5:])


def test_model_built_on_meta_device_materialises(arch):
    config = tiny_config(arch)
    with torch.device("meta"):
        model = build_model(config)
    model.to_empty(device="cpu")
    model.init_weights()
    reference = build_model(config)
    torch.testing.assert_close(model.rope, reference.rope)
    assert model.embed.weight.std().item() == pytest.approx(
        reference.embed.weight.std().item(), rel=0.1
    )
    idx = torch.randint(0, VOCAB, (1, 8))
    assert torch.isfinite(model(idx, idx).loss)


def test_config_round_trip_and_registry_errors():
    config = ModelConfig.from_heads(
        "qwen3", 2, vocab_size=1000, max_seq_len=32, init="KarpathyGPT2"
    )
    assert ModelConfig.from_dict(config.to_dict()) == config
    assert (config.n_layer, config.n_embd, config.head_dim, config.mlp_hidden) == (4, 256, 128, 768)
    with pytest.raises(ValueError, match="enoki, qwen3, llama, qwen3next"):
        build_model("gpt5", **{k: v for k, v in config.to_dict().items() if k != "arch"})
    with pytest.raises(ValueError, match="ScaledGPT"):
        ModelConfig.from_heads("enoki", 2, 100, 16, init="xavier")
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({**config.to_dict(), "dropout": 0.1})
    assert build_model(config, n_layer=1).config.n_layer == 1
