"""The analysis functions against hand computations or independent small computations."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from danastar import scaling
from danastar.analysis import compute, fits, lrlaw, multiplier, seeds, sensitivity
from danastar.analysis.records import by_value


def test_compute_in_pfh_for_a_known_model():
    plan = scaling.make_plan("enoki", "adamw", 2, batch_size=8, seq_len=128).to_dict()
    # heads 2: d = 128, L = 1 -> 12·128²·1
    assert compute.compute_non_embedding(plan) == 12 * 128 ** 2 == 196608
    assert compute.pfh(compute.flops(196608, 1e9)) == pytest.approx(6 * 196608 * 1e9 / 3.6e18)
    total = plan["total_params"]
    assert compute.chinchilla_flops(196608, total) == pytest.approx(6 * 196608 * 20 * total)


def test_compute_uses_the_exact_count_for_qwen3():
    plan = scaling.make_plan("qwen3", "adamw", 2, batch_size=8, seq_len=128).to_dict()
    d, layers = plan["n_embd"], plan["n_layer"]
    d_attn = plan["n_head"] * plan["head_dim"]
    assert compute.compute_non_embedding(plan) == plan["exact_non_embedding_params"]
    # gated attention + SwiGLU: per layer 5·d·d_attn + 9·d², plus norms (a few per layer)
    norms = plan["exact_non_embedding_params"] - layers * (5 * d * d_attn + 9 * d * d)
    assert 0 < norms < layers * 6 * d + 4 * plan["head_dim"] * layers + d + 1


BASELINE = [(1.0, 4.0), (10.0, 3.0), (100.0, 2.5)]  # (compute, loss), decreasing


def test_measured_multiplier_interpolates_log_compute_in_log_loss():
    (point,) = multiplier.measured_multipliers(BASELINE, [(5.0, 3.5)])
    # by hand: between (log 4, log 1) and (log 3, log 10)
    frac = (math.log(3.5) - math.log(4.0)) / (math.log(3.0) - math.log(4.0))
    c_star = math.exp(frac * math.log(10.0))
    assert point.kind == multiplier.INTERPOLATED
    assert point.baseline_compute == pytest.approx(c_star)
    assert point.multiplier == pytest.approx(c_star / 5.0)
    # at a baseline point exactly: its own compute
    (exact,) = multiplier.measured_multipliers(BASELINE, [(2.0, 3.0)])
    assert exact.baseline_compute == pytest.approx(10.0) and exact.multiplier == pytest.approx(5)


def test_measured_multiplier_extrapolates_both_ways_and_marks_it():
    low, high = multiplier.measured_multipliers(BASELINE, [(50.0, 2.0), (0.5, 5.0)])
    slope_low = (math.log(100) - math.log(10)) / (math.log(2.5) - math.log(3.0))
    c_low = math.exp(math.log(100) + slope_low * (math.log(2.0) - math.log(2.5)))
    slope_high = (math.log(10) - math.log(1)) / (math.log(3.0) - math.log(4.0))
    c_high = math.exp(0 + slope_high * (math.log(5.0) - math.log(4.0)))
    assert low.kind == multiplier.EXTRAPOLATED_LOW and high.kind == multiplier.EXTRAPOLATED_HIGH
    assert low.baseline_compute == pytest.approx(c_low)
    assert high.baseline_compute == pytest.approx(c_high)
    assert high.multiplier == pytest.approx(c_high / 0.5)


def test_fitted_multiplier_inverts_the_baseline_curve_with_brent():
    floor = 1.0
    def base(c):
        return floor + 2.0 * c ** -0.3

    def opt(c):  # the baseline at 3x the compute: multiplier 3 everywhere
        return base(3.0 * c)

    cs, ms = multiplier.fitted_multipliers(base, opt, 1e-3, 1e3, floor=floor)
    assert len(cs) == 200 and np.allclose(ms, 3.0, rtol=1e-8)
    assert cs[0] == pytest.approx(0.5e-3) and cs[-1] == pytest.approx(2e3)

    def below(c):  # losses under the floor have no baseline compute: skipped
        return 0.5 + 0 * c

    cs, ms = multiplier.fitted_multipliers(base, below, 1.0, 10.0, floor=floor)
    assert len(cs) == 0


def test_compute_saved_by_the_earliest_crossing():
    curves = [([1.0, 2.0, 4.0], [5.0, 3.0, 2.0]), ([1.0, 2.0, 4.0], [5.0, 4.0, 2.9])]
    crossing = multiplier.compute_saved(3.0, curves)
    assert crossing.cross_compute == pytest.approx(2.0)
    assert crossing.saved == pytest.approx(2.0) and crossing.fraction_saved == pytest.approx(0.5)
    # between evaluations: log-linear interpolation, by hand
    cross = multiplier.first_crossing([1.0, 4.0], [4.0, 2.0], 3.0)
    assert cross == pytest.approx(math.exp(math.log(4) * math.log(4 / 3) / math.log(2)))
    assert multiplier.compute_saved(1.0, curves) is None


def test_broken_power_law_fit_recovers_known_parameters():
    true_floor = 1.8
    truth = {"adamw": (0.5, 0.45, 1.2, 0.08), "dana": (0.35, 0.5, 1.0, 0.1)}
    compute_grid = np.geomspace(1e-6, 1e3, 12)
    points = {name: (compute_grid, true_floor + b * compute_grid ** -c + e * compute_grid ** -f)
              for name, (b, c, e, f) in truth.items()}
    fit = fits.fit_power_laws(points)
    assert fit.floor == pytest.approx(true_floor, rel=0.02)
    for name, (b, c, e, f) in truth.items():
        p = fit.curves[name]
        assert (p.b, p.c, p.e, p.f) == pytest.approx((b, c, e, f), rel=0.05)
        assert p.r2 > 0.9999
    assert fit.predict("dana", 1.0) == pytest.approx(true_floor + 0.35 + 1.0, rel=1e-3)


def test_single_power_law_fit_and_its_r2():
    grid = np.geomspace(1e-4, 1e2, 8)
    y = 2.0 + 0.7 * grid ** -0.25
    fit = fits.fit_power_laws({"x": (grid, y)}, broken=False)
    assert (fit.floor, fit.curves["x"].b, fit.curves["x"].c) == pytest.approx((2, 0.7, 0.25),
                                                                            rel=1e-3)
    assert fit.r2 == pytest.approx(1.0)


def _synthetic_sweeps(a, b, d, seed):
    rng = np.random.default_rng(seed)
    points = []
    for size in (2e4, 6e4, 2e5, 6e5, 2e6, 6e6, 2e7):
        best = a * (b + size) ** d
        for factor in 2.0 ** np.arange(-1, 1.5, 0.5):  # five LRs around the optimum
            lr = best * factor * math.exp(rng.normal(0, 0.03))
            loss = 3.0 + 0.05 * math.log(lr / best) ** 2 + rng.normal(0, 0.002)
            points.append(lrlaw.SweepPoint(size, lr, loss))
    return points


def test_lr_law_fit_recovers_known_law_and_its_interval_covers_it():
    a, b, d = 12.8, 1.67e4, -0.515
    points = _synthetic_sweeps(a, b, d, seed=1)
    fit = lrlaw.fit_lr_law(points, bootstrap=200, predict_at=[1e8])
    assert fit.d == pytest.approx(d, abs=0.03)
    for size in (2e4, 2e5, 2e6, 2e7, 1e8):
        assert fit.lr(size) == pytest.approx(a * (b + size) ** d, rel=0.08)
    for name, value in zip("abd", (a, b, d)):
        low, high = fit.interval[name]
        assert low <= value <= high, (name, low, value, high)
    best, low, high = fit.predictions[1e8]
    assert low <= a * (b + 1e8) ** d <= high and low <= best <= high
    assert fit.bootstrap_samples > 150
    assert all(len(v) == 5 and v[0].weight == 5 for v in fit.points.values())
    row = fit.rules_row("adamw")
    assert row.startswith("adamw: [{a: ") and "d: -0.5" in row


def test_lr_law_on_exactly_three_sizes_has_no_interval_unless_b_is_held():
    a, b, d = 12.8, 1.67e4, -0.515
    points = [p for p in _synthetic_sweeps(a, b, d, seed=2) if p.params in (2e5, 6e5, 2e6)]
    free = lrlaw.fit_lr_law(points, bootstrap=200, predict_at=[1e7])
    # every resample of 3 sizes with 3 distinct ones is the same 3 reordered: no spread to show
    assert not free.has_interval and free.bootstrap_samples == 0
    assert all(math.isnan(low) and math.isnan(high) for low, high in free.interval.values())
    assert all(math.isnan(v) for v in free.predictions[1e7][1:])
    held = lrlaw.fit_lr_law(points, bootstrap=200, predict_at=[1e7], b=b)
    assert held.fixed_b and held.b == b and held.has_interval and held.bootstrap_samples > 100
    assert held.d == pytest.approx(d, abs=0.05)
    assert held.lr(1e7) == pytest.approx(a * (b + 1e7) ** d, rel=0.1)
    for name, value in (("a", held.a), ("d", held.d)):  # the resamples spread around the fit
        low, high = held.interval[name]
        assert low < value < high, (name, low, value, high)
    assert held.interval["b"] == (b, b)
    # with b held, the fit is the weighted least squares of log γ on log(b + P): check it
    chosen = [p for ps in held.points.values() for p in ps]
    w = np.array([p.weight ** 2 * p.params for p in chosen])
    x = np.log(b + np.array([p.params for p in chosen]))
    y = np.log([p.lr for p in chosen])
    slope = np.sum(w * (x - np.average(x, weights=w)) * (y - np.average(y, weights=w))) / \
        np.sum(w * (x - np.average(x, weights=w)) ** 2)
    assert held.d == pytest.approx(slope, rel=1e-9)
    with pytest.raises(ValueError, match="2 or more sizes"):
        lrlaw.fit_lr_law([p for p in points if p.params == 2e5], b=b)


def test_lr_law_top_k_merges_close_lrs_and_keeps_the_nearest_omega():
    points = [lrlaw.SweepPoint(1e5, 1e-3, 3.0), lrlaw.SweepPoint(1e5, 1.04e-3, 2.9),
              lrlaw.SweepPoint(1e5, 2e-3, 3.1), lrlaw.SweepPoint(1e5, 4e-3, 2.0, omega=8.0)]
    chosen = lrlaw.top_k(points, k=5)[1e5]
    assert [(p.lr, p.loss, p.weight) for p in chosen] == [(1.04e-3, 2.9, 5.0), (2e-3, 3.1, 4.0)]


def test_parabola_recovers_a_known_optimum():
    lr_star, zeta, floor = 3e-3, 0.08, 3.2
    lrs = lr_star * 2.0 ** np.arange(-3, 3.5, 1)
    losses = floor + zeta * np.log(lrs / lr_star) ** 2
    p = sensitivity.fit_parabola(list(zip(lrs, losses)))
    assert p.best_lr == pytest.approx(lr_star, rel=1e-6)
    assert p.best_loss == pytest.approx(floor, abs=1e-9)
    assert p.curvature == pytest.approx(zeta) and not p.refit_on_lowest
    assert sensitivity.lr_error_cost(zeta, 1.0) == pytest.approx(zeta * math.log(2) ** 2)


def test_parabola_refits_on_the_three_lowest_when_concave_and_refuses_few_lrs():
    lrs = [1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3]
    losses = [3.2, 3.6, 3.62, 3.5, 3.05]  # a hump: concave overall
    p = sensitivity.fit_parabola(list(zip(lrs, losses)))
    assert p.refit_on_lowest and sorted(p.losses) == [3.05, 3.2, 3.5]
    # three points: the parabola goes through each of them
    assert p.loss(np.array(p.lrs)) == pytest.approx(np.array(p.losses))
    with pytest.raises(ValueError, match="5 or more"):
        sensitivity.fit_parabola(list(zip(lrs[:4], losses[:4])))


def test_seed_mean_standard_error_and_t_statistic():
    m = seeds.mean_se([3.0, 3.2, 3.4])
    assert m.mean == pytest.approx(3.2) and m.se == pytest.approx(0.2 / math.sqrt(3))
    assert str(m) == "3.2000 ± 0.1155"
    diff = seeds.difference([3.0, 3.2, 3.4], [2.9, 3.0, 3.1])
    se = math.sqrt(0.04 / 3 + 0.01 / 3)
    assert diff.difference == pytest.approx(0.2) and diff.t == pytest.approx(0.2 / se)
    assert math.isnan(seeds.mean_se([1.0]).se)


def test_compute_of_a_mixture_of_experts_counts_its_active_parameters():
    from danastar.analysis.compute import compute_non_embedding
    from danastar.scaling import make_plan

    dense = make_plan("enoki", "adamw", 2, batch_size=32, seq_len=128).to_dict()
    assert compute_non_embedding(dense) == 12 * 128 ** 2 * 1
    moe = {**dense, "non_embedding_params": 1_115_136, "active_non_embedding_params": 327_680}
    assert compute_non_embedding(moe) == 327_680
    qwen = {**moe, "arch": "qwen3", "exact_active_non_embedding_params": 329_216}
    assert compute_non_embedding(qwen) == 329_216


def test_a_mixture_of_experts_and_a_dense_model_of_the_same_heads_are_two_models(tmp_path):
    import json

    from fake_runs import write_run

    from danastar.analysis.records import find_runs
    from danastar.analysis.table import best_per_size

    for lr_ratio in (0.5, 1.0):
        write_run(tmp_path / "dense", "adamw", 2, lr_ratio=lr_ratio)
        moe_run = write_run(tmp_path / "moe", "adamw", 2, lr_ratio=lr_ratio * 4)
        saved = json.loads((moe_run / "plan.json").read_text())
        saved["plan"].update(moe=True, moe_num_experts=64, moe_num_experts_per_tok=2,
                             moe_num_shared_experts=1)
        (moe_run / "plan.json").write_text(json.dumps(saved))
    runs = find_runs([tmp_path])
    assert sorted({run.arch for run in runs}) == ["enoki", "enoki-moe64k2+1s"]
    best = {b.arch: b for b in best_per_size(runs)}
    assert best.keys() == {"enoki", "enoki-moe64k2+1s"}  # each its own best LR, never mixed
    assert best["enoki-moe64k2+1s"].lr > 1.5 * best["enoki"].lr


def test_the_best_lr_is_chosen_on_the_seeds_every_lr_has():
    # 1e-3 won on seed 0 and was given two more seeds, which landed worse; 2e-3 has seed 0 only
    losses = {1e-3: {0: 3.00, 1: 3.20, 2: 3.25}, 2e-3: {0: 3.05}, 4e-3: {0: 3.30}}
    assert seeds.best_lr(losses) == 1e-3  # by seed 0 alone, not 3.15 (mean) against 3.05
    assert seeds.best_lr({1e-3: {1: 3.1}, 2e-3: {2: 3.0}}) == 2e-3  # nothing in common: means


def test_wall_time_of_a_run_that_ran_in_one_go(tmp_path):
    import json

    from fake_runs import write_run

    from danastar.analysis.records import read_run

    run_dir = write_run(tmp_path, "adamw", 2)
    (run_dir / "status.json").write_text(json.dumps({"updated": "2026-11-23T10:02:30Z"}))
    (run_dir / "run.json").write_text(json.dumps({"starts": [{"at": "2026-11-23T10:00:00Z"}]}))
    assert read_run(run_dir).wall_seconds == 150.0
    (run_dir / "run.json").write_text(json.dumps({"starts": [{"at": "2026-11-23T10:00:00Z"},
                                                             {"at": "2026-11-23T10:01:00Z"}]}))
    assert read_run(run_dir).wall_seconds is None  # resumed: the gap between starts is unknown


def test_a_convex_fit_whose_vertex_lies_outside_the_swept_lrs_has_no_minimum():
    """A loss still falling at the sweep's low edge fits a parabola whose vertex lies far below
    every swept LR (the plot once starred lr* = 3.6e-17): no minimum, no curvature counted."""
    lrs = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
    losses = [3.0, 3.1, 3.25, 3.45, 3.7]  # rising, slightly convex
    p = sensitivity.fit_parabola(list(zip(lrs, losses)))
    assert p.curvature > 0 and not p.has_minimum and math.isnan(p.best_lr)
    inside = sensitivity.fit_parabola([(lr, 3.0 + 0.1 * math.log(lr / 4e-3) ** 2) for lr in lrs])
    assert inside.has_minimum
    assert sensitivity.mean_curvature([p, inside]) == pytest.approx(inside.curvature)


def test_run_directories_are_sorted_with_their_numbers_by_value():
    names = ["adamw_h3_lr1.10e-02", "adamw_h12_lr1e-3", "adamw_h3_lr5.49e-03", "s10", "s9",
             "adamw_h2_lr2.74e-03"]
    ordered = [str(path) for path in sorted((Path("runs") / name for name in names),
                                            key=by_value)]
    assert ordered == ["runs/adamw_h2_lr2.74e-03", "runs/adamw_h3_lr5.49e-03",
                       "runs/adamw_h3_lr1.10e-02", "runs/adamw_h12_lr1e-3", "runs/s9",
                       "runs/s10"]
