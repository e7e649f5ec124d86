"""The paper's figures from runs, drawn with matplotlib (the ``plots`` extra).

Each function returns a ``matplotlib.figure.Figure`` (no pyplot, no global state); ``save``
writes it as PNG and PDF. By job: `style` (colours, names and line styles fixed per optimizer,
the figure and its axes), `compute` (loss and multipliers against compute), `learning_rates`
(sweeps, LR laws, sensitivity), `tau_experts` (τ statistics, per-expert statistics).
"""

from danastar.analysis.plots.compute import best_lr_curves, curves, scaling, within_size
from danastar.analysis.plots.learning_rates import (
    SWEPT_LRS,
    lr_sensitivity,
    lr_sweeps,
    lrlaw_figure,
    paper_law,
)
from danastar.analysis.plots.style import STYLES, colour, display_name, linestyle, save, shade
from danastar.analysis.plots.tau_experts import MARKERS, experts, tau

__all__ = [
    "MARKERS", "STYLES", "SWEPT_LRS", "best_lr_curves", "colour", "curves", "display_name",
    "experts", "linestyle", "lr_sensitivity", "lr_sweeps", "lrlaw_figure", "paper_law", "save",
    "scaling", "tau", "within_size",
]
_shade = shade  # the name the size-shade test reads
