"""Dana-Star's τ statistics and a mixture's per-expert statistics.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from danastar.analysis import experts as expert_stats
from danastar.analysis import tau as tau_maths
from danastar.analysis.plots.style import (
    colour,
    display_name,
    new_figure,
    shade,
)
from danastar.errors import UserError


def tau(collections: Sequence[tau_maths.Collection], param: str | None = None, title: str = ""):
    """The τ figure: the CDF of the regularised τ̃ (log x) on a two-tailed logit axis (0.1% …
    99.9%), one curve per collected step coloured by step (darker is later). By default a 2×2
    summary, each panel the mean CDF of one parameter type, and for a mixture of experts a fifth
    panel (2×3), the mean CDF of the routed experts' per-expert slices; with `param`, that
    tensor alone."""
    # matplotlib, the plots extra, once a figure is drawn (as in style.new_figure)
    from matplotlib import colormaps  # noqa: PLC0415
    from matplotlib.colors import LogNorm, Normalize  # noqa: PLC0415
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator  # noqa: PLC0415

    steps = [c.step for c in collections]
    if param is None:
        names = {n for c in collections for n in c.tensors}
        grouped = tau_maths.panel_tensors(names)
        kinds = [*tau_maths.TYPES, *([tau_maths.EXPERTS] if tau_maths.EXPERTS in grouped else [])]
        figure, axes = new_figure(4.5, 7.2, ncols=2 if len(kinds) == 4 else 3, nrows=2)
        if len(kinds) > 4:  # the 2×2 on the left as in a dense figure, experts top right
            figure.delaxes(axes[5])
            axes = [axes[0], axes[1], axes[3], axes[4], axes[2]]
        panels = list(zip(kinds, axes))
        per_step = [tau_maths.type_cdfs(c) for c in collections]
    else:
        tau_maths.check_param(collections, param)
        figure, axes = new_figure(6.0, 4.5)
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
    from matplotlib.cm import ScalarMappable  # noqa: PLC0415 (the plots extra)

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
    figure, axes = new_figure(5.5, 4.5, ncols=2 if with_tau else 1)
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
        color = shade(colour(optimizer), len(same) - 1 - same.index(s), len(same))
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
