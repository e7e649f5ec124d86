"""Every figure kind renders (PNG and PDF) with the right axes, labels and lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fake_runs import write_run

from danastar.analysis import multiplier, plots, records, table
from danastar.cli import main

pytest.importorskip("matplotlib")

STUDY = Path(__file__).parents[2] / "studies" / "cpu-shakespeare" / "records"


def has_band(ax) -> bool:
    from matplotlib.collections import PolyCollection  # fill_between's

    return any(isinstance(c, PolyCollection) for c in ax.collections)


def legend_texts(legend) -> list[str]:
    return [text.get_text() for text in legend.get_texts()]


def test_plot_command_writes_png_and_pdf(sweep, tmp_path, capsys):
    out = tmp_path / "figs" / "scaling"
    assert main(["plot", "scaling", str(sweep), "--out", str(out)]) == 0
    for suffix in (".png", ".pdf"):
        path = out.with_suffix(suffix)
        assert path.stat().st_size > 10_000
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert "R² = " in capsys.readouterr().out


def test_the_same_figure_saved_twice_is_the_same_file(sweep, tmp_path):
    figure = plots.curves(records.find_runs([sweep]))
    first = [path.read_bytes() for path in plots.save(figure, tmp_path / "a")]
    second = [path.read_bytes() for path in plots.save(figure, tmp_path / "b")]
    assert first == second and b"/CreationDate" not in first[1]  # the PDF has no date


def test_scaling_figure(sweep):
    best = table.best_per_size(records.find_runs([sweep]))
    figure = plots.scaling(best, "adamw")
    ax, ax_loss, top = figure.axes
    assert ax.get_xlabel() == "compute (PFH)" and ax.get_xscale() == "log"
    assert ax.get_ylabel() == "compute multiplier vs AdamW (bigger is better)"
    assert ax_loss.get_yscale() == "log" and ax_loss.get_ylabel().startswith("validation loss")
    assert top.get_xlabel() == "total parameters" and len(top.get_xticks()) == 3
    mk4 = "Dana-Star-MK4 κ=0.85 clipsnr=2"
    assert legend_texts(ax.get_legend()) == ["AdamW (baseline)", mk4]
    squares = [line for line in ax.get_lines() if line.get_marker() == "s"]
    assert len(squares) == 3 and min(line.get_ydata()[0] for line in squares) > 1
    assert figure.fit is not None and not figure.fit.broken  # 3 sizes: a single power law
    dashed_fits = [line for line in ax_loss.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed_fits) == 2
    assert [line.get_color() for line in dashed_fits] == ["#1f77b4", "#d62728"]
    marks = legend_texts(figure.legends[0])  # below the axes, every kind of mark drawn
    assert marks[2:] == ["multiplier from the fits", "validation loss (right axis) ± s.e.",
                         "loss fit"]


def test_the_scaling_figure_dots_extrapolated_segments_and_names_every_mark(sweep):
    best = table.best_per_size(records.find_runs([sweep]))
    measured = multiplier.measured_multipliers(
        [(b.pfh, b.loss.mean) for b in best if b.optimizer == "adamw"],
        [(b.pfh, b.loss.mean) for b in best if b.optimizer != "adamw"])
    within = [m.kind == multiplier.INTERPOLATED for m in measured]
    assert not all(within), "the fixture's largest size is extrapolated"
    figure = plots.scaling(best, "adamw", fit="none")  # no fit: fast, and no fit in the legend
    segments = [line for line in figure.axes[0].get_lines()  # the multiplier's, pair by pair
                if line.get_color() == "#d62728" and len(line.get_xdata()) == 2]
    styles = ["-" if left and right else ":" for left, right in zip(within, within[1:])]
    assert [line.get_linestyle() for line in segments] == styles
    assert legend_texts(figure.legends[0]) == [
        "multiplier, measured", "multiplier, extrapolated beyond the baseline's losses",
        "validation loss (right axis) ± s.e."]


def test_curves_figure_has_one_line_per_run(sweep):
    runs = records.find_runs([sweep])
    figure = plots.curves(runs, x="tokens")
    (ax,) = figure.axes
    assert ax.get_xlabel() == "tokens" and ax.get_ylabel() == "validation loss"
    assert len(ax.get_lines()) == len(runs)
    assert ax.get_xscale() == ax.get_yscale() == "log"
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert len(legend) == 6 and legend[0] == "AdamW enoki h4"


def test_a_long_curves_legend_goes_beside_the_axes(tmp_path):
    """Over the axes, a legend of many entries would hide the curves' first points."""
    for opt in ("adamw", "adana", "dana-star-mk4"):
        for heads in (4, 6, 8):
            write_run(tmp_path, opt, heads)
    figure = plots.curves(records.find_runs([tmp_path]))
    (ax,) = figure.axes
    assert ax.get_legend() is None and len(figure.legends) == 1
    assert len(figure.legends[0].get_texts()) == 9
    assert figure.get_size_inches()[0] > 10


def test_lrlaw_figure_and_its_scaling_rules_row(sweep, tmp_path, capsys):
    runs = records.find_runs([sweep])
    figure, fitted = plots.lrlaw_figure(runs, bootstrap=50)
    assert len(figure.axes) == 2
    for ax in figure.axes:
        assert ax.get_xlabel().startswith("non-embedding parameters")
        assert ax.get_ylabel() == "peak learning rate"
        dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert len(dashed) == 1 and dashed[0].get_label().count("P)^") == 1
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert {"h4: top 5", "h6: top 5", "h8: top 5"} <= set(legend)  # which colour is which
    # the synthetic optimum is the table's own law; with 5 LRs a factor 2 apart the rank
    # weights (5…1, squared) pull the fit toward whichever neighbour ranks second, by up to ~20%
    for size in (2.4e6, 7e6, 1.9e7):
        assert fitted["adamw"].lr(size) == pytest.approx(12.8 * (1.67e4 + size) ** -0.515,
                                                         rel=0.25)
    assert main(["plot", "lrlaw", str(sweep), "--bootstrap", "20",
                 "--out", str(tmp_path / "law")]) == 0
    out, err = capsys.readouterr()
    # each fit said as it starts (its resamples counted by a bar on a terminal), then the files
    assert err.splitlines() == [
        "danastar plot: fitting the LR law of adamw and 20 bootstrap resamples of its sizes ...",
        "danastar plot: fitting the LR law of dana-star-mk4 κ=0.85 clipsnr=2 and 20 bootstrap "
        "resamples of its sizes ...",
        f"danastar plot: drawing {tmp_path / 'law.png'} and {tmp_path / 'law.pdf'} ..."]
    assert "adamw: [{a: " in out and "dana-star-mk4: [{kappa: 0.85, a: " in out
    # 3 sizes fit 3 parameters exactly: no band, and the command says why
    assert "no bootstrap interval: with 3 sizes" in out
    assert not any(has_band(ax) for ax in figure.axes)


def test_lrlaw_with_b_from_the_paper_fits_a_and_d_with_a_band(sweep, tmp_path, capsys):
    runs = records.find_runs([sweep])
    figure, fitted = plots.lrlaw_figure(runs, bootstrap=50, b_from_paper=True)
    law = fitted["adamw"]
    assert law.fixed_b and law.b == pytest.approx(1.67e4) and law.has_interval
    assert law.d == pytest.approx(-0.515, abs=0.1)
    for ax in figure.axes:
        assert has_band(ax)  # the 95% bootstrap band
        labels = [line.get_label() for line in ax.get_lines()]
        assert any(label.endswith("(b: paper's)") for label in labels)
    assert main(["plot", "lrlaw", str(sweep), "--bootstrap", "20", "--b_from_paper",
                 "--out", str(tmp_path / "law")]) == 0
    out = capsys.readouterr().out
    assert "# adamw: 95% intervals a [" in out and " b [" not in out


def test_lr_sensitivity_figure(sweep):
    runs = records.find_runs([sweep])
    figure, parabolas = plots.lr_sensitivity(runs)
    assert len(figure.axes) == 2
    for ax in figure.axes:
        assert ax.get_xlabel() == "peak learning rate"
        assert ax.get_ylabel() == "final validation loss"
        assert len([line for line in ax.get_lines() if line.get_linestyle() == "--"]) == 3
    zeta = {group.split()[0]: [p.curvature for p in per.values()]
            for group, per in parabolas.items()}
    # the synthetic sweeps: AdamW's curvature 0.08, Dana-Star-MK4's 0.04
    assert zeta["adamw"] == pytest.approx([0.08] * 3, rel=0.1)
    assert zeta["dana-star-mk4"] == pytest.approx([0.04] * 3, rel=0.15)


def test_lr_sensitivity_draws_no_parabola_without_a_minimum(tmp_path):
    # a hump: the loss rises then falls across the swept LRs, so no parabola has a minimum
    for ratio, loss in ((0.25, 3.0), (0.5, 3.5), (1.0, 3.55)):
        run_dir = write_run(tmp_path, "adamw", 4, lr_ratio=ratio, iterations=100)
        lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        lines[-1]["val_loss"] = loss
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    figure, parabolas = plots.lr_sensitivity(records.find_runs([tmp_path]), min_lrs=3)
    (parabola,) = parabolas["adamw"].values()
    (ax,) = figure.axes
    assert not parabola.has_minimum and parabola.refit_on_lowest
    assert not [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert ax.get_title().endswith("no minimum inside the swept LRs")
    # and beside its points, as for a size without one in a panel where another has one
    assert ax.get_legend_handles_labels()[1] == ["enoki h4: no minimum inside the swept LRs"]


def draw(figure):
    """Lay the figure out as saving it would (Agg), for positions and tick labels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return canvas.get_renderer()


def test_lr_sweep_ticks_stars_and_legend_are_readable(sweep, tmp_path):
    """Tick labels that do not repeat or crowd, stars inside the axes with room, a legend over
    no point; also on an unswept set (one or two LRs a size, a narrow range)."""
    for ratio in (1.0, 1.5):
        write_run(tmp_path, "adamw", 4, lr_ratio=ratio, iterations=50)
    write_run(tmp_path, "adana", 4, iterations=50)
    study = records.find_runs([STUDY], note=lambda line: None)  # 5 optimizers, 2-3 decades
    for runs in (records.find_runs([sweep]), records.find_runs([tmp_path]), study):
        figure = plots.lr_sweeps(runs)
        renderer = draw(figure)
        for ax in figure.axes:
            low, high = ax.get_xlim()
            shown = [t.get_text() for t in ax.get_xticklabels()
                     if t.get_text() and low <= t.get_position()[0] <= high]
            assert 2 <= len(shown) <= 8 and len(set(shown)) == len(shown), shown
            boxes = sorted((t.get_window_extent(renderer) for t in ax.get_xticklabels()
                            if t.get_text() and low <= t.get_position()[0] <= high),
                           key=lambda box: box.x0)
            assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:])), shown  # no overlap
            assert not any(t.get_text() for t in ax.get_xticklabels(minor=True))
            stars = [line for line in ax.get_lines() if line.get_marker() == "*"]
            (y_low, y_high), span = ax.get_ylim(), ax.get_ylim()[1] - ax.get_ylim()[0]
            for star in stars:
                (x,), (y,) = star.get_xdata(), star.get_ydata()
                assert low < x < high and y_low + 0.05 * span < y < y_high - 0.05 * span
        # the legend beside the panels, not over any of them
        renderer = draw(figure)
        (legend,) = figure.legends
        right = max(ax.get_window_extent(renderer).x1 for ax in figure.axes)
        assert legend.get_window_extent(renderer).x0 >= right
        assert not any(ax.get_legend() for ax in figure.axes)


def test_curves_best_draws_the_best_lr_of_each_size_and_its_seeds(sweep, tmp_path, capsys):
    runs = records.find_runs([sweep])
    figure = plots.curves(runs, best=True)
    (ax,) = figure.axes
    lines = ax.get_lines()
    assert len(lines) == 12  # 2 optimizers x 3 sizes, 2 seeds each at the law's LR
    thin = [line for line in lines if line.get_linewidth() < 1]
    assert len(thin) == 6 and all(line.get_label().startswith("_") for line in thin)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(legend) == 6 and legend[0].startswith("AdamW enoki h4 lr ")
    assert "best LR per size" in ax.get_title()
    assert main(["plot", "curves", str(sweep), "--best", "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 10_000


def test_size_shades_are_all_visible_and_distinct():
    import numpy as np

    for hex_colour in ("#1f77b4", "#d62728", "#bcbd22"):
        shades = [np.array(plots._shade(hex_colour, rank, 4)) for rank in range(4)]
        assert all(1 - shade.mean() > 0.24 for shade in shades)  # none near white
        assert all(np.abs(a - b).max() > 0.1 for a, b in zip(shades, shades[1:]))


def test_lrlaw_through_unswept_sizes_is_refused_or_labelled(tmp_path, capsys):
    for heads in (4, 6, 8):
        write_run(tmp_path, "adamw", heads, iterations=50)
    out = str(tmp_path / "law")
    assert main(["plot", "lrlaw", str(tmp_path), "--out", out]) == 2
    assert ("these sizes have fewer: adamw at h4 (1 LR), h6 (1 LR), h8 (1 LR); sweep LRs there "
            "(danastar sweep), or pass --allow_unswept") in capsys.readouterr().err
    figure, _ = plots.lrlaw_figure(records.find_runs([tmp_path]), bootstrap=0,
                                   allow_unswept=True)
    (ax,) = figure.axes
    assert "best 1 LRs of each of 3 sizes" in ax.get_title()
    assert "NOT SWEPT: h4 has 1 LR, h6 has 1 LR, h8 has 1 LR" in ax.get_title()


@pytest.mark.parametrize("args, message", [
    # Before: read by plot lrlaw alone, and ignored by the others without a word.
    (["curves", "--omega", "-1"], "--omega is read by plot lrlaw only, not by plot curves; "
                                  "remove it."),
    (["scaling", "--x", "tokens"], "--x is read by plot curves only, not by plot scaling; "
                                   "remove it."),
    (["curves", "--vs", "adamw"], "--vs is read by plot scaling and within-size only, not by "
                                  "plot curves; remove it."),
    (["lr-sweep", "--best"], "--best is read by plot curves only, not by plot lr-sweep; "
                             "remove it."),
    # Before: a negative or NaN ω was taken, keeping the runs nearest to it.
    (["lrlaw", "--omega", "-1"], "--omega -1 must be a finite number >= 0 (the weight-decay "
                                 "strength the runs trained with)."),
    (["lrlaw", "--omega", "nan"], "--omega nan must be a finite number >= 0"),
    (["lrlaw", "--top_k", "0"], "--top_k 0 must be at least 1."),
    (["lr-sensitivity", "--min_lrs", "2"], "--min_lrs 2 must be at least 3 (a parabola has three "
                                           "coefficients)."),
    (["experts", "--step", "-1"], "--step -1 must be at least 0."),
    (["lrlaw", "--seed", "-1"], "--seed -1 must be at least 0."),  # before: numpy's ValueError
], ids=["omega-curves", "x-scaling", "vs-curves", "best-lr-sweep", "omega-negative", "omega-nan",
        "top_k", "min_lrs", "step", "seed"])
def test_an_option_the_figure_ignores_or_out_of_range_is_one_sentence(args, message, tmp_path,
                                                                      capsys):
    kind, *rest = args
    capsys.readouterr()
    assert main(["plot", kind, str(tmp_path), *rest, "--out", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"danastar plot: {message}") and len(err) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_the_plot_command_starts_without_torch():
    """Reading records and drawing them needs no torch, whose import took 4 of the 8 s before a
    figure was drawn (the LR-law figure imports it to draw the paper's law)."""
    code = "import sys, danastar.commands.plot; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.strip() == "False", result.stderr


def test_an_extended_run_shows_its_join_in_curves_and_results(tmp_path, capsys):
    """run.json's `extensions` (`danastar train --extend`): a dotted line at the join, and the
    results table's `extended` column (only where a run has one)."""
    plain = write_run(tmp_path, "adana", 4, iterations=100)
    extended = write_run(tmp_path, "adamw", 4, iterations=100)
    extension = {"from_step": 60, "from_iterations": 60, "iterations": 100,
                 "schedule_rule": "stretch", "decay_rule": "keep", "warmup_steps": 1}
    again = {"from_step": 100, "from_iterations": 100, "iterations": 150,
             "schedule_rule": "rewarm", "decay_rule": "planned", "warmup_steps": 1,
             "rewarm_steps": 3}
    (extended / "run.json").write_text(json.dumps({"identity": {}, "starts": [],
                                                   "extensions": [extension, again]}))
    runs = records.find_runs([tmp_path])
    figure = plots.curves(runs, x="steps")
    (ax,) = figure.axes
    dotted = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert [list(line.get_xdata()) for line in dotted] == [[60.0, 60.0], [100.0, 100.0]]
    assert "dotted: where a run was extended" in ax.get_title()
    assert main(["results", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "extended" in table.splitlines()[0]
    assert "60→100 at 60 (stretch, keep); 100→150 at 100 (rewarm 3, planned)" in table, table
    assert main(["results", str(plain)]) == 0
    assert "extended" not in capsys.readouterr().out.splitlines()[0]
