"""Colours, display names and line styles fixed per optimizer, so that figures from different
sweeps compare at a glance; the figure, its axes' labels, and `save`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from danastar.analysis.records import Run
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


def group_label(group: str, base: str) -> str:
    return display_name(base) + group[len(base):]


def shade(hex_colour: str, rank: int, count: int) -> tuple[float, float, float]:
    """The optimizer's colour, lighter for smaller sizes (rank 0), darker for larger ones: from
    the colour mixed 45% with white to the colour mixed 45% with black, through the colour
    itself, so that every shade stays visible on white and neighbours differ."""
    from matplotlib.colors import to_rgb  # noqa: PLC0415 (the plots extra, as below)

    rgb = to_rgb(hex_colour)
    if count <= 1:
        return rgb
    position = rank / (count - 1)  # 0 lightest, 1 darkest
    if position < 0.5:
        white = 0.45 * (1 - 2 * position)
        return tuple(c + white * (1 - c) for c in rgb)
    black = 0.45 * (2 * position - 1)
    return tuple(c * (1 - black) for c in rgb)


def new_figure(width: float = 7.0, height: float = 4.5, ncols: int = 1, nrows: int = 1):
    # matplotlib, the plots extra, is imported once a figure is drawn: `danastar plot --help`
    # and the tables start without it.
    try:
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError as error:
        raise UserError("figures need matplotlib; install it with `pip install "
                        "danastar[plots]`.") from error
    figure = Figure(figsize=(width * ncols, height), layout="constrained")
    return figure, list(figure.subplots(nrows, ncols, squeeze=False).flat)


def plain_log_axis(axis) -> None:
    """Log-scale tick labels as plain numbers (2.1, not 2.1×10⁰): losses span less than a decade."""
    from matplotlib.ticker import ScalarFormatter  # noqa: PLC0415 (the plots extra)

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


def params_label(count: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return f"{count:.0f}"


def short_number(value: float, _position=None) -> str:
    """2e-3 for 0.002, 2.5e-3 for 0.0025: tick labels that fit side by side."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}"


def lr_axis(ax, lrs: Sequence[float]) -> None:
    """A log LR axis labelled at 1, 2 and 5 of each decade (only 1 past 1.5 decades) in a
    short form (2e-3): matplotlib's own minor labels collide on ranges of about a decade, and
    without them a range inside one decade has no label at all."""
    from matplotlib.ticker import (  # noqa: PLC0415 (the plots extra)
        FuncFormatter,
        LogLocator,
        MaxNLocator,
        NullFormatter,
    )

    ax.set_xscale("log")
    decades = math.log10(max(lrs) / min(lrs)) if lrs and min(lrs) > 0 else 0.0
    if decades < 0.7:  # 1, 2, 5 would leave at most one label: a few evenly spaced ones
        ax.xaxis.set_major_locator(MaxNLocator(nbins=3))
    else:
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0,) if decades > 1.5 else (1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(short_number))
    ax.xaxis.set_minor_formatter(NullFormatter())


def by_optimizer(runs: Sequence[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    return dict(sorted(groups.items()))
