"""Study II's tables, figures and summary.json, rebuilt from the committed records alone.

    python studies/horizon/report.py    # docs/study-horizon/*, studies/horizon/summary.json

The two estimators of the compute multiplier against AdamW, at each horizon (2 heads):

* **within the horizon** (the first study's): AdamW at its best LR for that horizon, trained at
  1/4, 1/2 and 1 (and 2, where needed) times the horizon's steps, is a loss-against-compute curve;
  an optimizer's final loss at the horizon read off it (log-log interpolation, seeds paired)
  gives AdamW's compute for that loss, divided by the optimizer's (`analysis.budgets`).
* **the paper's** (the release's `compare_scaling_rules_ep.py`, measured curve): each optimizer's
  best final loss at each horizon is one point (C, L), C = 6 N_ne D; AdamW's points over the
  horizons are its curve, interpolated piecewise-linearly in log C against log L (outside its
  range, the line through its two end points on that side: marked extrapolated); an optimizer's
  point at a horizon read off it gives AdamW's compute for that loss, divided by the
  optimizer's. The release takes the lowest loss of all runs at a size (one seed); here each
  seed's best-LR loss is read off AdamW's curve of the same seed, for a mean and an error.

The ablations (3 and 4 heads): the paired change in final loss (same seed, same LR) against the
first study's run, and each run's loss read off the first study's AdamW curve at that size (as
the first study's within-size multiplier): the ablated optimizer against AdamW with the same
change, so that a change that helps every optimizer alike does not move it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/common.py, which puts src/ on the path too
sys.path.insert(0, str(HERE))

from common import ROOT, figure_writer, fmt, paper_estimate, pm  # noqa: E402
from study import ABLATIONS, BASELINE, EXTRA, HEADS, HORIZONS, REQUIRED  # noqa: E402

from danastar.analysis import budgets, multiplier, plots, records, seeds  # noqa: E402
from danastar.errors import UserError  # noqa: E402

RECORDS = HERE / "records"
FIRST_RECORDS = ROOT / "studies" / "cpu-shakespeare" / "records"
OUT = ROOT / "docs" / "study-horizon"
SUMMARY = HERE / "summary.json"

OPTIMIZERS = (*REQUIRED, *EXTRA)
EPOCH_TOKENS = 1_892_697  # the embedded corpus's training tokens


def quiet(_message: str) -> None:
    """The report reads only records it wrote itself; notes about others do not concern it."""


def lr_multiplier(run: records.Run) -> float:
    return float(json.loads((run.path / "sweep_point.json").read_text())["lr_multiplier"])


def horizon_of(run: records.Run) -> int:
    return int(run.path.parent.name.split("-")[0][1:])  # records/x16-adana-lr/<point>


def clean(value: float | None, digits: int = 6) -> float | None:
    return None if value is None or math.isnan(value) else float(f"{value:.{digits}g}")


# ---- the horizon ------------------------------------------------------------------------------

class Horizon:
    """The complete runs of one horizon and each optimizer's best LR there (chosen on seed 0,
    which every LR has, at the horizon's steps)."""

    def __init__(self, horizon: int, runs: list[records.Run]):
        self.horizon, self.steps = horizon, HORIZONS[horizon]
        self.runs = [r for r in runs if horizon_of(r) == horizon and r.complete]
        self.best: dict[str, list[records.Run]] = {}
        for optimizer in OPTIMIZERS:
            mine = [r for r in self.runs if r.optimizer == optimizer]
            if any(r.iterations == self.steps for r in mine):
                self.best[optimizer] = budgets.best_lr_runs(mine)

    def at_steps(self, optimizer: str) -> list[records.Run]:
        return sorted((r for r in self.best.get(optimizer, []) if r.iterations == self.steps),
                      key=lambda r: r.seed)

    def swept(self, optimizer: str) -> list[float]:
        return sorted({lr_multiplier(r) for r in self.runs if r.optimizer == optimizer
                       and r.iterations == self.steps and r.seed == 0})

    def tokens_per_param(self) -> float:
        run = self.runs[0]
        return run.plan["tokens_per_step"] * self.steps / run.total_params


def best_lr_table(horizons: list[Horizon]) -> list[str]:
    lines = ["| horizon | steps | tokens/param | epochs | optimizer | LRs swept (× law) | "
             "best (× law) | best LR | final loss (seeds) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for h in horizons:
        if not h.runs:
            continue
        epochs = h.runs[0].plan["tokens_per_step"] * h.steps \
            / EPOCH_TOKENS
        for optimizer in OPTIMIZERS:
            final = h.at_steps(optimizer)
            if not final:
                continue
            loss = seeds.mean_se([r.final_loss for r in final])
            lines.append(f"| {h.horizon}× | {h.steps} | {h.tokens_per_param():.2f} | "
                         f"{epochs:.2f} | {optimizer} | "
                         f"{', '.join(f'{m:g}' for m in h.swept(optimizer))} | "
                         f"{lr_multiplier(final[0]):g} | {final[0].lr:.3g} | {pm(loss)} "
                         f"({loss.n}) |")
    return lines


def within(h: Horizon) -> dict[str, budgets.BudgetMultiplier]:
    """The first study's estimator at one horizon: optimizer -> its multiplier at the horizon."""
    chosen = [r for runs in h.best.values() for r in runs]
    try:
        results = budgets.within_size_multipliers(chosen, BASELINE)
    except UserError as error:
        print(f"{h.horizon}x within-horizon multipliers: {error}")
        return {}
    return {r.optimizer.split(" ")[0]: r for r in results  # the group label: "adana κ=0.85"
            if r.iterations == h.steps and len(r.seeds) > 1}


def papers(horizons: list[Horizon]) -> dict[tuple[int, str], tuple[seeds.MeanSE, bool]]:
    """The paper's estimator: (horizon, optimizer) -> (multiplier over seeds, extrapolated)."""
    curve: dict[int, list[tuple[float, float]]] = {}  # seed -> AdamW's (PFH, loss) points
    for h in horizons:
        for run in h.at_steps(BASELINE):
            curve.setdefault(run.seed, []).append((run.pfh, run.final_loss))
    result = {}
    for h in horizons:
        for optimizer in OPTIMIZERS:
            if optimizer == BASELINE:
                continue
            estimate = paper_estimate(curve, h.at_steps(optimizer))
            if estimate is not None:
                result[(h.horizon, optimizer)] = estimate
    return result


def multiplier_table(horizons, inside, paper) -> tuple[list[str], list[dict]]:
    lines = ["| horizon | tokens/param | optimizer | seeds | final loss | within the horizon | "
             f"steps to {BASELINE}'s loss | the paper's estimator |",
             "|---|---|---|---|---|---|---|---|"]
    rows = []
    for h in horizons:
        for optimizer in OPTIMIZERS:
            if optimizer == BASELINE or not h.at_steps(optimizer):
                continue
            final = h.at_steps(optimizer)
            loss = seeds.mean_se([r.final_loss for r in final])
            mine = inside.get(h.horizon, {}).get(optimizer)
            cell_in, steps = "–", "–"
            if mine is not None:
                cell_in = pm(mine.multiplier, ".2f") + (" (extrapolated)" if mine.extrapolated
                                                        else "")
                steps = ("not by every seed" if mine.steps_fraction is None
                         else pm(mine.steps_fraction, ".0%"))
                rows.append(summary_row(h, optimizer, "within-horizon", mine.multiplier,
                                        len(mine.seeds), final[0].lr, mine.extrapolated))
            theirs = paper.get((h.horizon, optimizer))
            cell_paper = "–"
            if theirs is not None:
                cell_paper = pm(theirs[0], ".2f") + (" (extrapolated)" if theirs[1] else "")
                rows.append(summary_row(h, optimizer, "paper", theirs[0], theirs[0].n,
                                        final[0].lr, theirs[1]))
            lines.append(f"| {h.horizon}× | {h.tokens_per_param():.2f} | {optimizer} | "
                         f"{loss.n} | {pm(loss)} | {cell_in} | {steps} | {cell_paper} |")
    return lines, rows


def summary_row(h: Horizon, optimizer: str, estimator: str, value: seeds.MeanSE, count: int,
                lr: float, extrapolated: bool) -> dict:
    return {"heads": HEADS, "tokens_per_param": clean(h.tokens_per_param(), 3),
            "optimizer": optimizer, "estimator": estimator,
            "multiplier": clean(value.mean, 4), "multiplier_se": clean(value.se, 3),
            "seeds": count, "best_lr": clean(lr, 4), "extrapolated": extrapolated}


def multiplier_figure(rows: list[dict]):
    figure, ax = new_figure(6.5, 4.2)
    ax.axhline(1.0, color=plots.colour(BASELINE), linewidth=1.2,
               label=f"{plots.display_name(BASELINE)} (1 by definition)")
    for optimizer in OPTIMIZERS:
        for estimator, marker, fill, shift in (("within-horizon", "s", True, 0.97),
                                               ("paper", "o", False, 1.03)):
            mine = sorted((r for r in rows if r["optimizer"] == optimizer
                           and r["estimator"] == estimator), key=lambda r: r["tokens_per_param"])
            if not mine:
                continue
            xs = [r["tokens_per_param"] * shift for r in mine]
            colour = plots.colour(optimizer)
            ax.plot(xs, [r["multiplier"] for r in mine], color=colour,
                    linestyle="-" if fill else ":",
                    label=f"{plots.display_name(optimizer)}, "
                          f"{'within the horizon' if fill else 'the paper’s estimator'}")
            for x, r in zip(xs, mine):  # an extrapolated reading is a triangle
                ax.errorbar(x, r["multiplier"], yerr=r["multiplier_se"] or 0.0, capsize=3,
                            marker="^" if r["extrapolated"] else marker, color=colour,
                            markerfacecolor=colour if fill else "white")
    ax.plot([], [], linestyle="none", marker="^", color="grey", markerfacecolor="white",
            label="▲ read off AdamW's curve extrapolated")
    ax.set_xscale("log")
    ax.set_xlabel("tokens per parameter (2 heads, 1.25M parameters; 128, 512, 2048 steps)")
    ax.set_ylabel(f"compute multiplier vs {plots.display_name(BASELINE)} (bigger is better)")
    ax.set_xticks(sorted({r["tokens_per_param"] for r in rows}))
    ax.get_xaxis().set_major_formatter(plain_formatter())
    ax.minorticks_off()
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=7, loc="best")
    ax.set_title("Compute multiplier against the horizon (mean ± s.e. over 3 seeds)", fontsize=9)
    return figure


def best_lr_figure(horizons: list[Horizon]):
    figure, ax = new_figure(6.0, 4.0)
    for optimizer in OPTIMIZERS:
        points = [(h.tokens_per_param(), h.at_steps(optimizer)[0])
                  for h in horizons if h.at_steps(optimizer)]
        if not points:
            continue
        ax.plot([x for x, _ in points], [r.lr for _, r in points], marker="o",
                color=plots.colour(optimizer), linestyle=plots.linestyle(optimizer),
                label=f"{plots.display_name(optimizer)}: best LR")
        run = points[0][1]
        law = run.lr / lr_multiplier(run)
        ax.axhline(law, color=plots.colour(optimizer), linewidth=0.8, alpha=0.6,
                   linestyle=":", label=f"{plots.display_name(optimizer)}: the LR law's")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(sorted({h.tokens_per_param() for h in horizons if h.runs}))
    ax.get_xaxis().set_major_formatter(plain_formatter("%.2f"))
    ax.minorticks_off()
    low, high = ax.get_ylim()
    ax.set_yticks([v for v in (1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2e-2, 3e-2) if low <= v <= high])
    ax.get_yaxis().set_major_formatter(plain_formatter())
    ax.set_xlabel("tokens per parameter (2 heads)")
    ax.set_ylabel("peak learning rate")
    ax.grid(True, which="both", alpha=0.2)
    figure.set_size_inches(9.0, 4.0)
    figure.legend(fontsize=7, loc="outside right upper")
    ax.set_title("Best LR at each horizon (seed 0) and the LR law's (which ignores the "
                 "horizon)", fontsize=9)
    return figure


def repetition_figure(h: Horizon):
    """Validation and training loss against epochs at the longest horizon, best LRs, seed 0."""
    figure, ax = new_figure(7.0, 4.2)
    drawn = 0
    for optimizer in OPTIMIZERS:
        final = [r for r in h.at_steps(optimizer) if r.seed == 0]
        if not final:
            continue
        run = final[0]
        per_epoch = run.plan["tokens_per_step"] / EPOCH_TOKENS
        steps, losses = budgets.periodic_curve(run)  # the same 8 batches at every point
        ax.plot([s * per_epoch for s in steps], losses, color=plots.colour(optimizer),
                linestyle=plots.linestyle(optimizer), marker=".", markersize=3,
                label=f"{plots.display_name(optimizer)}: validation (8 fixed batches)")
        ax.plot(run.iterations * per_epoch, run.final_loss, marker="D", markersize=5,
                color=plots.colour(optimizer), markerfacecolor="white", linestyle="none",
                label=f"{plots.display_name(optimizer)}: final, whole validation set")
        train = [(r["step"] * per_epoch, r["train_loss"]) for r in run.metrics
                 if "train_loss" in r and r["step"] > 0]
        ax.plot(*zip(*train), color=plots.colour(optimizer), linewidth=0.7, alpha=0.5,
                label=f"{plots.display_name(optimizer)}: training (logged batches)")
        drawn += 1
    if not drawn:
        raise UserError("no seed-0 run at the longest horizon yet")
    epochs = h.runs[0].plan["tokens_per_step"] * h.steps / EPOCH_TOKENS
    for epoch in range(1, int(epochs) + 1):
        ax.axvline(epoch, color="grey", linewidth=0.6, linestyle="--")
    ax.set_ylim(top=6.0)
    ax.set_xlabel("epochs of the corpus (dashed: each epoch's end)")
    ax.set_ylabel("loss")
    ax.grid(True, which="both", alpha=0.2)
    figure.set_size_inches(10.0, 4.2)
    figure.legend(fontsize=7, loc="outside right upper")
    ax.set_title(f"{h.horizon}× the first study's budget ({h.steps} steps, {epochs:.1f} epochs), "
                 "seed 0, each at its best LR: does repetition bite?", fontsize=9)
    return figure


def lr_sweep_figure(horizons: list[Horizon]):
    """Final loss against LR at each horizon's steps, seed 0 (what the best LR is chosen on);
    one panel per horizon, the best LR starred."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(4.2 * len(horizons), 4.0), layout="constrained")
    axes = figure.subplots(1, len(horizons), squeeze=False)[0]
    for ax, h in zip(axes, horizons):
        for optimizer in OPTIMIZERS:
            points = sorted((r.lr, r.final_loss) for r in h.runs if r.optimizer == optimizer
                            and r.iterations == h.steps and r.seed == 0)
            if not points:
                continue
            ax.plot(*zip(*points), marker="o", markersize=4, color=plots.colour(optimizer),
                    linestyle=plots.linestyle(optimizer), label=plots.display_name(optimizer))
            best = h.at_steps(optimizer)
            if best:
                seed0 = [r for r in best if r.seed == 0][0]
                ax.plot(seed0.lr, seed0.final_loss, "*", markersize=12,
                        color=plots.colour(optimizer))
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel("final validation loss (seed 0)")
        ax.set_title(f"{h.horizon}× ({h.steps} steps, {h.tokens_per_param():.2f} tokens/param)",
                     fontsize=9)
        ax.grid(True, which="both", alpha=0.2)
        ax.legend(fontsize=7)
    return figure


def new_figure(width: float, height: float):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    return figure, figure.subplots()


def plain_formatter(spec: str = "%g"):
    from matplotlib.ticker import FormatStrFormatter

    return FormatStrFormatter(spec)


# ---- the ablations ----------------------------------------------------------------------------

def adamw_curves(runs: list[records.Run]) -> dict[int, list[tuple[float, float]]]:
    """seed -> the first study's AdamW (PFH, final loss) at its best LR's budgets, one size."""
    curves: dict[int, list[tuple[float, float]]] = {}
    for run in budgets.best_lr_runs(runs):
        curves.setdefault(run.seed, []).append((run.pfh, run.final_loss))
    return {seed: sorted(points) for seed, points in curves.items()}


def ablation_table(ablated: list[records.Run], first: list[records.Run]) -> list[str]:
    lines = ["| heads | change | optimizer | seeds | final loss, first study | with the change | "
             "Δ loss (paired) | multiplier vs AdamW, first study | with the change |",
             "|---|---|---|---|---|---|---|---|---|"]
    for heads in sorted({r.heads for r in ablated}):
        size_runs = [r for r in first if r.heads == heads and r.complete]
        curves = adamw_curves([r for r in size_runs if r.optimizer == BASELINE])

        def read_off(run: records.Run, curves=curves) -> float:
            (point,) = multiplier.measured_multipliers(curves[run.seed],
                                                       [(run.pfh, run.final_loss)])
            return point.multiplier

        for change in ABLATIONS:
            cell = [r for r in ablated if r.heads == heads and r.path.parent.name.endswith(
                "-" + change)]
            changed_adamw = {r.seed: r for r in cell if r.optimizer == BASELINE}
            for optimizer in OPTIMIZERS:
                mine = sorted((r for r in cell if r.optimizer == optimizer), key=lambda r: r.seed)
                if not mine:
                    continue
                steps = mine[0].iterations
                before = {r.seed: r for r in size_runs if r.optimizer == optimizer
                          and r.iterations == steps and records.lr_key(r.lr)
                          == records.lr_key(mine[0].lr)}
                paired = [r for r in mine if r.seed in before]
                if len(paired) < 2:
                    continue
                old = [before[r.seed].final_loss for r in paired]
                new = [r.final_loss for r in paired]
                delta = seeds.mean_se([b - a for a, b in zip(old, new)])
                if optimizer == BASELINE:
                    # against the first study's AdamW: what the change alone is worth to it
                    m_old = "1 (the baseline)"
                    m_new = f"{pm(seeds.mean_se([read_off(r) for r in paired]), '.2f')} (alone)"
                else:
                    m_old = pm(seeds.mean_se([read_off(before[r.seed]) for r in paired]), ".2f")
                    if BASELINE not in ABLATIONS[change][1]:
                        shifted = [read_off(r) for r in paired]  # AdamW unchanged
                    else:
                        shifted = [read_off(r) / read_off(changed_adamw[r.seed])
                                   for r in paired if r.seed in changed_adamw]
                    m_new = pm(seeds.mean_se(shifted), ".2f") if len(shifted) > 1 else "–"
                t = delta.mean / delta.se if delta.se and not math.isnan(delta.se) else math.nan
                lines.append(f"| {heads} | {change} | {optimizer} | {len(paired)} | "
                             f"{pm(seeds.mean_se(old))} | {pm(seeds.mean_se(new))} | "
                             f"{delta.mean:+.4f} ± {fmt(delta.se)} (t {t:+.1f}) | {m_old} | "
                             f"{m_new} |")
    return lines


# ---- the report -------------------------------------------------------------------------------

def cpu_time(complete: list[records.Run]) -> str:
    timed = [r.wall_seconds for r in complete if r.wall_seconds is not None]
    resumed = len(complete) - len(timed)
    hours = sum(timed) / 3600
    return (f"{len(timed)} runs ran in one go: {hours:.2f} hours of run time "
            f"({hours / 2:.2f} hours of the 2-core machine, two one-thread runs side by side); "
            f"{resumed} were interrupted and resumed (their wall time is not counted).")


def report() -> None:
    runs = records.find_runs([RECORDS], note=quiet) if RECORDS.is_dir() else []
    complete = [r for r in runs if r.complete]
    horizon_runs = [r for r in complete if r.path.parent.name.startswith("x")]
    ablated = [r for r in complete if r.path.parent.name.startswith("ab-")]
    OUT.mkdir(parents=True, exist_ok=True)
    text = ["# Study II: tables", "",
            "Generated by `python studies/horizon/report.py` from `studies/horizon/records/` "
            "(and, for the ablations' unchanged runs, `studies/cpu-shakespeare/records/`); do "
            f"not edit. {len(complete)} complete runs.", ""]
    figure = figure_writer(OUT, text)

    horizons = [Horizon(h, horizon_runs) for h in HORIZONS]
    horizons = [h for h in horizons if h.runs]
    text += ["## Best LR at each horizon (2 heads)", ""] + best_lr_table(horizons) + [""]
    inside = {h.horizon: within(h) for h in horizons}
    paper = papers(horizons)
    lines, rows = multiplier_table(horizons, inside, paper)
    text += [f"## Compute multiplier against {BASELINE}", ""] + lines + [""]
    if rows:
        figure("multiplier_horizon", lambda: multiplier_figure(rows))
    if horizons:
        figure("best_lr_horizon", lambda: best_lr_figure(horizons))
        figure("repetition", lambda: repetition_figure(horizons[-1]))
        figure("lr_sweep", lambda: lr_sweep_figure(horizons))
    if ablated:
        first = records.find_runs([FIRST_RECORDS], note=quiet)
        text += ["## Ablations at the first study's budget and best LRs", ""]
        text += ablation_table(ablated, first) + [""]
    text += ["## CPU time", ""]
    text += [f"* {part}: {cpu_time(part_runs)}" for part, part_runs in
             (("the horizon", horizon_runs), ("the ablations", ablated)) if part_runs]
    text += ["" if complete else "no runs yet.", ""]
    (OUT / "results.md").write_text("\n".join(text))
    SUMMARY.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    print("wrote", (OUT / "results.md").relative_to(ROOT), "and",
          SUMMARY.relative_to(ROOT))


if __name__ == "__main__":
    report()
