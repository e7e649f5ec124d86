"""The weight-decay API: the paper's form (omega, total_steps), the refusal of a constant decay
an AdamW habit would make destructive, and `param_groups` for any nn.Module."""

import io

import pytest
import torch
from torch import nn

from danastar.optim import (
    OPTIMIZERS,
    AdamWDecayingWD,
    ADana,
    AdEMAMix,
    DanaStar,
    build_optimizer,
    log_time_weight_decay,
    param_groups,
)
from danastar.optim.weight_decay import (
    EARLY_STEPS,
    MAX_EARLY_DECAY,
    fraction_kept,
    largest_constant_weight_decay,
)
from danastar.scaling import make_plan

# Every constructor with the independent, decaying weight decay, and its registry name.
DECAYING = {
    "adana": ADana,
    "dana-mk4": lambda params, **kw: ADana(params, clipsnr=2.0, **kw),
    "dana-star": DanaStar,
    "dana-star-mk4": lambda params, **kw: DanaStar(params, clipsnr=2.0, **kw),
    "adamw-decaying-wd": AdamWDecayingWD,
    "ademamix-decaying-wd": lambda params, **kw: AdEMAMix(params, decaying_wd=True, **kw),
}
each_decaying = pytest.mark.parametrize("name", list(DECAYING))


def problem(seed=0):
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(32, 6, generator=generator)
    targets = inputs @ torch.randn(6, 2, generator=generator)
    weight = torch.zeros(6, 2, requires_grad=True)

    def step(optimizer):
        optimizer.zero_grad()
        (inputs @ weight - targets).square().mean().backward()
        optimizer.step()
    return weight, step


@each_decaying
@pytest.mark.parametrize("total_steps", [1, 9, 10, 999, 100_000])
def test_paper_form_derives_what_the_training_plan_derives(name, total_steps):
    optimizer = DECAYING[name]([torch.zeros(2, requires_grad=True)], lr=1e-3, omega=4.0,
                               total_steps=total_steps)
    group = optimizer.param_groups[0]
    wd_ts = max(1, total_steps // 10)
    assert (group["weight_decay"], group["wd_ts"]) == (4.0 / wd_ts, wd_ts)
    assert (group["weight_decay"], group["wd_ts"]) == log_time_weight_decay(4.0, total_steps)
    plan = make_plan("enoki", name, 2, iterations=total_steps, lr=1e-3)
    assert (plan.weight_decay, plan.wd_ts) == (group["weight_decay"], group["wd_ts"])
    assert plan.optimizer_hparams["weight_decay"] == group["weight_decay"]
    assert plan.optimizer_hparams["wd_ts"] == group["wd_ts"]


@each_decaying
def test_paper_form_steps_as_the_explicit_form_and_resumes_exactly(name):
    paper = [problem(), problem(), problem()]
    optimizers = [DECAYING[name]([weight], lr=0.05, omega=4.0, total_steps=200)
                  for weight, _ in paper[:2]]
    explicit = DECAYING[name]([paper[2][0]], lr=0.05, weight_decay=4.0 / 20, wd_ts=20)
    for _ in range(3):
        for (_, step), optimizer in zip(paper, [*optimizers, explicit]):
            step(optimizer)
    assert torch.equal(paper[0][0], paper[2][0])
    # a state dict of the paper's form, saved and loaded into a fresh one, goes on exactly
    buffer = io.BytesIO()
    torch.save(optimizers[1].state_dict(), buffer)
    buffer.seek(0)
    weight, step = problem()
    with torch.no_grad():
        weight.copy_(paper[1][0])
    resumed = DECAYING[name]([weight], lr=0.05, omega=4.0, total_steps=200)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    for _ in range(3):
        step(resumed)
        paper[0][1](optimizers[0])
    assert torch.equal(weight, paper[0][0])


def test_build_optimizer_takes_the_paper_form():
    optimizer = build_optimizer("dana-star-mk4", [torch.zeros(2, requires_grad=True)], lr=1e-3,
                                omega=4.0, total_steps=5000)
    assert (optimizer.param_groups[0]["weight_decay"], optimizer.param_groups[0]["wd_ts"]) == (
        0.008, 500)


def one_param():
    return [torch.zeros(3, requires_grad=True)]


@pytest.mark.parametrize("build, fragments", [
    # AdamW's habit: a weight_decay applied at every step, not multiplied by the LR
    (lambda: ADana(one_param(), lr=3e-4, weight_decay=0.1),
     ["would remove 99.997% of it in 100 steps", "ADana(params, lr=..., omega=4.0, total_steps=T)",
      "wd_ts=T // 10"]),
    (lambda: DanaStar(one_param(), weight_decay=0.01), ["63.4%", "DanaStar(params, lr=..., omega"]),
    (lambda: AdamWDecayingWD(one_param(), weight_decay=1e-3), ["9.5%", "AdamWDecayingWD("]),
    (lambda: AdEMAMix(one_param(), decaying_wd=True, weight_decay=0.1),
     ["AdEMAMix(params, lr=..., decaying_wd=True, omega=4.0, total_steps=T)"]),
    (lambda: build_optimizer("dana-mk4", one_param(), lr=1e-3, weight_decay=0.1),
     ["ADana(params, lr=..., omega=4.0, total_steps=T)"]),
    (lambda: ADana([{"params": one_param(), "weight_decay": 0.05}], lr=1e-3),
     ["weight_decay=0.05 with wd_ts=None"]),
    (lambda: ADana(one_param(), omega=4.0), ["omega needs total_steps as well",
                                             "ADana(params, lr=..., omega=4.0, total_steps=T)"]),
    (lambda: ADana(one_param(), omega=4.0, total_steps=1000, weight_decay=0.04),
     ["either as omega and total_steps", "or explicitly, ADana(params, lr=..., weight_decay=..., "
      "wd_ts=...), not both"]),
    (lambda: ADana(one_param(), omega=4.0, total_steps=1000, wd_ts=100), ["not both"]),
    (lambda: ADana([{"params": one_param(), "weight_decay": 0.1}], omega=4.0, total_steps=1000),
     ["a param group sets its own weight_decay or wd_ts"]),
    (lambda: AdEMAMix(one_param(), omega=4.0, total_steps=1000),
     ["they need decaying_wd=True: AdEMAMix(params, lr=..., decaying_wd=True, omega=4.0"]),
    (lambda: ADana(one_param(), omega=4.0, total_steps=0), ["total_steps must be a whole number"]),
    (lambda: ADana(one_param(), omega=4.0, total_steps=10.5), ["a whole number"]),
    (lambda: ADana(one_param(), omega=-1.0, total_steps=100), ["omega must be >= 0"]),
], ids=["adamw-habit", "dana-star-0.01", "adamw-dwd-1e-3", "ademamix", "registry", "group",
        "omega-alone", "both-forms", "both-forms-wd-ts", "group-and-omega",
        "ademamix-coupled-omega", "zero-steps", "fractional-steps", "negative-omega"])
def test_refusals_show_the_right_call(build, fragments):
    with pytest.raises(ValueError) as error:
        build()
    message = str(error.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_the_threshold_is_five_percent_of_a_weight_over_the_first_100_steps():
    largest = largest_constant_weight_decay()
    assert 1 - fraction_kept(largest, None) == pytest.approx(MAX_EARLY_DECAY, rel=1e-9)
    assert (1 - largest) ** EARLY_STEPS == pytest.approx(1 - MAX_EARLY_DECAY, rel=1e-9)
    assert largest == pytest.approx(5.128e-4, rel=1e-3)
    ADana(one_param(), weight_decay=largest)
    with pytest.raises(ValueError, match="at most 5.1e-04"):
        ADana(one_param(), weight_decay=largest * 1.01)
    # what an AdamW recipe removes per step (lr x weight_decay) is accepted as a constant decay
    for per_step in (3e-5, 1e-4, 5e-4):
        ADana(one_param(), weight_decay=per_step)
    # a decay of 1 or more is refused (it would zero or flip every weight)
    for weight_decay in (1.0, 1.5, 3.0):
        assert fraction_kept(weight_decay, None) == 0
        with pytest.raises(ValueError, match="would remove all of it"):
            ADana(one_param(), weight_decay=weight_decay)


def test_what_stays_accepted():
    ADana(one_param(), weight_decay=0.1, wd_ts=100)  # the explicit form, with a time scale
    ADana(one_param(), omega=0.0, total_steps=100)  # no decay
    AdEMAMix(one_param(), weight_decay=0.1)  # AdEMAMix's coupled decay is AdamW's
    build_optimizer("adamw", one_param(), lr=1e-3, weight_decay=0.1)
    build_optimizer("muon", [("w", torch.zeros(3, 3, requires_grad=True))], lr=0.02,
                    weight_decay=0.1)


def test_a_refused_group_added_later_is_not_kept():
    optimizer = ADana(one_param(), lr=1e-3, omega=4.0, total_steps=1000)
    with pytest.raises(ValueError, match="wd_ts=None"):
        optimizer.add_param_group({"params": one_param(), "weight_decay": 0.1, "wd_ts": None})
    assert len(optimizer.param_groups) == 1
    optimizer.add_param_group({"params": one_param(), "weight_decay": 0.0})
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.04, 0.0]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("iterations", [9, 12, 40, 10_000])
def test_every_training_plan_builds_its_optimizer(name, iterations):
    """What danastar's own runs pass (the plan's hyperparameters) is never refused."""
    plan = make_plan("enoki", name, 2, iterations=iterations, lr=1e-3)
    model = nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 4))
    build_optimizer(name, param_groups(model, plan.weight_decay), lr=plan.lr,
                    **plan.optimizer_hparams)


class HandBuilt(nn.Module):
    """Every kind of parameter a model outside danastar may have."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.bag = nn.EmbeddingBag(5, 8)
        self.norm = nn.LayerNorm(8)
        self.batch_norm = nn.BatchNorm1d(8)
        self.custom_norm = RMSNorm(8)
        self.proj = nn.Linear(8, 8)  # weight decays, bias does not
        self.conv = nn.Conv1d(8, 8, 3)
        self.experts = nn.Parameter(torch.zeros(2, 8, 8))  # a stack of matrices
        self.temperature = nn.Parameter(torch.ones(()))
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight  # tied to the embedding


class RMSNorm(nn.Module):
    """A norm of another library: recognised by its class name."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.offset = nn.Parameter(torch.zeros(1, dim))  # 2-D, still a norm's


def test_param_groups_rule_on_a_hand_built_module():
    decay, no_decay = param_groups(HandBuilt(), weight_decay=1e-4)
    assert decay["names"] == ["experts", "proj.weight", "conv.weight"]
    assert decay["weight_decay"] == 1e-4 and no_decay["weight_decay"] == 0.0
    assert sorted(no_decay["names"]) == sorted([
        "temperature", "embed.weight", "bag.weight", "norm.weight", "norm.bias",
        "batch_norm.weight", "batch_norm.bias", "custom_norm.weight", "custom_norm.offset",
        "proj.bias", "conv.bias"])  # the tied head is the embedding; frozen ones are left out
    model = HandBuilt()
    for group in param_groups(model):
        assert [dict(model.named_parameters())[n] for n in group["names"]] == group["params"]


def test_param_groups_on_torch_transformer_with_the_paper_form():
    torch.manual_seed(0)
    model = nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                           dim_feedforward=16, dropout=0.0, batch_first=True)
    groups = param_groups(model)
    decay, no_decay = groups
    named = dict(model.named_parameters())
    assert set(decay["names"]) == {n for n, p in named.items() if p.ndim == 2}
    assert "encoder.layers.0.self_attn.in_proj_weight" in decay["names"]
    assert "weight_decay" not in decay  # left to the optimizer
    assert all(n.endswith("bias") or ".norm" in n for n in no_decay["names"])
    assert len(decay["names"]) + len(no_decay["names"]) == len(named)
    optimizer = ADana(groups, lr=1e-2, omega=4.0, total_steps=1000)
    assert [(g["weight_decay"], g["wd_ts"]) for g in optimizer.param_groups] == [
        (0.04, 100), (0.0, 100)]
    source, target = torch.randn(2, 5, 8), torch.randn(2, 3, 8)
    losses = []
    for _ in range(10):
        optimizer.zero_grad()
        loss = model(source, target).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    # AdamW's habit through the groups is refused as well
    with pytest.raises(ValueError, match="omega=4.0, total_steps=T"):
        ADana(param_groups(model, weight_decay=0.1), lr=1e-3)
    torch.optim.AdamW(param_groups(model, weight_decay=0.1), lr=1e-3)  # where it belongs


@pytest.mark.parametrize("cls", [ADana, DanaStar, AdamWDecayingWD])
def test_total_steps_alone_takes_the_papers_omega(cls):
    """ω defaults to the paper's 4 (the value at every size it trained); T has no default."""
    alone, given = cls(one_param(), total_steps=1000), cls(one_param(), omega=4.0,
                                                             total_steps=1000)
    assert [(g["weight_decay"], g["wd_ts"]) for g in alone.param_groups] == \
        [(g["weight_decay"], g["wd_ts"]) for g in given.param_groups] == [(0.04, 100)]
