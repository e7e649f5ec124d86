"""The mixture-of-experts layer: routing, its dense limits, router losses, gradients of unrouted
experts, the grouped matmul, and what the model and optimizers make of it."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from danastar.models import ModelConfig, build_model, param_counts
from danastar.models.moe import MoE, expert_matmul, grouped_mm_works, router_losses
from danastar.models.parallelize import apply_activation_checkpointing
from danastar.optim import build_optimizer
from danastar.optim.muon import StackedMuon

from model_fixtures import VOCAB, tiny_config, tiny_model

pytestmark = pytest.mark.filterwarnings("ignore:with one expert per token")


def moe_layer(arch="enoki", seed=0, **overrides):
    """A float64 MoE layer of a tiny model (d 32, hidden 64): its own init, no model around."""
    config = tiny_config(arch, moe=True, **overrides)
    torch.manual_seed(seed)
    model = build_model(config).double()
    return next(b.mlp for b in model.blocks if isinstance(b.mlp, MoE))


def expert_output(experts, e, x):
    """Expert e of a stacked `Experts` as the plain MLP it stands for."""
    up = x @ experts.up_proj[e].T
    hidden = F.silu(x @ experts.gate_proj[e].T) * up if experts.swiglu else F.gelu(up)
    return hidden @ experts.down_proj[e].T


@pytest.mark.parametrize("arch, order, shared", [("enoki", "topk_softmax", 0),
                                                 ("qwen3", "softmax_topk", 1),
                                                 ("enoki", "softmax_topk", 2)])
def test_routing_every_expert_is_the_softmax_weighted_sum(arch, order, shared):
    layer = moe_layer(arch, moe_num_experts=5, moe_num_shared_experts=shared,
                      moe_num_experts_per_tok=5 - shared, moe_softmax_order=order)
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    flat = x.view(-1, 32)
    probs = torch.softmax(flat @ layer.router.weight.T, dim=-1)
    expected = sum(probs[:, e:e + 1] * expert_output(layer.experts, e, flat)
                   for e in range(5 - shared))
    for s in range(shared):
        expected = expected + expert_output(layer.shared_experts, s, flat)
    torch.testing.assert_close(layer(x), expected.view(2, 7, 32))


@pytest.mark.parametrize("arch", ["enoki", "llama"])
def test_one_expert_is_the_dense_mlp_and_k1_warns(arch):
    with pytest.warns(UserWarning, match="no gradient"):
        layer = moe_layer(arch, moe_num_experts=1, moe_num_experts_per_tok=1)
    dense = tiny_model(arch).double().blocks[0].mlp
    with torch.no_grad():
        for name in ("up_proj", "down_proj") + (("gate_proj",) if arch != "enoki" else ()):
            getattr(dense, name).weight.copy_(getattr(layer.experts, name)[0])
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    torch.testing.assert_close(layer(x), dense(x))


def test_both_orders_select_the_same_experts_with_their_weights():
    layer = moe_layer(moe_num_experts=6, moe_num_experts_per_tok=2)
    x = torch.randn(40, 32, dtype=torch.float64)
    logits, renormalised, chosen = layer.route(x)
    layer.softmax_order = "softmax_topk"
    _, top_probs, chosen_too = layer.route(x)
    assert torch.equal(chosen, chosen_too)
    probs = torch.softmax(logits, dim=-1).gather(1, chosen)
    torch.testing.assert_close(top_probs, probs)
    torch.testing.assert_close(renormalised, probs / probs.sum(-1, keepdim=True))
    assert logits.dtype == torch.float32  # the router runs in float32 whatever the model dtype


def test_shared_experts_add_and_a_zero_gate_halves_the_gated_shared_expert():
    layer = moe_layer("qwen3next", moe_num_experts=4, use_gated_shared_expert=True,
                      shared_expert_intermediate_size=48)
    assert layer.shared_expert.up_proj.weight.shape == (48, 32)
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    with torch.no_grad():
        layer.shared_expert_gate.weight.zero_()
        with_gate = layer(x)
        routed_only = copy.deepcopy(layer)
        routed_only.shared_expert = None
        torch.testing.assert_close(with_gate, routed_only(x) + 0.5 * layer.shared_expert(x))


def test_router_losses_at_uniform_routing_and_by_hand():
    logits = torch.zeros(12, 4)
    counts = torch.tensor([6, 6, 6, 6])  # k = 2 of R = 4
    losses = router_losses(logits, counts)
    assert losses["aux"].item() == pytest.approx(2 / 4)
    assert losses["z"].item() == pytest.approx(math.log(4) ** 2)
    assert losses["entropy"].item() == pytest.approx(-math.log(4))
    # three tokens, two experts, k = 1: softmax rows (1/4, 3/4), (3/4, 1/4), (1/4, 3/4)
    third = math.log(3)
    logits = torch.tensor([[0.0, third], [third, 0.0], [0.0, third]])
    losses = router_losses(logits, torch.tensor([1, 2]))
    assert losses["aux"].item() == pytest.approx(1 / 3 * 5 / 12 + 2 / 3 * 7 / 12)
    assert losses["z"].item() == pytest.approx(math.log(4) ** 2)
    mean = torch.tensor([5 / 12, 7 / 12])
    assert losses["entropy"].item() == pytest.approx((mean * mean.log()).sum().item())


@pytest.mark.parametrize("router_loss, terms", [
    ("load_balancing_z_loss", {"aux": 0.1, "z": 0.01}),
    ("load_balancing_only", {"aux": 0.1}),
    ("entropy", {"entropy": 0.01}),
])
def test_training_loss_adds_weighted_router_losses_and_eval_adds_none(router_loss, terms):
    model = tiny_model("qwen3", n_layer=3, moe=True, moe_num_experts=4,
                       moe_router_loss=router_loss)
    idx = torch.randint(0, VOCAB, (2, 16))
    out = model(idx, idx)
    moe = out.moe
    added = sum(factor * moe[f"moe_{name}_loss"] for name, factor in terms.items()) / 3
    torch.testing.assert_close(out.loss - (out.ce + out.z), added)
    assert moe["moe_load"].shape == (3, 4)
    torch.testing.assert_close(moe["moe_load"].sum(1), torch.ones(3))
    assert moe["moe_max_load"] == moe["moe_load"].max() * 4 and moe["moe_max_load"] >= 1
    assert moe["moe_dropped_fraction"] == 0
    assert not any(value.requires_grad for value in moe.values())
    model.eval()
    with torch.no_grad():
        evaluated = model(idx, idx)
    torch.testing.assert_close(evaluated.loss, evaluated.ce + evaluated.z)
    torch.testing.assert_close(evaluated.moe["moe_aux_loss"], moe["moe_aux_loss"])
    assert tiny_model("qwen3")(idx, idx).moe == {}


def route_everything_to_expert_zero(layer):
    """Positive inputs and a router whose row 0 is the only positive one."""
    with torch.no_grad():
        layer.router.weight.fill_(-1.0)
        layer.router.weight[0] = 1.0
    return torch.rand(2, 8, 32, dtype=torch.float64)


@pytest.mark.parametrize("arch", ["enoki", "qwen3"])
def test_unrouted_experts_get_exact_zero_gradients_and_k1_no_router_gradient(arch):
    layer = moe_layer(arch, moe_num_experts=4, moe_num_experts_per_tok=1)
    x = route_everything_to_expert_zero(layer)
    layer(x).square().sum().backward()
    for name, param in layer.experts.named_parameters():
        assert param.grad is not None, name
        assert torch.count_nonzero(param.grad[1:]) == 0, name
        assert torch.count_nonzero(param.grad[0]) > 0, name
    # top-1 with the softmax after the top-k: the weight is 1, the LM loss reaches no router
    assert layer.router.weight.grad is not None
    assert torch.count_nonzero(layer.router.weight.grad) == 0
    assert layer.load.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_dana_star_tau_stays_zero_for_an_unrouted_expert():
    layer = moe_layer(moe_num_experts=4, moe_num_experts_per_tok=1)
    x = route_everything_to_expert_zero(layer)
    optimizer = build_optimizer("dana-star-mk4", layer.parameters(), lr=1e-3)
    for _ in range(3):
        optimizer.zero_grad()
        layer(x).square().mean().backward()
        optimizer.step()
    state = optimizer.state[layer.experts.up_proj]
    assert state["step"].item() == 3  # the clock advanced for every expert...
    assert torch.count_nonzero(state["tau"][1:]) == 0  # ...while τ of the unrouted stayed 0
    assert state["tau"][0].min() > 0
    assert layer.load.tolist() == [1.0, 0.0, 0.0, 0.0]  # the router did not move


@pytest.mark.skipif(not grouped_mm_works(torch.device("cpu"), torch.bfloat16, 16, 24),
                    reason="torch._grouped_mm does not run on this CPU build")
def test_grouped_matmul_equals_the_loop():
    counts = torch.tensor([5, 0, 7, 3])
    x = torch.randn(15, 16, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(4, 24, 16, dtype=torch.bfloat16, requires_grad=True)
    results = []
    for grouped in (True, False):
        x.grad = weight.grad = None
        out = expert_matmul(x, weight, counts, grouped=grouped)
        out.sum().backward()  # an expanded gradient, which _grouped_mm alone refuses
        results.append((out, x.grad, weight.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)
    assert torch.count_nonzero(results[0][2][1]) == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_grouped_matmul_on_cuda_equals_the_loop_and_is_chosen():
    device = torch.device("cuda")
    assert grouped_mm_works(device, torch.bfloat16, 64, 128)
    counts = torch.tensor([40, 0, 24, 8], device=device)
    x = torch.randn(72, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(4, 128, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    results = []
    for grouped in (True, False):
        x.grad = weight.grad = None
        out = expert_matmul(x, weight, counts, grouped=grouped)
        out.backward(torch.ones_like(out))
        results.append((out, x.grad, weight.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    assert torch.count_nonzero(results[0][2][1]) == 0


def test_dispatcher_runs_the_experts_and_reports_drops():
    layer = moe_layer(moe_num_experts=4)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    reference = layer(x)
    calls = []

    def dispatcher(x_sorted, counts, experts, token_order=None):
        # what expert parallelism does with one rank: run them, here dropping the last row
        calls.append(counts.tolist())
        out = experts(x_sorted, counts)
        out[-1] = 0
        return out, 1

    layer.dispatcher = dispatcher
    dispatched = layer(x)
    assert sum(calls[0]) == 2 * 5 * 2 and len(calls[0]) == 4
    changed = (dispatched - reference).abs().sum(-1).flatten() > 0
    assert changed.sum() == 1  # the token of the dropped pair lost only that expert's share
    assert layer.dropped == (1, 20)


def test_param_groups_init_counts_and_flops():
    model = tiny_model("enoki", n_layer=4, n_embd=64, n_head=4, mlp_hidden=256, moe=True,
                       moe_num_experts=6, moe_num_shared_experts=1, moe_num_experts_per_tok=2)
    experts = model.blocks[0].mlp.experts
    decay, no_decay = model.param_groups(0.1)
    assert {"blocks.0.mlp.experts.up_proj", "blocks.0.mlp.experts.down_proj",
            "blocks.0.mlp.shared_experts.up_proj", "blocks.0.mlp.router.weight"} <= set(
        decay["names"])
    assert all("experts" not in name for name in no_decay["names"])
    assert experts.up_proj[3].std().item() == pytest.approx(64**-0.5, rel=0.05)
    assert experts.down_proj[3].std().item() == pytest.approx((2 * 256 * 4) ** -0.5, rel=0.05)
    counts = param_counts(model.config)
    assert model.num_params(non_embedding=True) == counts.non_embedding
    active = model.num_params(non_embedding=True, active=True)
    assert active == counts.active_non_embedding
    # per MoE layer, 5 routed experts of which 2 are active: 3 inactive GELU experts of 2dh
    assert model.num_params() - model.num_params(active=True) == 4 * 3 * 2 * 64 * 256
    config = model.config
    assert model.flops_per_token(64) == 6 * (model.num_params(active=True)
                                             - model.embed.weight.numel()) + 12 * 4 * 4 * 16 * 64
    assert model.num_params(exact=False, non_embedding=True, active=True) == (
        12 * 64**2 * 4 + 4 * 2 * 2 * 64 * 256)
    assert counts.lr_law_params == 12 * config.n_embd**2 * config.n_layer


def test_ladder_counts_of_the_spec():
    config = ModelConfig.from_heads("enoki", 12, 50257, 2048, moe=True)
    counts = param_counts(config)
    assert round(counts.lr_law_params / 1e6, 1) == 63.7
    assert round(counts.lr_law_params_total / 1e6, 1) == 361.0
    assert round(counts.lr_law_params_active / 1e6, 1) == 106.2
    assert round(counts.active_non_embedding / 1e6, 1) == 106.2


@pytest.mark.parametrize("overrides, message", [
    (dict(moe_num_shared_experts=8), "below moe_num_experts"),
    (dict(moe_num_experts_per_tok=8, moe_num_shared_experts=1), "route fewer experts"),
    (dict(moe_num_experts_per_tok=0), "must be between 1 and the 8 routed experts"),
    (dict(moe_softmax_order="sparsemax"), "topk_softmax, softmax_topk"),
    (dict(moe_router_loss="none"), "load_balancing_z_loss"),
    (dict(moe_aux_loss_factor=-1.0), ">= 0"),
    (dict(decoder_sparse_step=2), "qwen3next only"),
    (dict(use_gated_shared_expert=True), "qwen3next only"),
])
def test_config_refuses_invalid_combinations(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config("enoki", moe=True, **overrides)


def test_muon_orthogonalises_each_expert_like_a_matrix_of_its_own():
    torch.manual_seed(0)
    stacked = torch.nn.Parameter(torch.randn(3, 8, 12))
    separate = [torch.nn.Parameter(stacked[e].detach().clone()) for e in range(3)]
    plain = torch.nn.Parameter(torch.randn(8, 12))
    twin = torch.nn.Parameter(plain.detach().clone())
    ours = StackedMuon([stacked, *separate, plain], lr=0.02, weight_decay=0.1,
                       adjust_lr_fn="match_rms_adamw")
    reference = torch.optim.Muon([twin], lr=0.02, weight_decay=0.1,
                                 adjust_lr_fn="match_rms_adamw")
    for _ in range(2):
        grads = torch.randn(3, 8, 12)
        stacked.grad = grads.clone()
        for e, param in enumerate(separate):
            param.grad = grads[e].clone()
        plain.grad = twin.grad = torch.randn(8, 12)
        ours.step()
        reference.step()
    torch.testing.assert_close(stacked.detach(), torch.stack([p.detach() for p in separate]))
    torch.testing.assert_close(plain, twin)
    model = tiny_model("qwen3", moe=True, moe_num_experts=4)
    optimizer = build_optimizer("muon", model.param_groups(0.1), lr=0.02)
    muon_names = {name for group in optimizer.muon.param_groups for name in group["names"]}
    assert "blocks.0.mlp.experts.gate_proj" in muon_names
    model(*(torch.randint(0, VOCAB, (2, 8)),) * 2).loss.backward()
    optimizer.step()


def loss_and_grads(model, idx):
    model.zero_grad()
    out = model(idx, idx)
    out.loss.backward()
    grads = {name.replace("._checkpoint_wrapped_module", ""): p.grad.clone()
             for name, p in model.named_parameters()}
    return out.loss.detach(), grads


def test_checkpointing_and_state_dict_round_trip_equal_eager():
    model = tiny_model("enoki", moe=True, moe_num_experts=4, moe_num_shared_experts=1)
    idx = torch.randint(0, VOCAB, (2, 16))
    reference = loss_and_grads(model, idx)
    restored = build_model(model.config)
    restored.load_state_dict(model.state_dict())
    for other in (restored, apply_activation_checkpointing(copy.deepcopy(model))):
        loss, grads = loss_and_grads(other, idx)
        torch.testing.assert_close(loss, reference[0])
        for name, grad in grads.items():
            torch.testing.assert_close(grad, reference[1][name], msg=name)


def test_bf16_autocast_keeps_the_router_in_float32():
    model = tiny_model("qwen3", moe=True, moe_num_experts=4)
    idx = torch.randint(0, VOCAB, (2, 16))
    reference = model(idx, idx).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(idx, idx)
    assert out.loss.dtype == torch.float32
    torch.testing.assert_close(out.loss, reference, rtol=2e-2, atol=0)


# Inductor compiles are slow on CPU: one block, once.
@pytest.mark.slow
def test_compiled_block_equals_eager():
    model = tiny_model("qwen3", n_layer=1, moe=True, moe_num_experts=4)
    idx = torch.randint(0, VOCAB, (2, 16))
    reference = loss_and_grads(model, idx)
    model.blocks[0].compile()
    loss, grads = loss_and_grads(model, idx)
    torch.testing.assert_close(loss, reference[0], rtol=1e-5, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference[1][name], rtol=1e-4, atol=1e-6, msg=name)
