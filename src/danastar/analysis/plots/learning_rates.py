"""The learning rate: the LR sweeps, the LR laws fitted through the best LRs, the sensitivity
of the loss to the LR.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from danastar.analysis import budgets, lrlaw, seeds, sensitivity
from danastar.analysis.plots.style import (
    by_optimizer,
    colour,
    group_label,
    linestyle,
    lr_axis,
    new_figure,
    params_label,
)
from danastar.analysis.records import Run, complete_runs
from danastar.errors import UserError
from danastar.hparams import PAPER_OMEGA as DEFAULT_OMEGA  # scaling.DEFAULT_OMEGA, without torch
from danastar.progress import SILENT, Stages


def lr_sweeps(runs: Sequence[Run]):
    """Final validation loss against LR (log), one panel per size, one line per optimizer (mean
    ± s.e. where an LR has several seeds), its best LR starred; runs at the sweep budget only."""
    chosen = budgets.lr_sweep_runs(complete_runs(runs, "an LR-sweep figure"))
    sizes = sorted({r.size for r in chosen})
    if not sizes:
        raise UserError("no complete runs to draw; wait for the sweep to finish some.")
    figure, axes = new_figure(4.5, 4.0, ncols=len(sizes))
    for ax, size in zip(axes, sizes):
        for group, group_runs in by_optimizer([r for r in chosen if r.size == size]).items():
            base = group_runs[0].optimizer
            by_lr: dict[float, dict[int, float]] = {}
            for run in group_runs:
                by_lr.setdefault(float(f"{run.lr:.4g}"), {})[run.seed] = run.final_loss
            lrs = sorted(by_lr)
            stats = [seeds.mean_se(list(by_lr[lr].values())) for lr in lrs]
            errors = [0.0 if math.isnan(m.se) else m.se for m in stats]
            ax.errorbar(lrs, [m.mean for m in stats], yerr=errors, marker="o", markersize=4,
                        capsize=2, color=colour(base), linestyle=linestyle(base),
                        label=group_label(group, base))
            best = lrs.index(seeds.best_lr(by_lr))
            ax.plot(lrs[best], stats[best].mean, "*", color=colour(base), markersize=12)
        lr_axis(ax, [r.lr for r in chosen if r.size == size])
        ax.margins(x=0.1, y=0.12)  # room for the stars at the ends of the axes
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel("final validation loss")
        here = [r for r in chosen if r.size == size]
        steps = "/".join(str(n) for n in sorted({r.iterations for r in here}))
        # two lines: one would run past a narrow panel into its neighbour or the legend
        ax.set_title(f"{size[0]} h{size[1]}\n{params_label(here[0].total_params)} parameters, "
                     f"{steps} steps", fontsize=9)
        ax.grid(True, which="both", alpha=0.2)
    # one legend beside the panels (the optimizers' colours are the same in each): inside a
    # panel it covers points of a sweep
    handles = {}
    for ax in axes[:len(sizes)]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    figure.legend(handles.values(), handles.keys(), fontsize=7, loc="outside right upper")
    return figure


def paper_law(run: Run) -> tuple[float, float, float] | None:
    """The (a, b, d) of the paper's LR law for this run's architecture, optimizer, batch and κ
    (None if it has none)."""
    from danastar import scaling  # noqa: PLC0415 (imports torch; only the laws need it)

    kappa = {} if run.kappa is None else {"kappa": run.kappa}
    found = scaling.lr_law_coefficients(run.arch, run.optimizer, global_batch=run.global_batch,
                                        **kappa)
    return None if found is None else found[0]


SWEPT_LRS = 3  # LRs a size needs before its best LRs say where the optimum lies


def _unswept_sizes(group_runs: Sequence[Run]) -> dict[int, int]:
    """{heads: distinct LRs} of the sizes with fewer than SWEPT_LRS LRs."""
    lrs: dict[int, set[float]] = {}
    for run in group_runs:
        lrs.setdefault(run.heads, set()).add(float(f"{run.lr:.4g}"))
    return {heads: len(found) for heads, found in sorted(lrs.items()) if len(found) < SWEPT_LRS}


def lrlaw_figure(runs: Sequence[Run], *, k: int = 5, omega: float = DEFAULT_OMEGA,
                 bootstrap: int = 1000, seed: int = 0, b_from_paper: bool = False,
                 allow_unswept: bool = False, stages: Stages = SILENT):
    """LR against P = 12·d²·L, log-log, one panel per optimizer: the top-K points coloured by
    size and sized by weight, the others grey, the fitted law dashed with its bootstrap band
    and its predictions at 4x and 16x the largest size. With ``b_from_paper``, b is held at the
    paper's law's b (a and d fitted), for a few nearby sizes that cannot pin b down.
    A size with fewer than SWEPT_LRS LRs (a default LR, not a sweep) is refused (UserError)
    unless ``allow_unswept``; then the panel's title says which sizes were not swept. `stages`
    says each fit as it starts and counts its resamples.
    Returns (figure, {optimizer: fit})."""
    groups = by_optimizer(budgets.lr_sweep_runs(complete_runs(runs, "an LR law")))
    laws = {g: paper_law(rs[0]) if b_from_paper else None for g, rs in groups.items()}
    fixed = {g: None if law is None else law[1] for g, law in laws.items()}
    fittable = {g: rs for g, rs in groups.items()
                if len({r.lr_law_params for r in rs}) >= (3 if fixed[g] is None else 2)}
    if not fittable:
        counts = ", ".join(f"{g}: {len({r.lr_law_params for r in rs})}"
                           for g, rs in groups.items())
        raise UserError(f"an LR law a·(b+P)^d needs complete LR sweeps at 3 or more sizes of one "
                        f"optimizer (2 with b from the paper's law), found {counts}; add sizes "
                        "to the sweep.")
    unswept = {g: _unswept_sizes(rs) for g, rs in fittable.items()}
    if not allow_unswept and any(unswept.values()):
        listed = "; ".join(f"{g} at " + ", ".join(f"h{h} ({n} LR{'s' * (n > 1)})"
                                                  for h, n in sizes.items())
                           for g, sizes in unswept.items() if sizes)
        raise UserError(f"an LR law is fitted through swept LRs, {SWEPT_LRS} or more per size, "
                        f"and these sizes have fewer: {listed}; sweep LRs there (danastar "
                        "sweep), or pass --allow_unswept to fit through them anyway.")
    from matplotlib import colormaps  # noqa: PLC0415 (the plots extra, once a figure is drawn)

    figure, axes = new_figure(5.5, 4.5, ncols=len(fittable))
    results = {}
    for ax, (group, group_runs) in zip(axes, fittable.items()):
        points = [lrlaw.SweepPoint(r.lr_law_params, r.lr, r.final_loss, r.omega or omega)
                  for r in group_runs]
        largest = max(p.params for p in points)
        stages.start(f"fitting the LR law of {group} and {bootstrap:,} bootstrap resamples of "
                     "its sizes")
        fit = lrlaw.fit_lr_law(points, k=k, omega=omega, bootstrap=bootstrap, seed=seed,
                               predict_at=[4 * largest, 16 * largest], b=fixed[group],
                               stages=stages)
        results[group] = fit
        chosen = {(p.params, p.lr) for ps in fit.points.values() for p in ps}
        others = [p for p in points if (p.params, p.lr) not in chosen]
        ax.scatter([p.params for p in others], [p.lr for p in others], c="lightgrey", s=15,
                   label="other LRs")
        cmap = colormaps["viridis"]
        heads = {r.lr_law_params: r.heads for r in group_runs}
        for i, (params, ps) in enumerate(fit.points.items()):
            ax.scatter([p.params for p in ps], [p.lr for p in ps],
                       s=[12 * p.weight for p in ps],
                       color=cmap(i / max(1, len(fit.points) - 1)),
                       edgecolor="black", linewidth=0.3,
                       label=f"h{heads.get(int(params), '?')}: top {len(ps)}")
        grid = np.geomspace(min(p.params for p in points) / 2, 20 * largest, 200)
        base = group_runs[0].optimizer
        if fit.has_interval:
            low, high = fit.band(grid)
            ax.fill_between(grid, low, high, color=colour(base), alpha=0.15,
                            label="95% bootstrap")
        held = " (b: paper's)" if fit.fixed_b else ""
        ax.plot(grid, fit.lr(grid), "--", color=colour(base),
                label=f"{fit.a:.3g}·({fit.b:.3g}+P)^{fit.d:.3f}{held}")
        sizes = sorted(fit.predictions)
        preds = np.array([fit.predictions[s] for s in sizes])
        if fit.has_interval:
            # the point estimate can sit just outside the percentile interval: clip at zero
            below = np.maximum(preds[:, 0] - preds[:, 1], 0.0)
            above = np.maximum(preds[:, 2] - preds[:, 0], 0.0)
            ax.errorbar(sizes, preds[:, 0], yerr=[below, above], fmt="x", color=colour(base),
                        capsize=3, label="predicted (95%)")
        else:
            ax.plot(sizes, preds[:, 0], "x", color=colour(base),
                    label=f"predicted (no interval: {len(fit.points)} sizes)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("non-embedding parameters P (12·d²·L)")
        ax.set_ylabel("peak learning rate")
        counts = sorted({len(ps) for ps in fit.points.values()})
        kept = (f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}")
        title = (f"{group_label(group, base)}\nlaw fitted to the best {kept} LRs of each of "
                 f"{len(fit.points)} sizes (area ∝ weight)")
        if unswept[group]:
            title += ("\nNOT SWEPT: " + ", ".join(f"h{h} has {n} LR{'s' * (n > 1)}"
                                                  for h, n in unswept[group].items())
                      + " (--allow_unswept)")
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.2)
        ax.margins(0.08)
        ax.legend(fontsize=7, loc="best")
    return figure, results


def lr_sensitivity(runs: Sequence[Run], *, min_lrs: int = sensitivity.MIN_LRS):
    """Final loss against LR (log), one panel per optimizer, one colour per size, with each
    size's parabola in ln lr (dashed). Returns (figure, {optimizer: {heads: parabola}})."""
    groups = by_optimizer(budgets.lr_sweep_runs(
        complete_runs(runs, "an LR-sensitivity figure")))
    from matplotlib import colormaps  # noqa: PLC0415 (the plots extra, once a figure is drawn)

    figure, axes = new_figure(5.5, 4.5, ncols=len(groups))
    results: dict[str, dict[tuple[str, int], sensitivity.Parabola]] = {}
    for ax, (group, group_runs) in zip(axes, groups.items()):
        by_size: dict[tuple[str, int], list[Run]] = {}
        for run in group_runs:
            by_size.setdefault(run.size, []).append(run)
        results[group] = {}
        cmap = colormaps["viridis"]
        for i, (size, rs) in enumerate(sorted(by_size.items())):
            shade = cmap(i / max(1, len(by_size) - 1))
            pts = sorted((r.lr, r.final_loss) for r in rs)
            try:
                parabola = sensitivity.fit_parabola(pts, min_lrs=min_lrs)
            except ValueError:  # too few LRs for a fit: the points alone
                parabola = None
            # a size without a minimum says so beside its points (the title only when none has)
            none_inside = parabola is not None and not parabola.has_minimum
            ax.plot(*zip(*pts), "o", color=shade, label=f"{size[0]} h{size[1]}"
                    + (": no minimum inside the swept LRs" if none_inside else ""))
            if parabola is None:
                continue
            results[group][size] = parabola
            if none_inside:  # a concave fit says nothing about the optimum
                continue
            grid = np.geomspace(pts[0][0] / 1.5, pts[-1][0] * 1.5, 100)
            ax.plot(grid, parabola.loss(grid), "--", color=shade, linewidth=1)
            ax.plot(parabola.best_lr, parabola.best_loss, "*", color=shade, markersize=10)
        base = group_runs[0].optimizer
        zeta = sensitivity.mean_curvature(list(results[group].values()))
        lr_axis(ax, [r.lr for r in group_runs])
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel("final validation loss")
        summary = (f"mean curvature ζ = {zeta:.3g}" if not np.isnan(zeta)
                   else "no minimum inside the swept LRs")
        ax.set_title(f"{group_label(group, base)}: {summary}", fontsize=9)
        ax.grid(True, which="both", alpha=0.2)
        ax.legend(fontsize=7)
    if not any(results.values()):
        raise UserError(f"an LR-sensitivity parabola needs complete runs at {max(3, min_lrs)} or "
                        "more distinct LRs of one size; add LRs to the sweep (or lower "
                        "--min_lrs, at least 3).")
    return figure, results
