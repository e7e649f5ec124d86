import json
import math

import pytest

from danastar import scaling
from danastar.models import ModelConfig, build_model
from danastar.models.meta import build_meta_model
from danastar.scaling import make_plan


@pytest.mark.parametrize(
    "heads, total, iterations",
    [
        (3, 20.2e6, 6165),
        (6, 45.7e6, 13950),
        (12, 141e6, 43020),
        (24, 664e6, 202680),
        (40, 2.62e9, 798600),
    ],
)
def test_enoki_reference_ladder(heads, total, iterations):
    plan = make_plan("enoki", "adamw", heads)
    assert plan.model.padded_vocab_size == 50304
    assert float(f"{plan.params.total_params:.3g}") == total
    assert plan.iterations == iterations
    assert plan.warmup_steps == iterations // 50
    assert plan.tokens_per_step == 32 * 2048


def test_reference_learning_rates_enoki_h12():
    # The spec quotes 1.23e-3 and 3.38e-4. Its three-digit coefficients give AdamW 1.2247e-3;
    # rounding a (±0.4%) and d (±0.0005, i.e. ±0.9% of γ at P ≈ 6e7) allows that much.
    assert make_plan("enoki", "adamw", 12).lr == pytest.approx(1.23e-3, rel=1e-2)
    assert f"{make_plan('enoki', 'adana', 12, kappa=0.85).lr:.3g}" == "0.000338"


def test_lr_law_formula_and_kappa_lookup():
    plan = make_plan("enoki", "adana", 6, kappa=0.83)  # nearest tabulated κ is 0.85
    assert plan.params.non_embedding_params == 12 * 384**2 * 4
    assert plan.lr == 2.25e1 * (1.22e5 + plan.params.non_embedding_params) ** -0.618
    assert plan.lr_rule == "enoki/batch32/adana/kappa0.85"
    assert make_plan("enoki", "adana", 6, kappa=0.77).lr_rule.endswith("kappa0.75")
    assert make_plan("enoki", "adana", 6, kappa=0.99).lr_rule.endswith("kappa0.9")
    # equidistant from 0.75 and 0.85: the larger κ
    assert make_plan("enoki", "dana-mk4", 6, kappa=0.80).lr_rule.endswith("kappa0.85")


def test_global_batch_picks_the_table():
    p = make_plan("enoki", "adamw", 6, batch_size=64, acc_steps=8)  # global batch 512
    assert p.lr_rule == "enoki/batch512/adamw"
    assert p.lr == 1.67e1 * (1.58e7 + p.params.non_embedding_params) ** -0.464
    assert p.iterations == int(20 * p.params.total_params) // (512 * 2048)
    # per-rank micro-batch does not matter, only batch_size · acc_steps
    assert make_plan("enoki", "adamw", 6, batch_size=512, world_size=8).lr_rule == p.lr_rule
    # 512 without a row for this optimizer, or another global batch: the batch-32 table
    assert make_plan("enoki", "muon", 6, batch_size=512).lr_rule == "enoki/batch32/muon"
    assert make_plan("enoki", "adamw", 6, batch_size=128).lr_rule == "enoki/batch32/adamw"


def test_qwen3_table_and_fallback():
    plan = make_plan("qwen3", "dana-star-mk4", 4)
    shape = plan.model
    assert (shape.n_layer, shape.n_embd, shape.head_dim, shape.mlp_hidden) == (8, 512, 128, 1536)
    assert plan.lr_rule == "qwen3/batch32/dana-star-mk4/kappa0.85"
    assert plan.lr == 9.39e1 * (1.71e4 + 12 * 512**2 * 8) ** -0.701
    counts = plan.params
    assert counts.exact_non_embedding_params > counts.non_embedding_params  # 14·d²·L, gated
    assert make_plan("qwen3", "ademamix", 4).lr_rule == "enoki/batch32/ademamix"


def test_independent_weight_decay():
    plan = make_plan("enoki", "dana-star-mk4", 6, omega=4.0)
    assert plan.wd_ts == plan.iterations // 10
    assert plan.weight_decay == 4.0 / plan.wd_ts
    assert plan.clipsnr == 2.0
    assert plan.optimizer_hparams == dict(
        delta=8.0, kappa=0.85, weight_decay=plan.weight_decay, wd_ts=plan.wd_ts, clipsnr=2.0
    )
    adana = make_plan("enoki", "adana", 6)
    assert "clipsnr" not in adana.optimizer_hparams and adana.clipsnr is None
    decaying = make_plan("enoki", "adamw-decaying-wd", 6)
    assert decaying.optimizer_hparams == dict(
        weight_decay=4.0 / decaying.wd_ts, wd_ts=decaying.wd_ts
    )


def test_coupled_weight_decay():
    for opt in ("adamw", "muon"):
        plan = make_plan("enoki", opt, 6, omega=2.0)
        assert plan.wd_ts is None
        assert plan.weight_decay == 2.0 / (plan.lr * plan.iterations)
        assert plan.optimizer_hparams == dict(weight_decay=plan.weight_decay)


def test_ademamix_hparams():
    plan = make_plan("enoki", "ademamix", 3, delta=8.0, kappa=0.85)
    t = plan.iterations
    assert plan.optimizer_hparams == dict(
        betas=(0.9, 0.999, 1 - 8.0 / t),
        alpha=t ** (1 - 0.85),
        alpha_warmup=t,
        beta3_warmup=t,
        weight_decay=4.0 / (plan.lr * t),
    )
    decaying = make_plan("enoki", "ademamix-decaying-wd", 3).optimizer_hparams
    assert decaying["decaying_wd"] is True and decaying["wd_ts"] == t // 10
    assert decaying["weight_decay"] == 4.0 / (t // 10)


def test_overrides_propagate_downstream():
    plan = make_plan("enoki", "adana", 6, iterations=1000)
    assert (plan.iterations, plan.warmup_steps, plan.wd_ts) == (1000, 20, 100)
    assert plan.weight_decay == 4.0 / 100 and plan.tokens == 1000 * 65536
    coupled = make_plan("enoki", "adamw", 6, lr=1e-3, iterations=500)
    assert coupled.lr_rule == "override" and coupled.weight_decay == 4.0 / (1e-3 * 500)
    fixed = make_plan("enoki", "adamw", 6, weight_decay=0.1, warmup_steps=7)
    assert fixed.weight_decay == 0.1 and fixed.optimizer_hparams["weight_decay"] == 0.1
    assert fixed.warmup_steps == 7
    wider = make_plan("enoki", "adamw", 6, n_embd=512)
    assert wider.params.non_embedding_params == 12 * 512**2 * 4
    assert wider.lr < make_plan("enoki", "adamw", 6).lr
    assert make_plan("enoki", "adamw", 6, tokens=65536 * 10).iterations == 10


def test_optimizers_without_a_law_need_lr():
    with pytest.raises(ValueError, match="pass lr"):
        make_plan("enoki", "sgd", 3)
    with pytest.raises(ValueError, match="pass lr"):
        make_plan("enoki", "torch:NAdam", 3)
    sgd = make_plan("enoki", "sgd", 3, lr=0.1)
    assert sgd.optimizer_hparams == {} and sgd.weight_decay == 0.0
    nadam = make_plan("enoki", "torch:NAdam", 3, lr=1e-3, weight_decay=0.01)
    assert nadam.optimizer_hparams == {"weight_decay": 0.01}


def test_invalid_input_names_the_choices():
    with pytest.raises(ValueError, match="enoki, qwen3"):
        make_plan("gpt5", "adamw", 3)
    with pytest.raises(ValueError, match="dana-star-mk4"):
        make_plan("enoki", "adamx", 3)
    for heads in (0, -2, 2.5):
        with pytest.raises(ValueError, match="heads"):
            make_plan("enoki", "adamw", heads)
    with pytest.raises(ValueError, match="no layers"):
        make_plan("enoki", "adamw", 1)  # ⌊3/4⌋ = 0 layers
    with pytest.raises(ValueError, match="unknown plan overrides"):
        make_plan("enoki", "adamw", 3, learning_rate=1.0)
    with pytest.raises(ValueError, match="clipsnr"):
        make_plan("enoki", "adana", 3, clipsnr=2.0)
    with pytest.raises(ValueError, match="world_size"):
        make_plan("enoki", "adamw", 3, batch_size=30, world_size=4)


def test_plan_is_json_ready_and_builds_its_model():
    plan = make_plan("qwen3", "adana", 2, vocab_size=1000, seq_len=128)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["optimizer_hparams"]["wd_ts"] == plan.wd_ts and data["heads"] == 2
    config = plan.model_config()
    assert config == ModelConfig.from_heads("qwen3", 2, vocab_size=1000, max_seq_len=128)
    model = build_model(config)
    assert model.num_params() == plan.params.exact_total_params
    assert model.num_params(exact=False) == plan.params.total_params


def test_dimensions_follow_the_heads_rule():
    for heads in (2, 3, 4, 7, 40):
        enoki = scaling.dimensions("enoki", heads)
        assert enoki == dict(
            n_layer=math.floor(3 * heads / 4),
            n_head=heads,
            n_embd=64 * heads,
            head_dim=64,
            mlp_hidden=256 * heads,
        )
        qwen3 = scaling.dimensions("qwen3", heads)
        assert qwen3 == dict(
            n_layer=2 * heads,
            n_head=heads,
            n_embd=128 * heads,
            head_dim=128,
            mlp_hidden=384 * heads,
        )


def test_ladder_table_lists_each_rung():
    table = scaling.ladder_table("enoki", "adamw", [3, 6])
    rows = table.splitlines()
    assert len(rows) == 4 and rows[2].startswith("| 3 | 2 | 192 |") and "| 6165 |" in rows[2]


def release_kappa_key(table: dict[str, dict], kappa: float) -> str:
    """The original release's look-up (its compute_lr), written from its code: the κ formatted
    with two decimals if that key exists, else the nearest key (a stable sort, so the key
    listed first wins a tie)."""
    key = f"{float(kappa):.2f}"
    if key in table:
        return key
    if str(float(kappa)) in table:
        return str(float(kappa))
    return sorted(table, key=lambda k: abs(float(k) - float(kappa)))[0]


@pytest.mark.parametrize("opt, kappa", [
    ("adana", 0.775), ("adana", 0.825), ("adana", 0.875),  # midpoints of the 0.05 grid
    ("dana-mk4", 0.80), ("dana-star", 0.80), ("dana-star-mk4", 0.80),
    ("adana", 0.7749), ("adana", 0.7751), ("adana", 0.846), ("adana", 0.8449), ("adana", 0.6),
    ("dana-mk4", 0.7999), ("dana-mk4", 0.8001), ("dana-mk4", 0.95),
])
def test_kappa_lookup_follows_the_release_at_midpoints(opt, kappa):
    rows = scaling.rules()["lr_laws"]["enoki"][32][opt]
    table = {f"{row['kappa']:.2f}": row for row in rows}  # the release's keys, in table order
    expected = float(release_kappa_key(table, kappa))
    plan = make_plan("enoki", opt, 6, kappa=kappa)
    assert plan.lr_rule == f"enoki/batch32/{opt}/kappa{expected}"


def test_kappa_ties_go_to_the_entry_listed_first():
    # 0.775 is exactly as far from 0.75 as from 0.80 in floating point: the release takes 0.75
    # (listed first); 0.825 is nearer 0.80 in floating point, 0.80 in dana-mk4's table nearer 0.85.
    assert make_plan("enoki", "adana", 6, kappa=0.775).lr_rule.endswith("kappa0.75")
    assert make_plan("enoki", "adana", 6, kappa=0.875).lr_rule.endswith("kappa0.85")
    assert make_plan("enoki", "adana", 6, kappa=0.825).lr_rule.endswith("kappa0.8")
    assert make_plan("enoki", "dana-mk4", 6, kappa=0.80).lr_rule.endswith("kappa0.85")


def test_a_models_parameters_are_counted_once_per_configuration(monkeypatch):
    """A sweep plans the same few models for each of its runs: each is built once."""
    builds = []
    monkeypatch.setattr(scaling, "build_meta_model", lambda config: builds.append(config) or
                        build_meta_model(config))
    config = ModelConfig.from_heads("qwen3", 2, vocab_size=123, max_seq_len=48)
    first = scaling.counted_non_embedding_params(config)
    built = len(builds)
    assert scaling.counted_non_embedding_params(ModelConfig.from_heads(
        "qwen3", 2, vocab_size=123, max_seq_len=48)) == first and len(builds) == built
    deeper = ModelConfig.from_heads("qwen3", 2, vocab_size=123, max_seq_len=48,
                                    n_layer=config.n_layer + 1)
    assert scaling.counted_non_embedding_params(deeper) > first and len(builds) == built + 1
