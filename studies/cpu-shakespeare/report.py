"""The study's tables and figures, rebuilt from the committed records alone (no training).

    python studies/cpu-shakespeare/report.py        # writes docs/study-cpu/*.png|pdf, results.md

Figures: the LR sweep per size, the validation curves at the best LRs, the compute multiplier
against AdamW within each size (seed error bars) with the steps to AdamW's loss, the LR laws
fitted on the three sizes (freely, and with b held at the paper's), the LR sensitivity.
Tables (results.md): best LR per size against the scaling law's, the multipliers, the
sensitivities, the fitted laws next to the paper's, and the CPU time the runs took.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/common.py, which puts src/ on the path too

from common import ROOT, figure_writer, fmt, pm  # noqa: E402

from danastar.analysis import budgets, plots, records, sensitivity, table  # noqa: E402
from danastar.errors import UserError  # noqa: E402

RECORDS = HERE / "records"
OUT = ROOT / "docs" / "study-cpu"
BASELINE = "adamw"


def lr_multiplier(run: records.Run) -> float | None:
    point = run.path / "sweep_point.json"
    return json.loads(point.read_text()).get("lr_multiplier") if point.is_file() else None


def best_lr_table(runs: list[records.Run]) -> list[str]:
    lines = ["| optimizer | heads | steps | LRs swept (× law) | best (× law) | best LR | law's LR "
             "| final loss (seeds) |", "|---|---|---|---|---|---|---|---|"]
    for best in table.best_per_size(runs):
        swept = sorted({lr_multiplier(r) for r in runs if r.group == best.optimizer
                        and r.size == (best.arch, best.heads) and r.complete
                        and r.iterations == best.runs[0].iterations} - {None})
        chosen = lr_multiplier(best.runs[0])
        law = best.lr / chosen if chosen else None
        lines.append(f"| {best.optimizer} | {best.heads} | {best.runs[0].iterations} | "
                     f"{', '.join(f'{m:g}' for m in swept)} | {fmt(chosen, 'g')} | "
                     f"{best.lr:.3g} | {fmt(law, '.3g')} | {pm(best.loss)} ({best.loss.n}) |")
    return lines


def multiplier_table(results: list[budgets.BudgetMultiplier]) -> list[str]:
    lines = [f"| optimizer | heads | steps | seeds | final loss | multiplier vs {BASELINE} | "
             f"steps to {BASELINE}'s loss |", "|---|---|---|---|---|---|---|"]
    for r in results:
        mark = " (extrapolated)" if r.extrapolated else ""
        unpaired = "" if r.paired else " (seed-mean curve)"
        missed = "not reached" if len(r.seeds) == 1 else "not by every seed"
        steps = missed if r.steps_fraction is None else pm(r.steps_fraction, ".0%")
        lines.append(f"| {r.optimizer} | {r.heads} | {r.iterations} | {len(r.seeds)} | "
                     f"{pm(r.losses)} | {pm(r.multiplier, '.2f')}{mark}{unpaired} | {steps} |")
    return lines


def sensitivity_table(parabolas: dict) -> list[str]:
    lines = ["| optimizer | heads | curvature ζ | lr* | ΔL at 2× LR error |",
             "|---|---|---|---|---|"]
    for group, per_size in parabolas.items():
        for (_, heads), p in sorted(per_size.items()):
            if not p.has_minimum:
                lines.append(f"| {group} | {heads} | no minimum inside the swept LRs | – | – |")
                continue
            cost = sensitivity.lr_error_cost(p.curvature, 1.0)
            lines.append(f"| {group} | {heads} | {p.curvature:.4f} | {p.best_lr:.3g} | "
                         f"{cost:.4f} |")
        mean = sensitivity.mean_curvature(list(per_size.values()))
        cost = None if math.isnan(mean) else sensitivity.lr_error_cost(mean, 1.0)
        lines.append(f"| {group} | mean | {fmt(mean)} | | {fmt(cost)} |")
    return lines


def law_table(fits: dict, held: dict, runs: list[records.Run]) -> list[str]:
    """Each optimizer's law fitted freely (a, b, d) and with b held at the paper's, next to the
    paper's law, with the ratio of the fitted LR to the paper's at 4 and at 12 heads."""
    lines = ["| optimizer | fit | a, b, d | 95% bootstrap | paper's a, b, d | "
             "fitted / paper's LR at h4 | at h12 (P = 84.9M) |", "|---|---|---|---|---|---|---|"]
    for group in sorted(set(fits) | set(held)):
        paper = plots.paper_law(next(r for r in runs if r.group == group))
        for how, fit in (("a, b, d free", fits.get(group)), ("b held at the paper's",
                                                             held.get(group))):
            if fit is None:
                continue
            intervals = (fit.interval_text()
                         or f"none ({len(fit.points)} sizes: resamples only reorder them)")
            cells = [how, f"{fit.a:.3g}, {fit.b:.3g}, {fit.d:.3f}", intervals]
            if paper is None:
                cells += ["–", "–", "–"]
            else:
                a, b, d = paper
                cells.append(f"{a:.3g}, {b:.3g}, {d:.3f}")
                for params in (12 * 256 ** 2 * 3, 12 * 768 ** 2 * 12):
                    cells.append(f"{fit.lr(params) / (a * (b + params) ** d):.2f}")
            lines.append(f"| {group} | " + " | ".join(cells) + " |")
    return lines


def cpu_time(complete: list[records.Run]) -> str:
    """The run time of the complete runs: measured for those that ran in one go, and for resumed
    ones (whose wall time includes the pause) the mean of the one-go runs of their size and
    budget."""
    timed: dict[tuple, list[float]] = {}
    for run in complete:
        if run.wall_seconds is not None:
            timed.setdefault((run.size, run.iterations), []).append(run.wall_seconds)
    measured = sum(sum(v) for v in timed.values())
    resumed = [r for r in complete if r.wall_seconds is None]
    estimated = sum(sum(timed[key]) / len(timed[key]) for r in resumed
                    if (key := (r.size, r.iterations)) in timed)
    count = sum(len(v) for v in timed.values())
    return (f"{count} runs ran in one go: {measured / 3600:.2f} hours of run time, mean "
            f"{measured / max(1, count):.0f} s per run. {len(resumed)} runs were interrupted and "
            f"resumed; at the mean of the one-go runs of their size and budget they add about "
            f"{estimated / 3600:.2f} hours: about {(measured + estimated) / 3600:.1f} run-hours "
            "in all. Two one-thread runs trained side by side on the 2-core machine, so the "
            f"machine was busy about {(measured + estimated) / 7200:.1f} hours.")


def report() -> None:
    runs = records.find_runs([RECORDS])
    complete = [r for r in runs if r.complete]
    OUT.mkdir(parents=True, exist_ok=True)
    text = ["# CPU study: tables", "",
            "Generated by `python studies/cpu-shakespeare/report.py` from "
            "`studies/cpu-shakespeare/records/`; do not edit. "
            f"{len(complete)} complete runs, {len(runs) - len(complete)} partial.", ""]
    figure = figure_writer(OUT, text)

    figure("lr_sweep", lambda: plots.lr_sweeps(runs))
    best_seed0 = []
    for key in sorted({(r.group, r.size) for r in complete}):
        group_runs = [r for r in complete if (r.group, r.size) == key]
        chosen = budgets.best_lr_runs(group_runs)
        sweep_steps = budgets.sweep_budget(group_runs)
        best_seed0 += [r for r in chosen if r.seed == 0 and r.iterations == sweep_steps]
    figure("curves", lambda: plots.curves(best_seed0))
    parabolas: dict = {}

    def sensitivity_figure():
        made, found = plots.lr_sensitivity(runs)
        parabolas.update(found)
        return made

    figure("lr_sensitivity", sensitivity_figure)
    fits: dict = {}  # the laws fitted freely
    held: dict = {}  # and with b held at the paper's

    def law_figure(found: dict, b_from_paper: bool):
        def make():
            made, fitted = plots.lrlaw_figure(runs, k=5, bootstrap=1000, seed=0,
                                              b_from_paper=b_from_paper)
            found.update(fitted)
            return made
        return make

    figure("lrlaw", law_figure(fits, False))
    figure("lrlaw_paper_b", law_figure(held, True))
    text += ["## Best LR per size", ""] + best_lr_table(runs) + [""]
    try:
        results = budgets.within_size_multipliers(runs, BASELINE)
        figure("within_size", lambda: plots.within_size(results, BASELINE))
        text += [f"## Compute multiplier against {BASELINE} within each size", ""]
        text += multiplier_table(results) + [""]
    except UserError as error:
        text += [f"*Multipliers: not computed yet: {error}*", ""]
    if parabolas:
        text += ["## LR sensitivity", ""] + sensitivity_table(parabolas) + [""]
    if fits or held:
        text += ["## LR laws fitted on the study's sizes", ""] + law_table(fits, held, runs)
        text += [""]
    text += ["## CPU time", "", cpu_time(complete), ""]
    (OUT / "results.md").write_text("\n".join(text))
    print("wrote", (OUT / "results.md").relative_to(ROOT))


if __name__ == "__main__":
    report()
