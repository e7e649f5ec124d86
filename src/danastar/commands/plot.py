"""`danastar plot KIND [DIRS ...] --out FILE`: the paper's figures from run or sweep
directories, written as FILE.png and FILE.pdf.

    danastar plot scaling runs/sweep --vs adamw    # compute multiplier + loss vs compute
    danastar plot within-size runs/study           # multiplier at each size from budgets
    danastar plot curves runs/sweep --x tokens     # validation loss curves
    danastar plot curves runs/sweep --best         # ... of each optimizer's best LR per size
    danastar plot lrlaw runs/sweep                 # LR law a·(b+P)^d with bootstrap band
    danastar plot lr-sweep runs/sweep              # final loss vs LR, one panel per size
    danastar plot lr-sensitivity runs/sweep        # final loss vs LR with parabolas
    danastar plot tau runs/my-run                  # τ CDFs (--collect_tau_stats); --param NAME
    danastar plot experts runs/a runs/b            # MoE: τ and weight norm per expert vs
                                                   # routing share; --step N
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from danastar import durable
from danastar.analysis import budgets, experts, plots, records, table, tau
from danastar.errors import UserError
from danastar.progress import Stages

STAGES = Stages("danastar plot")  # each slow stage said on standard error as it starts
KINDS = ("scaling", "within-size", "curves", "lrlaw", "lr-sweep", "lr-sensitivity", "tau",
         "experts")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="danastar plot",
        description="Figures from run directories (docs/analysis.md); PNG and PDF.")
    parser.add_argument("kind", choices=KINDS, help="which figure")
    parser.add_argument("dirs", nargs="*", default=["runs"],
                        help="run directories, or directories searched for runs (default runs)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output file; written with .png and .pdf (default ./<kind>)")
    parser.add_argument("--vs", default=None, metavar="OPTIMIZER",
                        help="scaling, within-size: the baseline of the multiplier (default "
                             "adamw)")
    parser.add_argument("--fit", choices=("auto", "broken", "single", "none"), default=None,
                        help="scaling: the loss-vs-compute fit (default auto: broken power law "
                             "with 6+ sizes per optimizer, single with 3-5, none below)")
    parser.add_argument("--x", choices=("compute", "tokens", "steps"), default=None,
                        help="curves: the x axis (default compute, in PFH)")
    parser.add_argument("--best", action="store_true", default=None,
                        help="curves: only each optimizer's best-LR runs per size (as results "
                             "--best chooses them), other seeds as thin lines")
    parser.add_argument("--top_k", type=int, default=None, help="lrlaw: LRs kept per size (5)")
    parser.add_argument("--allow_unswept", action="store_true", default=None,
                        help="lrlaw: fit even through sizes with fewer than 3 LRs (the figure's "
                             "title says so); refused otherwise")
    parser.add_argument("--omega", type=float, default=None,
                        help="lrlaw: keep the runs at the ω closest to this (default 4)")
    parser.add_argument("--bootstrap", type=int, default=None,
                        help="lrlaw: bootstrap resamples of the sizes (default 1000)")
    parser.add_argument("--seed", type=int, default=None,
                        help="lrlaw: bootstrap seed (default 0)")
    parser.add_argument("--b_from_paper", action="store_true", default=None,
                        help="lrlaw: hold b at the paper's law's b and fit a and d only (for a "
                             "few nearby sizes, which cannot pin b down)")
    parser.add_argument("--min_lrs", type=int, default=None,
                        help="lr-sensitivity: distinct LRs a parabola needs (default 5, >= 3)")
    parser.add_argument("--param", default=None, metavar="NAME",
                        help="tau: plot this parameter alone (a model.named_parameters() name) "
                             "instead of the 2x2 summary")
    parser.add_argument("--step", type=int, default=None,
                        help="experts: the evaluation step to plot (default the last)")
    return parser


# The options of some kinds only: flag -> (the kinds that read it, its default).
KIND_OPTIONS = {
    "vs": (("scaling", "within-size"), "adamw"), "fit": (("scaling",), "auto"),
    "x": (("curves",), "compute"), "best": (("curves",), False),
    "top_k": (("lrlaw",), 5), "allow_unswept": (("lrlaw",), False), "omega": (("lrlaw",), 4.0),
    "bootstrap": (("lrlaw",), 1000), "seed": (("lrlaw",), 0), "b_from_paper": (("lrlaw",), False),
    "min_lrs": (("lr-sensitivity",), 5), "param": (("tau",), None), "step": (("experts",), None),
}
# Each number's lowest value, and why.
LOWEST = {"top_k": (1, "at least 1"), "bootstrap": (0, "at least 0"),
          "min_lrs": (3, "at least 3 (a parabola has three coefficients)"),
          "omega": (0, "a finite number >= 0 (the weight-decay strength the runs trained with)"),
          "step": (0, "at least 0"), "seed": (0, "at least 0")}


def check_options(args) -> None:
    """Refuse an option the figure does not read (it would be ignored without a word) or a
    number out of its range; then fill in the defaults."""
    for name, (kinds, default) in KIND_OPTIONS.items():
        value = getattr(args, name)
        if value is None:
            setattr(args, name, default)
            continue
        if args.kind not in kinds:
            raise UserError(f"--{name} is read by plot {' and '.join(kinds)} only, not by plot "
                            f"{args.kind}; remove it.")
        if name in LOWEST and not (math.isfinite(value) and value >= LOWEST[name][0]):
            raise UserError(f"--{name} {value:g} must be {LOWEST[name][1]}.")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    check_options(args)
    out = args.out or Path(args.kind)
    for suffix in (".png", ".pdf"):
        durable.check_output(out.with_suffix(suffix), "--out")
    if args.kind in ("tau", "experts"):
        figure = (_tau_figure(args) if args.kind == "tau"
                  else plots.experts(experts.snapshots(args.dirs, args.step)))
        _save(figure, out)
        return 0
    runs = records.find_runs(args.dirs, note=_say)
    if args.kind != "curves":  # curves draws every run apart, each labelled with its dataset
        records.one_dataset(runs, f"a {args.kind} figure")
        records.check_distinct_seeds(runs)
    _save(FIGURES[args.kind](runs, args), out)
    return 0


def _baseline(runs, args) -> str:
    """The run group `--vs` names (a prefix or near name is matched, and said)."""
    baseline = records.match_optimizer({r.group for r in runs}, args.vs)
    if baseline != args.vs:
        print(f"--vs {args.vs} is {baseline}")
    return baseline


def _scaling(runs, args):
    figure = plots.scaling(table.best_per_size(runs), baseline=_baseline(runs, args),
                           fit=args.fit)
    if figure.fit is not None:
        print(f"floor a = {figure.fit.floor:.4g}, R² = {figure.fit.r2:.4f}")
    return figure


def _within_size(runs, args):
    baseline = _baseline(runs, args)
    return plots.within_size(budgets.within_size_multipliers(runs, baseline), baseline)


def _lrlaw(runs, args):
    figure, fits = plots.lrlaw_figure(runs, k=args.top_k, omega=args.omega,
                                      bootstrap=args.bootstrap, seed=args.seed,
                                      b_from_paper=args.b_from_paper,
                                      allow_unswept=args.allow_unswept, stages=STAGES)
    for group, fit in fits.items():
        base = group.split(" ")[0]
        kappa = next((r.kappa for r in runs if r.group == group), None)
        if fit.has_interval:
            print(f"# {group}: 95% intervals {fit.interval_text()}")
        else:
            print(f"# {group}: no bootstrap interval: with {len(fit.points)} sizes every "
                  "resample only reorders them; add a size")
        print(fit.rules_row(base, kappa))
    return figure


def _lr_sensitivity(runs, args):
    figure, parabolas = plots.lr_sensitivity(runs, min_lrs=args.min_lrs)
    for group, per_size in parabolas.items():
        for (arch, heads), p in per_size.items():
            if not p.has_minimum:
                print(f"{group} {arch} h{heads}: no minimum inside the swept LRs")
                continue
            print(f"{group} {arch} h{heads}: curvature ζ = {p.curvature:.4g}, "
                  f"lr* = {p.best_lr:.3g}, L* = {p.best_loss:.4f}")
    return figure


# The figures drawn from run records: kind -> (runs, parsed arguments) -> figure.
FIGURES = {
    "scaling": _scaling,
    "lr-sweep": lambda runs, args: plots.lr_sweeps(runs),
    "within-size": _within_size,
    "curves": lambda runs, args: plots.curves(runs, x=args.x, best=args.best),
    "lrlaw": _lrlaw,
    "lr-sensitivity": _lr_sensitivity,
}


def _say(message: str) -> None:
    print(f"danastar plot: {message}", file=sys.stderr, flush=True)


def _save(figure, out: Path) -> None:
    STAGES.start(f"drawing {out.with_suffix('.png')} and {out.with_suffix('.pdf')}")
    try:
        written = plots.save(figure, out)
    except OSError as error:
        raise UserError(f"--out {out} could not be written ({error.strerror or error}); free "
                        "space or give --out a path in a writable folder.") from None
    for path in written:
        print(f"wrote {path}")


def _tau_figure(args):
    if len(args.dirs) != 1:
        raise UserError("plot tau takes one run directory; plot each run on its own.")
    run_dir = Path(args.dirs[0])
    collections = tau.read_collections(run_dir)
    try:
        meta = json.loads((run_dir / "tau_stats" / "metadata.json").read_text())
    except (OSError, ValueError):
        meta = {}  # the title only; the figure needs the .npz files alone
    title = f"τ of {plots.display_name(meta.get('optimizer', '?'))}, " \
            f"{meta.get('arch', '?')} h{meta.get('heads', '?')} ({run_dir.name})"
    return plots.tau(collections, param=args.param, title=title)
