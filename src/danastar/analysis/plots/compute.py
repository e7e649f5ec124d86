"""Loss and compute multipliers against compute: the scaling figure, the validation curves,
the multipliers within one size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from danastar.analysis import budgets, fits, multiplier
from danastar.analysis.plots.style import (
    colour,
    display_name,
    group_label,
    linestyle,
    new_figure,
    params_label,
    plain_log_axis,
    shade,
)
from danastar.analysis.records import Run, dataset_labels
from danastar.analysis.table import Best, best_per_size, check_baseline
from danastar.errors import UserError


def scaling(best: Sequence[Best], baseline: str = "adamw", fit: str = "auto"):
    """Compute multiplier against ``baseline`` (left) and validation loss (right, log) against
    compute in PFH (log): the measured multiplier as squares joined by solid lines, hollow and
    joined by dotted ones where extrapolated beyond the baseline's losses; the loss as circles;
    the fits dashed. Total parameters of the baseline's sizes on the top axis. One legend names
    the optimizers by colour, a second below the axes every kind of mark.

    ``fit``: "broken", "single", "none", or "auto": broken with 6 or more sizes per optimizer
    (4 parameters per curve), single with 3 to 5, none below."""
    base_points = check_baseline(best, baseline)
    curves: dict[str, list[Best]] = {}
    for b in best:
        curves.setdefault(b.optimizer, []).append(b)
    for points in curves.values():
        points.sort(key=lambda b: b.pfh)
    fit = _scaling_fit(curves, fit)
    figure, (ax,) = new_figure(8.0, 5.5)
    ax_loss = ax.twinx()
    c_range = (min(b.pfh for b in best), max(b.pfh for b in best))
    optimizers, extrapolated = [], False
    for name, pts in curves.items():
        base = pts[0].base_optimizer
        col, label = colour(base), group_label(name, base)
        pfh = np.array([b.pfh for b in pts])
        loss = np.array([b.loss.mean for b in pts])
        _loss_points(ax_loss, pts, col, fit and (lambda c, n=name: fit.predict(n, c)), c_range)
        if name == baseline:
            ax.axhline(1.0, color=col, linewidth=1.5)
            optimizers.append((col, f"{label} (baseline)"))
            continue
        optimizers.append((col, label))
        measured = multiplier.measured_multipliers(base_points, list(zip(pfh, loss)))
        _measured_multipliers(ax, measured, col)
        extrapolated |= any(m.kind != multiplier.INTERPOLATED for m in measured)
        if fit is not None:
            cs, ms = multiplier.fitted_multipliers(
                lambda c: fit.predict(baseline, c), lambda c, n=name: fit.predict(n, c),
                *c_range, floor=fit.floor)
            ax.plot(cs, ms, "--", color=col, linewidth=1.2)
    _scaling_axes(ax, ax_loss, best, baseline)
    _scaling_legends(figure, ax, optimizers, fitted=fit is not None,
                     extrapolated=extrapolated)
    subtitle = (f"joint {'broken ' if fit.broken else ''}power-law fit, R² = {fit.r2:.3f}"
                if fit is not None else "too few sizes for a fit (needs 3 per optimizer)")
    ax.set_title(f"Compute multiplier and loss vs compute ({subtitle})", fontsize=9)
    figure.fit = fit  # for the command's summary and the tests
    return figure


def _scaling_fit(curves: dict[str, list[Best]], fit: str):
    """The joint power-law fit that ``fit`` asks for (`scaling`), or None."""
    if fit == "auto":  # a curve needs more points than its 2 or 4 parameters
        smallest = min(len(points) for points in curves.values())
        fit = "broken" if smallest >= 6 else "single" if smallest >= 3 else "none"
    if fit == "none":
        return None
    return fits.fit_power_laws(
        {name: ([b.pfh for b in pts], [b.loss.mean for b in pts])
         for name, pts in curves.items()}, broken=fit == "broken")


def _loss_points(ax_loss, points: Sequence[Best], col, fitted, c_range) -> None:
    """One optimizer's best losses (circles, ± their standard error) and its fit (dashed)."""
    se = [0.0 if np.isnan(b.loss.se) else b.loss.se for b in points]
    ax_loss.errorbar([b.pfh for b in points], [b.loss.mean for b in points], yerr=se, fmt="o",
                     color=col, alpha=0.8, markersize=5)
    if fitted:
        grid = np.geomspace(0.5 * c_range[0], 2 * c_range[1], 200)
        ax_loss.plot(grid, fitted(grid), "--", color=col, alpha=0.5, linewidth=1)


def _measured_multipliers(ax, measured: Sequence[multiplier.MeasuredPoint], col) -> None:
    """Squares joined in order of compute: filled and solid where measured within the
    baseline's losses; hollow, and dotted to and from them, where extrapolated."""
    for left, right in zip(measured, measured[1:]):
        within = left.kind == right.kind == multiplier.INTERPOLATED
        ax.plot([left.compute, right.compute], [left.multiplier, right.multiplier],
                "-" if within else ":", color=col, linewidth=1.5)
    for m in measured:
        hollow = m.kind != multiplier.INTERPOLATED
        ax.plot(m.compute, m.multiplier, "s", color=col, markersize=7,
                markerfacecolor="white" if hollow else col)


def _scaling_axes(ax, ax_loss, best: Sequence[Best], baseline: str) -> None:
    """Scales, labels and grid; the baseline's total parameters on a top axis."""
    ax.set_xscale("log")
    ax_loss.set_yscale("log")
    plain_log_axis(ax_loss.yaxis)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("compute (PFH)")
    ax.set_ylabel(f"compute multiplier vs {display_name(baseline)} (bigger is better)")
    ax_loss.set_ylabel("validation loss (circles)")
    ax.grid(True, which="both", alpha=0.2)
    top = ax.twiny()
    top.set_xscale("log")
    top.set_xlim(ax.get_xlim())
    baseline_best = sorted((b for b in best if b.optimizer == baseline), key=lambda b: b.pfh)
    top.set_xticks([b.pfh for b in baseline_best])
    top.set_xticklabels([params_label(b.total_params) for b in baseline_best], fontsize=8)
    top.minorticks_off()
    top.set_xlabel("total parameters")


# Every kind of mark of the scaling figure, drawn in grey in the legend below the axes (the
# colours are the optimizers'): (label, line style, marker, marker face, alpha).
SCALING_MARKS = (
    ("multiplier, measured", "-", "s", None, 1.0),
    ("multiplier, extrapolated beyond the baseline's losses", ":", "s", "white", 1.0),
    ("multiplier from the fits", "--", "", None, 1.0),
    ("validation loss (right axis) ± s.e.", "", "o", None, 0.8),
    ("loss fit", "--", "", None, 0.5),
)


def _scaling_legends(figure, ax, optimizers: list[tuple], fitted: bool,
                     extrapolated: bool) -> None:
    """The optimizers by colour (upper left), and below the axes what each mark drawn means."""
    from matplotlib.lines import Line2D  # noqa: PLC0415 (the plots extra, as in new_figure)

    ax.legend([Line2D([], [], color=col, linewidth=2) for col, _ in optimizers],
              [label for _, label in optimizers], loc="upper left", fontsize=8)
    marks = [mark for mark in SCALING_MARKS if (fitted or "fit" not in mark[0])
             and (extrapolated or "extrapolated" not in mark[0])]
    handles = [Line2D([], [], color="grey", linestyle=style or "none", marker=marker or None,
                      markerfacecolor=face, alpha=alpha, markersize=6)
               for _, style, marker, face, alpha in marks]
    figure.legend(handles, [mark[0] for mark in marks], loc="outside lower center",
                  ncols=2, fontsize=8, frameon=False)  # multiplier marks, then loss marks


def best_lr_curves(runs: Sequence[Run]) -> list[Run]:
    """The runs of each optimizer's best LR per size (`table.best_per_size`: at the sweep
    budget, every seed), in the order of the table."""
    return [run for best in best_per_size(runs)
            for run in sorted(best.runs, key=lambda r: r.seed)]


def curves(runs: Sequence[Run], x: str = "compute", best: bool = False):
    """Validation loss against compute (PFH), tokens or steps, log-log: one colour per
    optimizer, one shade per size (darker is larger); partial runs thinner. Runs on several
    datasets: each label names its dataset. With ``best``, only each optimizer's best-LR runs
    per size (`best_lr_curves`): its first seed drawn full, the other seeds thin, the LR in
    the label."""
    if best:
        runs = best_lr_curves(runs)
    figure, (ax,) = new_figure()
    sizes = sorted({r.lr_law_params for r in runs})
    datasets = dataset_labels(runs)
    seen = set()
    drawn, extended = 0, False
    first_seed = {}
    for run in sorted(runs, key=lambda r: (r.group, r.lr_law_params, r.lr, r.seed)):
        xs, ys = run.curve(x)
        keep = [(a, b) for a, b in zip(xs, ys) if a > 0]
        if not keep:
            continue
        base = run.optimizer
        label = f"{group_label(run.group, base)} {run.arch} h{run.heads}"
        if best:
            label += f" lr {run.lr:.3g}"
        if len(datasets) > 1:
            label += f" on {datasets[run.data]}"
        another_seed = best and first_seed.setdefault(label, run) is not run
        ax.plot(*zip(*keep), linestyle=linestyle(base), marker=None if another_seed else ".",
                markersize=3, alpha=0.5 if another_seed else 1.0,
                linewidth=0.7 if another_seed or not run.complete else 1.4,
                color=shade(colour(base), sizes.index(run.lr_law_params), len(sizes)),
                label=None if label in seen else label)
        seen.add(label)
        drawn += 1
        for join in run.joins(x):  # where it was continued past its planned steps
            ax.axvline(join, linestyle=":", linewidth=1.0, alpha=0.8,
                       color=shade(colour(base), sizes.index(run.lr_law_params), len(sizes)))
            extended = True
    if not drawn:
        raise UserError("no run has a validation loss after step 0 yet; wait for the first "
                        "evaluation.")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_axis(ax.yaxis)
    ax.set_xlabel({"compute": "compute (PFH)", "tokens": "tokens", "steps": "steps"}[x])
    ax.set_ylabel("validation loss")
    ax.grid(True, which="both", alpha=0.2)
    if len(seen) > 8:  # beside the axes, on a wider figure: over them it hides the first points
        figure.set_size_inches(10.5, 4.5)
        figure.legend(fontsize=7, loc="outside right upper")
    else:
        ax.legend(fontsize=7, ncols=2)
    shades = "one colour per optimizer, darker = larger"
    ax.set_title(f"Validation loss at each optimizer's best LR per size\n(thin: other seeds; "
                 f"{shades})" if best else f"Validation loss ({shades})"
                 + ("\ndotted: where a run was extended past its planned steps" if extended
                    else ""), fontsize=9)
    return figure


def within_size(results: Sequence[budgets.BudgetMultiplier], baseline: str = "adamw"):
    """Per size, against the baseline at that size: the compute multiplier (left; mean ± s.e.
    over seeds, filled at the sweep budget, hollow at the other budgets, a cross where read off
    an extrapolation of the baseline's curve) and the fraction of its steps each optimizer took
    to reach the baseline's final loss (right; below 1: it got there sooner)."""
    figure, (left, right) = new_figure(5.5, 4.5, ncols=2)
    groups: dict[str, list[budgets.BudgetMultiplier]] = {}
    for result in results:
        groups.setdefault(result.optimizer, []).append(result)
    sizes = sorted({r.heads for r in results})
    offsets = np.linspace(-0.12, 0.12, max(1, len(groups)))
    missed: list[str] = []  # some seed did not reach the baseline's loss in its steps
    for offset, (group, rows) in zip(offsets, sorted(groups.items())):
        base = group.split(" ")[0]
        main_steps = {r.heads: max((x for x in rows if x.heads == r.heads),
                                   key=lambda x: len(x.seeds)).iterations for r in rows}
        labelled = right_labelled = False
        for r in rows:
            x = sizes.index(r.heads) + offset
            main = r.iterations == main_steps[r.heads]
            se = 0.0 if math.isnan(r.multiplier.se) else r.multiplier.se
            left.errorbar(x, r.multiplier.mean, yerr=se, fmt="x" if r.extrapolated else "o",
                          color=colour(base), mfc=colour(base) if main else "none",
                          markersize=7 if main else 5, capsize=3,
                          label=group_label(group, base) if main and not labelled else None)
            labelled = labelled or main
            if main and r.steps_fraction is not None:
                fse = 0.0 if math.isnan(r.steps_fraction.se) else r.steps_fraction.se
                right.errorbar(x, r.steps_fraction.mean, yerr=fse, fmt="o", color=colour(base),
                               capsize=3,
                               label=None if right_labelled else group_label(group, base))
                right_labelled = True
            elif main:
                missed.append(f"{group_label(group, base)} at h{r.heads}")
    ticks = [f"h{h}\n{params_label(next(r for r in results if r.heads == h).total_params)}"
             for h in sizes]
    if missed:
        # a fraction is at most 1, so the band above the baseline's line is free: list there
        # the runs where some seed missed the baseline's loss (about 3% of the height per line)
        bottom = min(right.get_ylim()[0], 0.95)
        share = min(0.6, 0.034 * (len(missed) + 2))
        right.set_ylim(bottom, 1 + (1 - bottom) * share / (1 - share))
        right.text(0.02, 0.98, "not reached by every seed:\n" + "\n".join(missed), fontsize=7,
                   transform=right.transAxes, va="top")
    for ax in (left, right):
        ax.axhline(1.0, color=colour(baseline), linewidth=1, label=display_name(baseline))
        ax.set_xlim(-0.5, len(sizes) - 0.5)
        ax.set_xticks(range(len(sizes)), ticks)
        ax.set_xlabel("model size (heads, total parameters)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    left.set_ylabel(f"compute multiplier vs {display_name(baseline)} (bigger is better)")
    left.set_title("filled: sweep budget; hollow: other budgets; x: extrapolated", fontsize=9)
    right.set_ylabel(f"fraction of steps to reach {display_name(baseline)}'s final loss")
    right.set_title("sweep budget, same seed (smaller is better)", fontsize=9)
    return figure
