"""Multipliers within one size from step budgets, against hand computations."""

import json
import math
import subprocess
import sys

import pytest
from fake_runs import write_run

from danastar.analysis import budgets, plots, table
from danastar.analysis.records import find_runs

T = 100  # the sweep budget of these runs


def run_with(root, opt, *, lr_ratio=1.0, seed=0, iterations=T, curve, final=None):
    """A run whose validation losses are exactly ``curve`` at evenly spaced steps; its final
    record (another evaluation at the last step) reads ``final``, by default the last value."""
    run_dir = write_run(root / f"{opt}-{lr_ratio}-{seed}-{iterations}", opt, 2,
                        lr_ratio=lr_ratio, seed=seed, iterations=iterations,
                        evals=len(curve) - 1)
    tokens_per_step = json.loads((run_dir / "plan.json").read_text())["plan"]["tokens_per_step"]
    steps = [round(i * iterations / (len(curve) - 1)) for i in range(len(curve))]
    lines = [{"step": s, "val_loss": v, "tokens": s * tokens_per_step}
             for s, v in zip(steps, curve)]
    lines.append({**lines[-1], "final": True}
                 | ({} if final is None else {"val_loss": final}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run_dir


@pytest.fixture()
def study(tmp_path):
    # AdamW: an LR sweep at T (best at ratio 1), then budgets T/2 and 2T and a second seed
    for ratio, loss in ((0.5, 2.9), (1.0, 2.8), (2.0, 2.85)):
        run_with(tmp_path, "adamw", lr_ratio=ratio, curve=[10, loss])
    run_with(tmp_path, "adamw", iterations=T // 2, curve=[10, 3.0])
    run_with(tmp_path, "adamw", iterations=2 * T, curve=[10, 2.6])
    for iterations, loss in ((T // 2, 3.1), (T, 2.9), (2 * T, 2.7)):
        run_with(tmp_path, "adamw", seed=1, iterations=iterations, curve=[10, loss])
    # ADana: sweep at T (best at ratio 0.5), then a second seed; a budget run at another LR
    # with a lower loss must not be taken for the best LR
    run_with(tmp_path, "adana", lr_ratio=0.5, curve=[10, 3.0, 2.75, 2.7, 2.7])
    run_with(tmp_path, "adana", lr_ratio=1.0, curve=[10, 2.9])
    run_with(tmp_path, "adana", lr_ratio=2.0, curve=[10, 2.95])
    run_with(tmp_path, "adana", lr_ratio=0.5, seed=1, curve=[10, 2.85])
    run_with(tmp_path, "adana", lr_ratio=4.0, iterations=2 * T, curve=[10, 2.0])
    return tmp_path


def test_best_lr_is_chosen_at_the_sweep_budget(study):
    runs = find_runs([study])
    best = {b.base_optimizer: b for b in table.best_per_size(runs)}
    half = next(r for r in runs if r.path.parent.name == f"adana-0.5-0-{T}")
    assert best["adana"].lr == pytest.approx(half.lr, rel=1e-3)  # kept at 4 digits
    assert {r.iterations for r in best["adana"].runs} == {T}
    assert best["adana"].loss.n == 2  # the two seeds at its best LR, not the 2T run
    assert best["adamw"].loss.mean == pytest.approx((2.8 + 2.9) / 2)


def test_within_size_multiplier_by_hand(study):
    (result,) = budgets.within_size_multipliers(find_runs([study]), "adamw")
    assert (result.optimizer, result.heads, result.iterations, result.seeds) == \
        ("adana κ=0.85", 2, T, (0, 1))
    assert result.paired
    # seed 0: 2.7 lies between AdamW's T (2.8) and 2T (2.6) points: C* = C_T·2^f in log-log
    f0 = (math.log(2.7) - math.log(2.8)) / (math.log(2.6) - math.log(2.8))
    # seed 1: 2.85 between its seed-1 AdamW T (2.9) and 2T (2.7)
    f1 = (math.log(2.85) - math.log(2.9)) / (math.log(2.7) - math.log(2.9))
    m0, m1 = 2 ** f0, 2 ** f1
    assert result.multiplier.mean == pytest.approx((m0 + m1) / 2, rel=1e-9)
    assert result.multiplier.se == pytest.approx(abs(m0 - m1) / 2, rel=1e-9)
    assert result.kinds == ("interpolated", "interpolated")
    # steps to AdamW's final loss at T, same seed: seed 0 crosses 2.8 between step 25 (3.0) and
    # step 50 (2.75), log loss linear in log steps; seed 1 (2 evaluations) reaches 2.9 at T
    g = (math.log(2.8) - math.log(3.0)) / (math.log(2.75) - math.log(3.0))
    s0 = math.exp(math.log(25) + g * math.log(2)) / T
    assert result.steps_fraction.mean == pytest.approx((s0 + 1.0) / 2, rel=1e-9)


def test_steps_to_the_baselines_loss_compare_the_same_evaluation(tmp_path):
    """The final evaluation (the whole validation set) reads higher than the periodic batches:
    the steps to AdamW's loss compare periodic with periodic, never one with the other."""
    run_with(tmp_path, "adamw", curve=[10, 2.8], final=2.9)
    run_with(tmp_path, "adamw", iterations=2 * T, curve=[10, 2.6], final=2.7)
    run_with(tmp_path, "adana", curve=[10, 3.0, 2.85, 2.8, 2.75], final=2.82)
    (result,) = budgets.within_size_multipliers(find_runs([tmp_path]), "adamw")
    # AdamW's periodic 2.8 at T is reached at step 75 exactly; against its final 2.9 the
    # crossing would have come before step 50
    assert result.steps_fraction.mean == pytest.approx(0.75, rel=1e-12)


def test_unpaired_seed_reads_the_mean_curve(study):
    run_with(study, "adana", lr_ratio=0.5, seed=7, curve=[10, 2.8])
    (result,) = budgets.within_size_multipliers(find_runs([study]), "adamw")
    assert not result.paired and result.seeds == (0, 1, 7)


def test_baseline_needs_a_falling_budget_curve(tmp_path):
    run_with(tmp_path, "adamw", curve=[10, 2.8])
    run_with(tmp_path, "adamw", iterations=2 * T, curve=[10, 2.9])
    run_with(tmp_path, "adana", curve=[10, 2.7])
    with pytest.raises(Exception, match="do not decrease with its budget"):
        budgets.within_size_multipliers(find_runs([tmp_path]), "adamw")


def test_cli_table_and_figure(study, tmp_path):
    command = [sys.executable, "-m", "danastar"]
    out = subprocess.run(command + ["results", str(study), "--vs", "adamw", "--within_size"],
                         capture_output=True, text=True, check=True).stdout
    assert "adana" in out and "steps_to_baseline" in out and "±" in out
    refused = subprocess.run(command + ["results", str(study), "--within_size"],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "add --vs" in refused.stderr
    assert "Traceback" not in refused.stderr
    figure = plots.within_size(budgets.within_size_multipliers(find_runs([study])))
    left, right = figure.axes
    assert "multiplier" in left.get_ylabel() and "steps" in right.get_ylabel()
    assert [t.get_text() for t in left.get_xticklabels()][0].startswith("h2")
    for ax in (left, right):  # one legend entry per optimizer, whatever the sizes
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert len(labels) == len(set(labels)) and "AdamW" in labels
    plots.save(figure, tmp_path / "within")
    assert (tmp_path / "within.png").stat().st_size > 10_000


def test_a_within_size_multiplier_at_the_edge_of_the_lr_grid_is_marked(study, capsys):
    from danastar.cli import main

    rows = budgets.within_size_multipliers(find_runs([study]))
    # ADana's best LR (ratio 0.5) is the lowest it swept; AdamW's (1.0) has both neighbours
    assert {r.untuned for r in rows} == {"adana κ=0.85: best LR the lowest of 3"}
    assert main(["results", str(study), "--vs", "adamw", "--within_size"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert all("†" in line for line in out[1:len(rows) + 1])
    assert out[-1] == budgets.UNTUNED_NOTE
