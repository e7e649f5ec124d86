"""The paper's figures from runs, drawn with matplotlib (the ``plots`` extra).

Colours, display names and line styles are fixed per optimizer, so that figures from different
sweeps compare at a glance. Each function returns a ``matplotlib.figure.Figure`` (no pyplot, no
global state); ``save`` writes it as PNG and PDF.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from danastar.analysis import budgets, fits, lrlaw, multiplier, seeds, sensitivity
from danastar.analysis import experts as expert_stats
from danastar.analysis import tau as tau_maths
from danastar.analysis.records import Run, complete_runs, dataset_labels
from danastar.analysis.table import Best, check_baseline
from danastar.errors import UserError

# optimizer -> (display name, colour); the *-mk4 variants are drawn dashed
STYLES: dict[str, tuple[str, str]] = {
    "adamw": ("AdamW", "#1f77b4"),
    "adamw-decaying-wd": ("AdamW decaying-WD", "#00CED1"),
    "adana": ("ADana", "#bcbd22"),
    "dana-mk4": ("Dana-MK4", "#8c564b"),
    "dana-star": ("Dana-Star", "#7f7f7f"),
    "dana-star-mk4": ("Dana-Star-MK4", "#d62728"),
    "ademamix": ("AdEMAMix", "#9467bd"),
    "ademamix-decaying-wd": ("AdEMAMix decaying-WD", "#e377c2"),
    "muon": ("Muon", "#ff7f0e"),
}
OTHER_COLOURS = ("#2ca02c", "#17becf", "#393b79", "#637939", "#843c39")


def display_name(optimizer: str) -> str:
    return STYLES.get(optimizer, (optimizer, ""))[0]


def colour(optimizer: str) -> str:
    if optimizer in STYLES:
        return STYLES[optimizer][1]
    return OTHER_COLOURS[sum(map(ord, optimizer)) % len(OTHER_COLOURS)]  # stable across runs


def linestyle(optimizer: str) -> str:
    return "--" if optimizer.endswith("mk4") else "-"


def _label(group: str, base: str) -> str:
    return display_name(base) + group[len(base):]


def _shade(hex_colour: str, rank: int, count: int) -> tuple[float, float, float]:
    """The optimizer's colour, lighter for smaller sizes (rank 0), darker for larger ones: from
    the colour mixed 45% with white to the colour mixed 45% with black, through the colour
    itself, so that every shade stays visible on white and neighbours differ."""
    from matplotlib.colors import to_rgb

    rgb = to_rgb(hex_colour)
    if count <= 1:
        return rgb
    position = rank / (count - 1)  # 0 lightest, 1 darkest
    if position < 0.5:
        white = 0.45 * (1 - 2 * position)
        return tuple(c + white * (1 - c) for c in rgb)
    black = 0.45 * (2 * position - 1)
    return tuple(c * (1 - black) for c in rgb)


def _figure(width: float = 7.0, height: float = 4.5, ncols: int = 1, nrows: int = 1):
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise UserError("figures need matplotlib; install it with `pip install "
                        "danastar[plots]`.") from error
    figure = Figure(figsize=(width * ncols, height), layout="constrained")
    return figure, list(figure.subplots(nrows, ncols, squeeze=False).flat)


def _plain_log_axis(axis) -> None:
    """Log-scale tick labels as plain numbers (2.1, not 2.1×10⁰): losses span less than a decade."""
    from matplotlib.ticker import ScalarFormatter

    for formatter in (axis.set_major_formatter, axis.set_minor_formatter):
        plain = ScalarFormatter()
        plain.set_scientific(False)
        formatter(plain)


def save(figure, out: Path) -> list[Path]:
    """Write ``out`` with a .png and a .pdf suffix (whatever suffix it had); returns both. The
    PDF carries no creation date, so that the same figure is the same file (a rebuilt report
    changes only where its figures do)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for suffix, metadata in ((".png", None), (".pdf", {"CreationDate": None})):
        path = out.with_suffix(suffix)
        figure.savefig(path, dpi=150, metadata=metadata)
        written.append(path)
    return written


def _params_label(count: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return f"{count:.0f}"


def scaling(best: Sequence[Best], baseline: str = "adamw", fit: str = "auto"):
    """Compute multiplier against ``baseline`` (left) and validation loss (right, log) against
    compute in PFH (log), measured (squares, solid; hollow when extrapolated) and fitted
    (dashed); total parameters of the baseline's sizes on the top axis.

    ``fit``: "broken", "single", "none", or "auto": broken with 6 or more sizes per optimizer
    (4 parameters per curve), single with 3 to 5, none below."""
    base_points = check_baseline(best, baseline)
    curves: dict[str, list[Best]] = {}
    for b in best:
        curves.setdefault(b.optimizer, []).append(b)
    for points in curves.values():
        points.sort(key=lambda b: b.pfh)
    smallest = min(len(points) for points in curves.values())
    if fit == "auto":  # a curve needs more points than its 2 or 4 parameters
        fit = "broken" if smallest >= 6 else "single" if smallest >= 3 else "none"
    joint = None
    if fit != "none":
        joint = fits.fit_power_laws(
            {name: ([b.pfh for b in pts], [b.loss.mean for b in pts])
             for name, pts in curves.items()}, broken=fit == "broken")
    fit = joint
    figure, (ax,) = _figure(8.0, 5.0)
    ax_loss = ax.twinx()
    c_min = min(b.pfh for b in best)
    c_max = max(b.pfh for b in best)
    for name, pts in curves.items():
        base = pts[0].base_optimizer
        col, label = colour(base), _label(name, base)
        pfh = np.array([b.pfh for b in pts])
        loss = np.array([b.loss.mean for b in pts])
        se = np.array([0.0 if np.isnan(b.loss.se) else b.loss.se for b in pts])
        ax_loss.errorbar(pfh, loss, yerr=se, fmt="o", color=col, alpha=0.8, markersize=5)
        if fit is not None:
            grid = np.geomspace(0.5 * c_min, 2 * c_max, 200)
            ax_loss.plot(grid, fit.predict(name, grid), "--", color=col, alpha=0.5, linewidth=1)
        if name == baseline:
            ax.axhline(1.0, color=col, linewidth=1.5, label=f"{label} (baseline)")
            continue
        measured = multiplier.measured_multipliers(base_points, list(zip(pfh, loss)))
        ax.plot(pfh, [m.multiplier for m in measured], "-", color=col, linewidth=1.5,
                label=f"{label} measured")
        for m in measured:
            hollow = m.kind != multiplier.INTERPOLATED
            ax.plot(m.compute, m.multiplier, "s", color=col, markersize=7,
                    markerfacecolor="white" if hollow else col)
        if fit is not None:
            cs, ms = multiplier.fitted_multipliers(
                lambda c: fit.predict(baseline, c), lambda c, n=name: fit.predict(n, c),
                c_min, c_max, floor=fit.floor)
            ax.plot(cs, ms, "--", color=col, linewidth=1.2, label=f"{label} fitted")
    ax.set_xscale("log")
    ax_loss.set_yscale("log")
    _plain_log_axis(ax_loss.yaxis)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("compute (PFH)")
    ax.set_ylabel(f"compute multiplier vs {display_name(baseline)} (bigger is better)")
    ax_loss.set_ylabel("validation loss (circles; fit dashed)")
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(loc="upper left", fontsize=8)
    top = ax.twiny()
    top.set_xscale("log")
    top.set_xlim(ax.get_xlim())
    baseline_best = sorted((b for b in best if b.optimizer == baseline), key=lambda b: b.pfh)
    top.set_xticks([b.pfh for b in baseline_best])
    top.set_xticklabels([_params_label(b.total_params) for b in baseline_best], fontsize=8)
    top.minorticks_off()
    top.set_xlabel("total parameters")
    subtitle = (f"joint {'broken ' if fit.broken else ''}power-law fit, R² = {fit.r2:.3f}"
                if fit is not None else "too few sizes for a fit (needs 3 per optimizer)")
    ax.set_title(f"Compute multiplier and loss vs compute ({subtitle}; hollow: extrapolated)",
                 fontsize=9)
    figure.fit = fit  # for the command's summary and the tests
    return figure


def best_lr_curves(runs: Sequence[Run]) -> list[Run]:
    """The runs of each optimizer's best LR per size (`table.best_per_size`: at the sweep
    budget, every seed), in the order of the table."""
    from danastar.analysis.table import best_per_size

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
    figure, (ax,) = _figure()
    sizes = sorted({r.lr_law_params for r in runs})
    datasets = dataset_labels(runs)
    seen = set()
    drawn = 0
    first_seed = {}
    for run in sorted(runs, key=lambda r: (r.group, r.lr_law_params, r.lr, r.seed)):
        xs, ys = run.curve(x)
        keep = [(a, b) for a, b in zip(xs, ys) if a > 0]
        if not keep:
            continue
        base = run.optimizer
        label = f"{_label(run.group, base)} {run.arch} h{run.heads}"
        if best:
            label += f" lr {run.lr:.3g}"
        if len(datasets) > 1:
            label += f" on {datasets[run.data]}"
        another_seed = best and first_seed.setdefault(label, run) is not run
        ax.plot(*zip(*keep), linestyle=linestyle(base), marker=None if another_seed else ".",
                markersize=3, alpha=0.5 if another_seed else 1.0,
                linewidth=0.7 if another_seed or not run.complete else 1.4,
                color=_shade(colour(base), sizes.index(run.lr_law_params), len(sizes)),
                label=None if label in seen else label)
        seen.add(label)
        drawn += 1
    if not drawn:
        raise UserError("no run has a validation loss after step 0 yet; wait for the first "
                        "evaluation.")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_axis(ax.yaxis)
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
                 f"{shades})" if best else f"Validation loss ({shades})", fontsize=9)
    return figure


def lr_sweeps(runs: Sequence[Run]):
    """Final validation loss against LR (log), one panel per size, one line per optimizer (mean
    ± s.e. where an LR has several seeds), its best LR starred; runs at the sweep budget only."""
    chosen = budgets.lr_sweep_runs(complete_runs(runs, "an LR-sweep figure"))
    sizes = sorted({r.size for r in chosen})
    if not sizes:
        raise UserError("no complete runs to draw; wait for the sweep to finish some.")
    figure, axes = _figure(4.5, 4.0, ncols=len(sizes))
    for ax, size in zip(axes, sizes):
        for group, group_runs in _by_optimizer([r for r in chosen if r.size == size]).items():
            base = group_runs[0].optimizer
            by_lr: dict[float, dict[int, float]] = {}
            for run in group_runs:
                by_lr.setdefault(float(f"{run.lr:.4g}"), {})[run.seed] = run.final_loss
            lrs = sorted(by_lr)
            stats = [seeds.mean_se(list(by_lr[lr].values())) for lr in lrs]
            errors = [0.0 if math.isnan(m.se) else m.se for m in stats]
            ax.errorbar(lrs, [m.mean for m in stats], yerr=errors, marker="o", markersize=4,
                        capsize=2, color=colour(base), linestyle=linestyle(base),
                        label=_label(group, base))
            best = lrs.index(seeds.best_lr(by_lr))
            ax.plot(lrs[best], stats[best].mean, "*", color=colour(base), markersize=12)
        _lr_axis(ax, [r.lr for r in chosen if r.size == size])
        ax.margins(x=0.1, y=0.12)  # room for the stars at the ends of the axes
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel("final validation loss")
        here = [r for r in chosen if r.size == size]
        steps = "/".join(str(n) for n in sorted({r.iterations for r in here}))
        ax.set_title(f"{size[0]} h{size[1]} ({_params_label(here[0].total_params)} "
                     f"parameters, {steps} steps)", fontsize=9)
        ax.grid(True, which="both", alpha=0.2)
    # one legend beside the panels (the optimizers' colours are the same in each): inside a
    # panel it covers points of a sweep
    handles = {}
    for ax in axes[:len(sizes)]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    figure.legend(handles.values(), handles.keys(), fontsize=7, loc="outside right upper")
    return figure


def _short_number(value: float, _position=None) -> str:
    """2e-3 for 0.002, 2.5e-3 for 0.0025: tick labels that fit side by side."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}"


def _lr_axis(ax, lrs: Sequence[float]) -> None:
    """A log LR axis labelled at 1, 2 and 5 of each decade (only 1 past 1.5 decades) in a
    short form (2e-3): matplotlib's own minor labels collide on ranges of about a decade, and
    without them a range inside one decade has no label at all."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    ax.set_xscale("log")
    decades = math.log10(max(lrs) / min(lrs)) if lrs and min(lrs) > 0 else 0.0
    if decades < 0.7:  # 1, 2, 5 would leave at most one label: a few evenly spaced ones
        ax.xaxis.set_major_locator(MaxNLocator(nbins=3))
    else:
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0,) if decades > 1.5 else (1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(_short_number))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _by_optimizer(runs: Sequence[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    return dict(sorted(groups.items()))


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


def lrlaw_figure(runs: Sequence[Run], *, k: int = 5, omega: float = 4.0,
                 bootstrap: int = 1000, seed: int = 0, b_from_paper: bool = False,
                 allow_unswept: bool = False):
    """LR against P = 12·d²·L, log-log, one panel per optimizer: the top-K points coloured by
    size and sized by weight, the others grey, the fitted law dashed with its bootstrap band
    and its predictions at 4x and 16x the largest size. With ``b_from_paper``, b is held at the
    paper's law's b (a and d fitted), for a few nearby sizes that cannot pin b down.
    A size with fewer than SWEPT_LRS LRs (a default LR, not a sweep) is refused (UserError)
    unless ``allow_unswept``; then the panel's title says which sizes were not swept.
    Returns (figure, {optimizer: fit})."""
    groups = _by_optimizer(budgets.lr_sweep_runs(complete_runs(runs, "an LR law")))
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
    from matplotlib import colormaps

    figure, axes = _figure(5.5, 4.5, ncols=len(fittable))
    results = {}
    for ax, (group, group_runs) in zip(axes, fittable.items()):
        points = [lrlaw.SweepPoint(r.lr_law_params, r.lr, r.final_loss, r.omega or omega)
                  for r in group_runs]
        largest = max(p.params for p in points)
        fit = lrlaw.fit_lr_law(points, k=k, omega=omega, bootstrap=bootstrap, seed=seed,
                               predict_at=[4 * largest, 16 * largest], b=fixed[group])
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
        title = (f"{_label(group, base)}\nlaw fitted to the best {kept} LRs of each of "
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
    groups = _by_optimizer(budgets.lr_sweep_runs(
        complete_runs(runs, "an LR-sensitivity figure")))
    from matplotlib import colormaps

    figure, axes = _figure(5.5, 4.5, ncols=len(groups))
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
            ax.plot(*zip(*pts), "o", color=shade, label=f"{size[0]} h{size[1]}")
            try:
                parabola = sensitivity.fit_parabola(pts, min_lrs=min_lrs)
            except ValueError:
                continue
            results[group][size] = parabola
            if not parabola.has_minimum:  # a concave fit says nothing about the optimum
                continue
            grid = np.geomspace(pts[0][0] / 1.5, pts[-1][0] * 1.5, 100)
            ax.plot(grid, parabola.loss(grid), "--", color=shade, linewidth=1)
            ax.plot(parabola.best_lr, parabola.best_loss, "*", color=shade, markersize=10)
        base = group_runs[0].optimizer
        zeta = sensitivity.mean_curvature(list(results[group].values()))
        _lr_axis(ax, [r.lr for r in group_runs])
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel("final validation loss")
        summary = (f"mean curvature ζ = {zeta:.3g}" if not np.isnan(zeta)
                   else "no minimum inside the swept LRs")
        ax.set_title(f"{_label(group, base)}: {summary}", fontsize=9)
        ax.grid(True, which="both", alpha=0.2)
        ax.legend(fontsize=7)
    if not any(results.values()):
        raise UserError(f"an LR-sensitivity parabola needs complete runs at {max(3, min_lrs)} or "
                        "more distinct LRs of one size; add LRs to the sweep (or lower "
                        "--min_lrs, at least 3).")
    return figure, results


def within_size(results: Sequence[budgets.BudgetMultiplier], baseline: str = "adamw"):
    """Per size, against the baseline at that size: the compute multiplier (left; mean ± s.e.
    over seeds, filled at the sweep budget, hollow at the other budgets, a cross where read off
    an extrapolation of the baseline's curve) and the fraction of its steps each optimizer took
    to reach the baseline's final loss (right; below 1: it got there sooner)."""
    figure, (left, right) = _figure(5.5, 4.5, ncols=2)
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
                          label=_label(group, base) if main and not labelled else None)
            labelled = labelled or main
            if main and r.steps_fraction is not None:
                fse = 0.0 if math.isnan(r.steps_fraction.se) else r.steps_fraction.se
                right.errorbar(x, r.steps_fraction.mean, yerr=fse, fmt="o", color=colour(base),
                               capsize=3, label=None if right_labelled else _label(group, base))
                right_labelled = True
            elif main:
                missed.append(f"{_label(group, base)} at h{r.heads}")
    ticks = [f"h{h}\n{_params_label(next(r for r in results if r.heads == h).total_params)}"
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


def tau(collections: Sequence[tau_maths.Collection], param: str | None = None, title: str = ""):
    """The τ figure: the CDF of the regularised τ̃ (log x) on a two-tailed logit axis (0.1% …
    99.9%), one curve per collected step coloured by step (darker is later). By default a 2×2
    summary, each panel the mean CDF of one parameter type, and for a mixture of experts a fifth
    panel (2×3), the mean CDF of the routed experts' per-expert slices; with `param`, that
    tensor alone."""
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    steps = [c.step for c in collections]
    if param is None:
        names = {n for c in collections for n in c.tensors}
        grouped = tau_maths.panel_tensors(names)
        kinds = [*tau_maths.TYPES, *([tau_maths.EXPERTS] if tau_maths.EXPERTS in grouped else [])]
        figure, axes = _figure(4.5, 7.2, ncols=2 if len(kinds) == 4 else 3, nrows=2)
        if len(kinds) > 4:  # the 2×2 on the left as in a dense figure, experts top right
            figure.delaxes(axes[5])
            axes = [axes[0], axes[1], axes[3], axes[4], axes[2]]
        panels = list(zip(kinds, axes))
        per_step = [tau_maths.type_cdfs(c) for c in collections]
    else:
        tau_maths.check_param(collections, param)
        figure, axes = _figure(6.0, 4.5)
        panels = [(param, axes[0])]
        per_step = [{param: tau_maths.tensor_cdf(c.tensors[param], c.step)}
                    if param in c.tensors else {} for c in collections]
    cmap = colormaps["viridis_r"]  # light early, dark late, as the curves settle
    low, high = min(steps), max(steps)
    norm = LogNorm(low, high) if 0 < low < high else Normalize(low - 1, high + 1)
    if param is None:
        counts = {kind: len(grouped.get(kind, [])) for kind in kinds}
    drawn = 0
    probabilities = [1e-3, 1e-2, 0.1, 0.5, 0.9, 0.99, 0.999]
    for kind, ax in panels:
        for step, cdfs in zip(steps, per_step):
            if kind in cdfs:
                x, f = cdfs[kind]
                ax.plot(x, f, color=cmap(norm(step)), linewidth=1.3, label=f"step {step}")
                drawn += 1
        ax.set_xscale("log")
        ax.set_yscale("logit", nonpositive="mask")
        ax.set_ylim(probabilities[0], probabilities[-1])
        ax.yaxis.set_major_locator(FixedLocator(probabilities))
        ax.yaxis.set_major_formatter(lambda p, _: f"{100 * p:g}%")
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("τ̃ = max(min(τ,½) / (1 − min(τ,½)), 1/(1+t))", fontsize=8)
        ax.set_ylabel("fraction of coordinates ≤ τ̃", fontsize=8)
        ax.grid(True, which="both", alpha=0.2)
        if param is None:
            count = counts[kind]
            what = ("expert slice" if kind == tau_maths.EXPERTS
                    and tau_maths.is_expert_slice(grouped[kind][0]) else "tensor")
            ax.set_title(f"{kind} ({count} {what}{'s' * (count != 1)}, mean CDF)", fontsize=9)
            if not count:
                ax.text(0.5, 0.5, "no τ for this type\n(tied embeddings?)", ha="center",
                        va="center", transform=ax.transAxes, fontsize=8, color="0.4")
        else:
            ax.set_title(kind, fontsize=9)
    if not drawn:
        raise UserError("the τ statistics hold no embedding, attention, MLP or output tensor; "
                        "plot one with --param NAME.")
    from matplotlib.cm import ScalarMappable

    bar = figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=[ax for _, ax in panels],
                          shrink=0.8)
    bar.set_label("step t")
    bar.set_ticks(steps)
    bar.set_ticklabels([str(s) for s in steps])
    bar.ax.yaxis.set_minor_locator(NullLocator())
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")  # one per MoE layer, cycled


def experts(snapshots: Sequence[expert_stats.Snapshot]):
    """Per-expert statistics against ρ_e, the share of steps in which the expert was routed:
    (a) its mean τ (log y; an exact 0, an expert never routed, on a row of its own below the
    smallest τ), for the runs whose optimizer has a τ, with the line τ = ρ for reference; (b) its
    weight norm.
    One colour per run (the optimizer's, lighter for a second LR of it), one marker per MoE
    layer, all layers pooled."""
    with_tau = [s for s in snapshots if s.has_tau]
    figure, axes = _figure(5.5, 4.5, ncols=2 if with_tau else 1)
    norm_ax = axes[-1]
    tau_ax = axes[0] if with_tau else None
    positive = [v for s in with_tau for v in s.pooled("tau_mean")[1] if v > 0]
    zero_row = min(positive, default=1e-3) / 4  # where τ = 0 is drawn on the log axis
    by_optimizer: dict[str, list] = {}
    for s in snapshots:
        by_optimizer.setdefault(s.run.optimizer, []).append(s)
    for s in snapshots:
        optimizer = s.run.optimizer
        same = by_optimizer[optimizer]
        color = _shade(colour(optimizer), len(same) - 1 - same.index(s), len(same))
        label = f"{display_name(optimizer)} lr={s.run.lr:.3g} ({s.run.name})"
        layers, rho = s.pooled("routed_share")
        panels = [(norm_ax, s.pooled("weight_norm")[1])]
        if tau_ax is not None and s.has_tau:
            tau_mean = s.pooled("tau_mean")[1]
            panels.append((tau_ax, np.where(tau_mean > 0, tau_mean, zero_row)))
        for ax, values in panels:
            for layer in range(s.layers):
                chosen = layers == layer
                ax.scatter(rho[chosen], values[chosen], color=color, s=18, alpha=0.75,
                           marker=MARKERS[layer % len(MARKERS)], linewidths=0,
                           label=label if layer == 0 else None)
    layers_note = ("; marker = MoE layer" if max(s.layers for s in snapshots) > 1 else "")
    if tau_ax is not None:
        tau_ax.set_yscale("log")
        low = max(zero_row, min((1 / s.step for s in with_tau if s.step), default=1.0))
        tau_ax.plot([low, 1], [low, 1], color="0.5", linestyle=":", linewidth=1,
                    label="τ = ρ")
        tau_ax.axhline(zero_row * 1.6, color="0.7", linewidth=0.8)
        tau_ax.text(0.98, zero_row, "τ = 0", transform=tau_ax.get_yaxis_transform(),
                    ha="right", va="center", fontsize=7, color="0.4")
        tau_ax.set_ylabel("mean τ of the expert's coordinates")
        tau_ax.set_title(f"(a) τ per expert vs routing share{layers_note}", fontsize=9)
    norm_ax.set_ylabel("weight norm of the expert (all its matrices together)")
    norm_ax.set_title(f"({'b' if with_tau else 'a'}) weight norm per expert vs routing "
                      f"share{layers_note}", fontsize=9)
    for ax in axes:
        ax.set_xlabel("ρ_e = share of steps in which the expert was routed")
        ax.set_xlim(-0.03, 1.03)
        ax.grid(True, which="both", alpha=0.2)
        ax.legend(fontsize=7)
    steps = sorted({s.step for s in snapshots})
    figure.suptitle(f"Per-expert statistics at step{'s' * (len(steps) > 1)} "
                    f"{', '.join(map(str, steps))} ({snapshots[0].experts} routed experts per "
                    f"layer)", fontsize=10)
    return figure
