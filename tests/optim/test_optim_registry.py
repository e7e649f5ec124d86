"""The registry, its errors, the Muon route and the diagnostics."""

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
    MuonWithAdamW,
    apply_schedule,
    build_optimizer,
)


class TinyLM(nn.Module):
    """The parameter names the framework's models use: embed, blocks, lm_head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8))
                                     for _ in range(2)])
        self.lm_head = nn.Linear(8, 16, bias=False)

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.blocks:
            x = x + block(x)
        return self.lm_head(x)

    def param_groups(self, weight_decay):
        decay = [(n, p) for n, p in self.named_parameters() if p.ndim == 2]
        no_decay = [(n, p) for n, p in self.named_parameters() if p.ndim < 2]
        return [{"params": [p for _, p in group], "names": [n for n, _ in group],
                 "weight_decay": wd} for group, wd in ((decay, weight_decay), (no_decay, 0.0))]


def train(model, optimizer, steps):
    idx = torch.arange(12).reshape(3, 4)
    for _ in range(steps):
        optimizer.zero_grad()
        model(idx).logsumexp(-1).mean().backward()
        optimizer.step()


@pytest.mark.parametrize("name, cls, variant", [
    ("adana", ADana, {"clipsnr": None}),
    ("dana-mk4", ADana, {"clipsnr": 2.0}),
    ("dana-star", DanaStar, {"clipsnr": None}),
    ("dana-star-mk4", DanaStar, {"clipsnr": 2.0}),
    ("adamw", torch.optim.AdamW, {"betas": (0.9, 0.999)}),
    ("adamw-decaying-wd", AdamWDecayingWD, {}),
    ("ademamix", AdEMAMix, {"decaying_wd": False}),
    ("ademamix-decaying-wd", AdEMAMix, {"decaying_wd": True}),
    ("muon", MuonWithAdamW, {}),
    ("sgd", torch.optim.SGD, {}),
    ("torch:NAdam", torch.optim.NAdam, {}),
])
def test_every_name_builds_its_optimizer(name, cls, variant):
    model = TinyLM()
    optimizer = build_optimizer(name, model.param_groups(1e-4), lr=1e-3)
    assert type(optimizer) is cls
    for group in optimizer.param_groups:
        assert group["initial_lr"] == group["lr"] == 1e-3
        assert all(group[key] == value for key, value in variant.items())
    train(model, optimizer, 2)


def test_accepts_tensors_named_pairs_and_keeps_group_settings():
    model = TinyLM()
    for params in (model.parameters(), model.named_parameters()):
        optimizer = build_optimizer("dana-mk4", params, lr=1e-3, kappa=0.9, delta=4.0)
        group = optimizer.param_groups[0]
        assert (group["kappa"], group["delta"], group["clipsnr"]) == (0.9, 4.0, 2.0)
    optimizer = build_optimizer("adana", model.named_parameters(), lr=1e-3)
    assert optimizer.param_groups[0]["names"][0] == "embed.weight"
    groups = model.param_groups(0.1)
    optimizer = build_optimizer("adana", groups, lr=1e-3, weight_decay=0.5, wd_ts=100)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    assert optimizer.param_groups[0]["wd_ts"] == 100
    assert "initial_lr" not in groups[0]  # the caller's dicts are left alone


def test_pytorch_optimizer_names():
    pytest.importorskip("pytorch_optimizer")
    optimizer = build_optimizer("pytorch_optimizer:lion", TinyLM().parameters(), lr=1e-4)
    assert type(optimizer).__name__ == "Lion"
    assert optimizer.param_groups[0]["initial_lr"] == 1e-4


@pytest.mark.parametrize("name, hparams, message", [
    ("adamm", {}, "valid names: adana, dana-mk4"),
    ("torch:Adamm", {}, "torch.optim has"),
    ("pytorch_optimizer:no-such", {}, "pytorch_optimizer has"),
    ("adana", {"lr": -1.0}, "lr must be >= 0"),
    ("adana", {"kappa": 0.0}, "kappa must be in (0, 1]"),
    ("dana-star", {"kappa": 1.5}, "kappa must be in (0, 1]"),
    ("adana", {"delta": 0.0}, "delta must be > 0"),
    ("dana-mk4", {"clipsnr": 0.0}, "clipsnr must be None or > 0"),
    ("dana-star-mk4", {"clipsnr": -2.0}, "clipsnr must be None or > 0"),
    ("adana", {"weight_decay": -0.1}, "weight_decay must be >= 0"),
    ("adana", {"wd_ts": 0}, "wd_ts must be None or > 0"),
    ("adana", {"impl": "triton"}, "impl must be one of"),
    ("dana-star", {"impl": "foreach"}, "impl='foreach' is no longer a path: use impl='compiled'"),
    ("adamw-decaying-wd", {"betas": (0.9, 1.0)}, "betas must each be in [0, 1)"),
    ("ademamix", {"betas": (0.9, 0.999)}, "betas must be (beta1, beta2, beta3)"),
    ("ademamix", {"alpha_warmup": 0}, "alpha_warmup must be None or > 0"),
    ("adana", {"momentum": 0.9}, "unknown hyperparameter(s) momentum for optimizer 'adana'"),
])
def test_invalid_names_and_hyperparameters_raise_value_error(name, hparams, message):
    hparams = {"lr": 1e-3, **hparams}
    with pytest.raises(ValueError) as error:
        build_optimizer(name, TinyLM().parameters(), **hparams)
    assert message in str(error.value)


def test_registry_lists_the_spec_names():
    assert list(OPTIMIZERS) == ["adana", "dana-mk4", "dana-star", "dana-star-mk4", "adamw",
                                "adamw-decaying-wd", "ademamix", "ademamix-decaying-wd", "muon",
                                "sgd"]


def test_muon_partitions_the_parameters():
    model = TinyLM()
    optimizer = build_optimizer("muon", model.param_groups(0.1), lr=0.02)
    muon_params = [p for g in optimizer.muon.param_groups for p in g["params"]]
    adamw_params = [p for g in optimizer.adamw.param_groups for p in g["params"]]
    all_ids = [id(p) for p in muon_params + adamw_params]
    assert sorted(all_ids) == sorted(id(p) for p in model.parameters())  # a partition
    names = dict((id(p), n) for n, p in model.named_parameters())
    assert sorted(names[id(p)] for p in muon_params) == ["blocks.0.1.weight", "blocks.1.1.weight"]
    assert {"embed.weight", "lm_head.weight"} <= {names[id(p)] for p in adamw_params}
    for group in optimizer.muon.param_groups:
        assert (group["momentum"], group["nesterov"]) == (0.95, True)
        assert group["adjust_lr_fn"] == "match_rms_adamw" and group["weight_decay"] == 0.1
    decays = {tuple(g["names"]): g["weight_decay"] for g in optimizer.adamw.param_groups}
    assert decays[("embed.weight", "lm_head.weight")] == 0.1  # decay kept from its group
    assert all(wd == 0.0 for names_, wd in decays.items() if "embed.weight" not in names_)
    assert all(g["betas"] == (0.8, 0.999) for g in optimizer.adamw.param_groups)
    # One optimizer to the outside: its groups are the inner groups themselves.
    assert optimizer.param_groups == optimizer.muon.param_groups + optimizer.adamw.param_groups
    apply_schedule(optimizer, 0.5)
    assert all(g["lr"] == 0.01 for g in optimizer.muon.param_groups + optimizer.adamw.param_groups)


def test_muon_state_dict_round_trip_and_scheduler():
    torch.manual_seed(0)
    model, twin = TinyLM(), TinyLM()
    twin.load_state_dict(model.state_dict())
    optimizer = build_optimizer("muon", model.named_parameters(), lr=0.02, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    train(model, optimizer, 3)
    scheduler.step()
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    twin_optimizer = build_optimizer("muon", twin.named_parameters(), lr=0.02, weight_decay=0.1)
    with torch.no_grad():
        for a, b in zip(twin.parameters(), model.parameters()):
            a.copy_(b)
    twin_optimizer.load_state_dict(torch.load(buffer, weights_only=True))
    assert twin_optimizer.muon.state is twin_optimizer.state  # still one state after loading
    train(model, optimizer, 2)
    train(twin, twin_optimizer, 2)
    for a, b in zip(twin.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_muon_trains_bf16_parameters():
    torch.manual_seed(0)
    model = TinyLM().to(torch.bfloat16)
    optimizer = build_optimizer("muon", model.named_parameters(), lr=0.02)
    idx, targets = torch.arange(12).reshape(3, 4), torch.arange(12).reshape(3, 4).flip(1)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(idx).float().flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    # torch's Muon and AdamW keep their state in the parameter's dtype
    assert {v.dtype for s in optimizer.state.values() for k, v in s.items() if k != "step"} == {
        torch.bfloat16}


@pytest.mark.parametrize("cls, clipsnr", [(ADana, None), (ADana, 2.0), (DanaStar, None),
                                          (DanaStar, 2.0)])
def test_diagnostics_from_state(cls, clipsnr):
    model = TinyLM()
    optimizer = cls(model.parameters(), lr=1e-2, clipsnr=clipsnr)
    assert optimizer.diagnostics() == {}
    train(model, optimizer, 3)
    result = optimizer.diagnostics()
    states = list(optimizer.state.values())
    count = sum(s["exp_avg"].numel() for s in states)
    m_norm = sum(s["exp_avg"].double().square().sum() for s in states).sqrt()
    assert result["momentum_norm"] == pytest.approx(m_norm.item(), rel=1e-6)
    if cls is ADana:  # r = |m| / D, A = (1 + k)^(1 - kappa) r, at k = 3
        snr = [s["exp_avg"].abs() / (s["exp_avg_sq"].sqrt() + 1e-8) for s in states]
        damping = [(r * 4 ** 0.15).clamp(max=clipsnr or float("inf")) for r in snr]
        assert result["snr_mean"] == pytest.approx(sum(r.sum() for r in snr).item() / count)
        assert result["damping_mean"] == pytest.approx(
            sum(a.sum() for a in damping).item() / count)
    else:
        tau_mean = sum(s["tau"].double().sum() for s in states).item() / count
        assert result["tau_mean"] == pytest.approx(tau_mean)
        assert 0 < result["snr_mean"] and 0 < result["damping_mean"]
    if clipsnr is not None:
        assert result["damping_mean"] <= clipsnr
