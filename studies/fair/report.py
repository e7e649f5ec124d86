"""Study III's tables, figures and summary.json, rebuilt from the committed records alone.

    python studies/fair/report.py    # docs/study-fair/*, studies/fair/summary.json

For each corpus, horizon and optimizer, two recipes (`py` says how each is chosen): "the
paper's" (warm-up T/50, the LR tuned) and "each tuned" (the warm-up tuned too, then the LR
re-checked). Each optimizer is compared with AdamW under the same recipe, by two estimators of
the compute multiplier (as Study II's report, `studies/horizon/report.py`):

* **within the horizon**: AdamW's best pair at 1/4, 1/2, 1 (and 2, where needed) times the
  horizon's steps is a loss-against-compute curve; an optimizer's final loss read off it
  (log-log interpolation, seeds paired) gives AdamW's compute for that loss, divided by the
  optimizer's (`analysis.budgets`);
* **the paper's**: AdamW's best final losses over the horizons of a corpus are its curve; an
  optimizer's point at a horizon read off the curve of the same seed (`analysis.multiplier`),
  outside the curve's range extrapolated from its two end points and marked so.

Every loss is the final validation loss over the whole validation set of its corpus.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from scipy import stats

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/common.py, which puts src/ on the path too
sys.path.insert(0, str(HERE))

from common import ROOT, figure_writer, fmt, paper_estimate, pm  # noqa: E402
from study import (  # noqa: E402
    BASELINE,
    CORPORA,
    GROUPS,
    SEEDS,
    STEPS,
    WARMUPS,
    Key,
    walk,
    warmup_label,
    warmup_steps,
)

from danastar.analysis import budgets, plots, records, seeds  # noqa: E402
from danastar.errors import UserError  # noqa: E402

OUT = ROOT / "docs" / "study-fair"
SUMMARY = HERE / "summary.json"
# Training tokens of each prepared corpus (its meta.json): what an epoch is.
TRAIN_TOKENS = {"sh": 1_892_697, "pr": 14_342_670}
RECIPES = ("paper", "tuned")
RECIPE_NAMES = {"paper": "the paper's (warm-up T/50)", "tuned": "each tuned"}


def clean(value: float | None, digits: int = 6) -> float | None:
    return None if value is None or math.isnan(value) else float(f"{value:.{digits}g}")


class Results:
    """The records behind every comparison, keyed as the driver keys them."""

    def __init__(self):
        self.planner = walk()
        self.runs: dict[Key, records.Run] = {}

    def run(self, key: Key) -> records.Run | None:
        if key not in self.runs:
            found = self.planner.known.get(key)
            self.runs[key] = None if found is None else records.read_run(found[1])
        return self.runs[key]

    def chosen_runs(self, corpus: str, horizon: int, optimizer: str, recipe: str,
                    steps: int | None = None) -> list[records.Run]:
        """The seeds of one recipe's best pair (at `steps`, by default the horizon's)."""
        pair = self.planner.chosen.get((corpus, horizon, optimizer, recipe))
        if pair is None:
            return []
        steps = steps or STEPS[horizon]
        found = [self.run(Key(corpus, steps, optimizer, pair[0], warmup_steps(steps, pair[1]),
                              seed)) for seed in SEEDS]
        return [r for r in found if r is not None]

    def horizons(self, corpus: str) -> list[int]:
        return sorted({h for (c, h, _, _) in self.planner.chosen if c == corpus})

    def optimizers(self, corpus: str) -> list[str]:
        found = {o for (c, _, o, _) in self.planner.chosen if c == corpus}
        return [BASELINE, *sorted(found - {BASELINE})]

    def tokens_per_param(self, corpus: str, horizon: int) -> float | None:
        runs = self.chosen_runs(corpus, horizon, BASELINE, "paper") or [
            r for o in self.optimizers(corpus) for r in
            self.chosen_runs(corpus, horizon, o, "paper")]
        return None if not runs else runs[0].plan["tokens_per_step"] * STEPS[horizon] \
            / runs[0].total_params

    def epochs(self, corpus: str, steps: int) -> float | None:
        return None if TRAIN_TOKENS[corpus] is None else 4096 * steps / TRAIN_TOKENS[corpus]


# ---- the estimators ---------------------------------------------------------------------------

def within(results: Results, corpus: str, horizon: int, recipe: str
           ) -> dict[str, budgets.BudgetMultiplier]:
    """optimizer -> its multiplier against AdamW's budget curve, both under `recipe`."""
    steps = STEPS[horizon]
    baseline = [r for share in (4, 2, 1, 0.5) for r in results.chosen_runs(
        corpus, horizon, BASELINE, recipe, int(steps / share))]
    chosen = [r for o in results.optimizers(corpus) if o != BASELINE
              for r in results.chosen_runs(corpus, horizon, o, recipe)]
    if not baseline or not chosen:
        return {}
    try:
        found = budgets.within_size_multipliers(baseline + chosen, BASELINE)
    except UserError as error:
        print(f"{corpus} {horizon}x {recipe}: within-horizon multipliers: {error}")
        return {}
    return {r.optimizer.split(" ")[0]: r for r in found
            if r.iterations == steps and len(r.seeds) > 1}


def papers(results: Results, corpus: str, recipe: str
           ) -> dict[tuple[int, str], tuple[seeds.MeanSE, bool]]:
    """(horizon, optimizer) -> (the paper's estimator over seeds, extrapolated)."""
    curve: dict[int, list[tuple[float, float]]] = {}
    for horizon in results.horizons(corpus):
        for run in results.chosen_runs(corpus, horizon, BASELINE, recipe):
            curve.setdefault(run.seed, []).append((run.pfh, run.final_loss))
    found = {}
    for horizon in results.horizons(corpus):
        for optimizer in results.optimizers(corpus)[1:]:
            estimate = paper_estimate(
                curve, results.chosen_runs(corpus, horizon, optimizer, recipe))
            if estimate is not None:
                found[(horizon, optimizer)] = estimate
    return found


# ---- tables -----------------------------------------------------------------------------------

def loss_of(runs: list[records.Run]) -> str:
    return "–" if not runs else f"{pm(seeds.mean_se([r.final_loss for r in runs]))} " \
                                f"({len(runs)})"


def recipe_table(results: Results) -> list[str]:
    lines = ["| corpus | horizon | steps | tokens/param | epochs | optimizer | paper: LR (× law) "
             "| paper: final loss | tuned: warm-up | tuned: LR (× law) | tuned: final loss | "
             "tuned − paper (paired) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for corpus in CORPORA:
        for horizon in results.horizons(corpus):
            steps = STEPS[horizon]
            for optimizer in results.optimizers(corpus):
                paper = results.chosen_runs(corpus, horizon, optimizer, "paper")
                tuned = results.chosen_runs(corpus, horizon, optimizer, "tuned")
                pair = {r: results.planner.chosen.get((corpus, horizon, optimizer, r))
                        for r in RECIPES}
                if not paper:
                    continue
                change = "–"
                gap = paired_gap(tuned, paper)  # the same seeds' data orders: their differences
                if gap is not None:
                    difference = gap[0]
                    change = f"{difference.mean:+.4f} ± {difference.se:.4f} ({difference.n})"
                lines.append(
                    f"| {CORPORA[corpus]} | {horizon}× | {steps} | "
                    f"{fmt(results.tokens_per_param(corpus, horizon), '.2f')} | "
                    f"{fmt(results.epochs(corpus, steps), '.2f')} | {optimizer} | "
                    f"{pair['paper'][0]:g} | {loss_of(paper)} | "
                    + ("– | – | – | –" if pair["tuned"] is None else
                       f"{warmup_label(pair['tuned'][1])} "
                       f"({warmup_steps(steps, pair['tuned'][1])}) | {pair['tuned'][0]:g} | "
                       f"{loss_of(tuned)} | {change}") + " |")
    return lines


def sweep_table(results: Results) -> list[str]:
    """The seed-0 losses each tuned choice was made from."""
    labels = [warmup_label(i) for i in range(len(WARMUPS))]
    lines = ["| corpus | horizon | optimizer | centre LR (× law) | "
             + " | ".join(f"warm-up {label}" for label in labels)
             + " | LR × ½, 1, 2 at the chosen warm-up (and beyond) |",
             "|---|---|---|---|" + "---|" * len(labels) + "---|"]
    planner = results.planner
    for corpus in CORPORA:
        for horizon in results.horizons(corpus):
            steps = STEPS[horizon]
            for optimizer in results.optimizers(corpus):
                paper = planner.chosen.get((corpus, horizon, optimizer, "paper"))
                if paper is None:
                    continue
                centre = paper[0]
                cells = []
                for index in range(len(WARMUPS)):
                    loss = planner.loss(Key(corpus, steps, optimizer, centre,
                                            warmup_steps(steps, index), 0))
                    cells.append(fmt(loss))
                tuned = planner.chosen.get((corpus, horizon, optimizer, "tuned"))
                recheck = "–"
                if tuned is not None:
                    warmup = warmup_steps(steps, tuned[1])
                    found = sorted((k.multiplier, planner.loss(k)) for k in planner.known
                                   if (k.corpus, k.steps, k.optimizer, k.warmup, k.seed)
                                   == (corpus, steps, optimizer, warmup, 0))
                    recheck = ", ".join(f"{m / centre:g}: {loss:.4f}" for m, loss in found)
                lines.append(f"| {CORPORA[corpus]} | {horizon}× | {optimizer} | {centre:g} | "
                             + " | ".join(cells) + f" | {recheck} |")
    return lines


def seed0_table(results: Results) -> list[str]:
    """Every seed-0 run recorded so far: the LR sweeps and the warm-up sweeps as they grow."""
    lines = ["| corpus | horizon | optimizer | warm-up (steps) | final loss at LR × law (seed 0) |",
             "|---|---|---|---|---|"]
    groups: dict[tuple, list[tuple[float, float]]] = {}
    # A corpus's horizons are the ones the queue plans for it: AdamW's run at twice Shakespeare
    # 16x's steps is a budget run, not a Shakespeare 32x sweep.
    horizons = {(tag, STEPS[h]) for tag, chain, _ in GROUPS for h in chain}
    for key in results.planner.known:
        if key.seed == 0 and (key.corpus, key.steps) in horizons:
            groups.setdefault((key.corpus, key.steps, key.optimizer, key.warmup), []).append(
                (key.multiplier, results.planner.loss(key)))
    horizon_of = {steps: horizon for horizon, steps in STEPS.items()}
    for (corpus, steps, optimizer, warmup), points in sorted(
            groups.items(), key=lambda item: (list(CORPORA).index(item[0][0]), *item[0][1:])):
        cells = ", ".join(f"{m:g}: {loss:.4f}" for m, loss in sorted(points))
        lines.append(f"| {CORPORA[corpus]} | {horizon_of[steps]}× | {optimizer} | {warmup} | "
                     f"{cells} |")
    return lines


def multiplier_table(results: Results) -> tuple[list[str], list[dict]]:
    lines = ["| corpus | horizon | tokens/param | epochs | optimizer | recipe | final loss | "
             f"{BASELINE}'s loss (same recipe) | − {BASELINE}'s, paired by seed (t, p) | "
             "within the horizon | the paper's estimator |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for corpus in CORPORA:
        for recipe in RECIPES:
            inside = {h: within(results, corpus, h, recipe) for h in results.horizons(corpus)}
            paper = papers(results, corpus, recipe)
            for horizon in results.horizons(corpus):
                steps = STEPS[horizon]
                for optimizer in results.optimizers(corpus)[1:]:
                    mine = results.chosen_runs(corpus, horizon, optimizer, recipe)
                    if len(mine) < len(SEEDS):
                        continue
                    theirs = results.chosen_runs(corpus, horizon, BASELINE, recipe)
                    gap = paired_gap(mine, theirs)
                    cells = []
                    for estimator, value, outside in (
                            ("within-horizon", *_inside(inside[horizon].get(optimizer))),
                            ("paper", *paper.get((horizon, optimizer), (None, False)))):
                        if value is None:
                            cells.append("–")
                            continue
                        cells.append(pm(value, ".2f") + (" (extrapolated)" if outside else ""))
                        rows.append(summary_row(results, corpus, horizon, optimizer, recipe,
                                                estimator, value, mine[0].lr, outside, gap))
                    lines.append(f"| {CORPORA[corpus]} | {horizon}× | "
                                 f"{fmt(results.tokens_per_param(corpus, horizon), '.2f')} | "
                                 f"{fmt(results.epochs(corpus, steps), '.2f')} | {optimizer} | "
                                 f"{recipe} | {loss_of(mine)} | {loss_of(theirs)} | "
                                 f"{gap_cell(gap)} | {cells[0]} | {cells[1]} |")
    return lines, rows


def paired_gap(mine: list[records.Run], theirs: list[records.Run]
               ) -> tuple[seeds.MeanSE, float] | None:
    """An optimizer's final loss minus AdamW's, seed by seed (the same data order on both sides),
    with the two-sided p of the paired t-test (n − 1 degrees of freedom)."""
    by_seed = {r.seed: r.final_loss for r in theirs}
    return paired_gap_of([r.final_loss - by_seed[r.seed] for r in mine if r.seed in by_seed])


def paired_gap_of(differences: list[float]) -> tuple[seeds.MeanSE, float] | None:
    """The mean of per-seed differences, its standard error and the two-sided p."""
    if len(differences) < 2:
        return None
    gap = seeds.mean_se(differences)
    t = abs(gap.mean) / gap.se if gap.se > 0 else math.inf
    return gap, float(2 * stats.t.sf(t, gap.n - 1))


def gap_cell(gap: tuple[seeds.MeanSE, float] | None) -> str:
    if gap is None:
        return "–"
    difference, p = gap
    t = difference.mean / difference.se if difference.se > 0 else math.copysign(math.inf,
                                                                               difference.mean)
    return f"{difference.mean:+.4f} ± {difference.se:.4f} ({t:+.1f}, {p_value(p)})"


def p_value(p: float) -> str:
    """Two decimals where they carry the value; a small p keeps its first significant digit
    (0.003, not 0.00, which reads as certainty)."""
    if p < 0.001:
        return "< 0.001"
    return f"{p:.3f}" if p < 0.01 else f"{p:.2f}"


def _inside(found: budgets.BudgetMultiplier | None) -> tuple[seeds.MeanSE | None, bool]:
    return (None, False) if found is None else (found.multiplier, found.extrapolated)


def summary_row(results: Results, corpus: str, horizon: int, optimizer: str, recipe: str,
                estimator: str, value: seeds.MeanSE, lr: float, outside: bool,
                gap: tuple[seeds.MeanSE, float] | None) -> dict:
    pair = results.planner.chosen[(corpus, horizon, optimizer, recipe)]
    steps = STEPS[horizon]
    return {"heads": 2, "tokens_per_param": clean(results.tokens_per_param(corpus, horizon), 3),
            "optimizer": optimizer, "estimator": estimator,
            "multiplier": clean(value.mean, 4), "multiplier_se": clean(value.se, 3),
            "seeds": value.n, "best_lr": clean(lr, 4), "recipe": recipe,
            "corpus": CORPORA[corpus], "epochs": clean(results.epochs(corpus, steps), 3),
            "warmup_steps": warmup_steps(steps, pair[1]), "extrapolated": outside,
            "loss_minus_baseline": None if gap is None else clean(gap[0].mean, 4),
            "loss_minus_baseline_se": None if gap is None else clean(gap[0].se, 3),
            "paired_p": None if gap is None else clean(gap[1], 3)}


# ---- figures ----------------------------------------------------------------------------------

def multiplier_figure(rows: list[dict], corpus: str):
    from matplotlib.figure import Figure

    mine = [r for r in rows if r["corpus"] == corpus]
    if not mine:
        raise UserError(f"no multiplier on {corpus} yet")
    # the legend below takes a row per two lines (AdamW's, then one per optimizer and recipe):
    # the figure grows with it, so that the panels and their label keep their height
    lines = 1 + len({(r["optimizer"], r["recipe"]) for r in mine})
    figure = Figure(figsize=(10.0, 3.6 + 0.2 * math.ceil(lines / 2)), layout="constrained")
    axes = figure.subplots(1, 2, sharey=True)
    for ax, estimator in zip(axes, ("within-horizon", "paper")):
        ax.axhline(1.0, color=plots.colour(BASELINE), linewidth=1.2,
                   label=f"{plots.display_name(BASELINE)}, same recipe (1 by definition)")
        optimizers = sorted({r["optimizer"] for r in mine})
        for rank, optimizer in enumerate(optimizers):
            # each optimizer 4% from the next, so that equal multipliers do not hide each other
            dodge = 1 + 0.04 * (rank - (len(optimizers) - 1) / 2)
            for recipe, fill, linestyle, shift in (("paper", False, ":", 0.9 * dodge),
                                                   ("tuned", True, "-", 1.1 * dodge)):
                points = sorted((r for r in mine if r["optimizer"] == optimizer
                                 and r["recipe"] == recipe and r["estimator"] == estimator),
                                key=lambda r: r["tokens_per_param"])
                if not points:
                    continue
                colour = plots.colour(optimizer)
                ax.plot([r["tokens_per_param"] * shift for r in points],
                        [r["multiplier"] for r in points], color=colour, linestyle=linestyle,
                        linewidth=1.0, label=f"{plots.display_name(optimizer)}, "
                                             f"{RECIPE_NAMES[recipe]}")
                for r in points:
                    ax.errorbar(r["tokens_per_param"] * shift, r["multiplier"],
                                yerr=r["multiplier_se"] or 0.0, color=colour, capsize=3,
                                marker="^" if r["extrapolated"] else "o",
                                markerfacecolor=colour if fill else "white")
        ax.set_xscale("log")
        ticks = sorted({r["tokens_per_param"] for r in mine})
        ax.set_xticks(ticks)
        # the paper's recipe sits left of its horizon, the tuned one right (10%, and 4% apart
        # per optimizer): a margin keeps that visibly small
        ax.set_xlim(ticks[0] / 1.5, ticks[-1] * 1.5)
        ax.get_xaxis().set_major_formatter(_plain())
        ax.minorticks_off()
        ax.grid(True, which="both", alpha=0.2)
        ax.set_xlabel("tokens per parameter")
        ax.set_title("within the horizon (▲: extrapolated off AdamW's budget curve)"
                     if estimator == "within-horizon" else
                     "the paper's estimator (▲: extrapolated off AdamW's horizon curve)",
                     fontsize=9)
    axes[0].set_ylabel(f"compute multiplier vs {plots.display_name(BASELINE)}, same recipe")
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, fontsize=8, loc="outside lower center", ncols=2)
    figure.suptitle(f"Compute multiplier on {corpus} at 2 heads (1.25M parameters), mean ± s.e. "
                    "over 3 seeds:\nthe paper's recipe (open, dotted) and each tuned (filled, "
                    "solid)", fontsize=10)
    return figure


def warmup_figure(results: Results, corpus: str):
    """Seed-0 final loss against the warm-up at each optimizer's paper LR, one panel per
    horizon."""
    from matplotlib.figure import Figure

    planner = results.planner
    horizons = [h for h in results.horizons(corpus)
                if any((corpus, h, o, "tuned") in planner.chosen
                       for o in results.optimizers(corpus))]
    if not horizons:
        raise UserError(f"no tuned warm-up on {CORPORA[corpus]} yet")
    figure = Figure(figsize=(4.2 * len(horizons) + 2.5, 4.6), layout="constrained")
    axes = figure.subplots(1, len(horizons), squeeze=False)[0]
    for ax, horizon in zip(axes, horizons):
        steps = STEPS[horizon]
        for optimizer in results.optimizers(corpus):
            paper = planner.chosen.get((corpus, horizon, optimizer, "paper"))
            if paper is None:
                continue
            points = [(warmup_steps(steps, i) / steps, planner.loss(
                Key(corpus, steps, optimizer, paper[0], warmup_steps(steps, i), 0)))
                for i in range(len(WARMUPS))]
            points = [(max(x, 0.5 / steps), y) for x, y in points if y is not None]
            ax.plot(*zip(*points), marker="o", color=plots.colour(optimizer),
                    linestyle=plots.linestyle(optimizer),
                    label=f"{plots.display_name(optimizer)}, LR {paper[0]:g} × law")
        ax.set_xscale("log")
        # one tick per warm-up of the ladder, named as the tables name it (T/50, T/5 ...)
        ax.set_xticks([max(warmup_steps(steps, i) / steps, 0.5 / steps)
                       for i in range(len(WARMUPS))], [warmup_label(i) for i in range(len(WARMUPS))])
        ax.minorticks_off()
        ax.set_xlabel("warm-up (0 drawn at ½ step)")
        ax.set_title(f"{horizon}× ({steps} steps), seed 0", fontsize=9)
        ax.grid(True, which="both", alpha=0.2)
        # one legend per panel, below it (inside, it hid points): the paper's best LR differs
        # between horizons
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)
    axes[0].set_ylabel("final validation loss")
    figure.suptitle(f"The warm-up sweep on {CORPORA[corpus]}, at each optimizer's best LR\nunder "
                    "the paper's recipe", fontsize=10)
    return figure


def _plain():
    from matplotlib.ticker import FormatStrFormatter

    return FormatStrFormatter("%g")


# ---- the report -------------------------------------------------------------------------------

def report() -> None:
    results = Results()
    OUT.mkdir(parents=True, exist_ok=True)
    text = ["# Study III: results", "",
            "Written by `python studies/fair/report.py` from the committed records; see "
            "[the study's page](../study-fair.md) for what it means.", "",
            "## Each recipe's choice", "",
            "Best LR and warm-up per recipe, final validation loss (whole validation set) as "
            "mean ± standard error over seeds (count in brackets). The last column is the "
            "tuned recipe's loss minus the paper's, paired by seed.", "",
            *recipe_table(results), "",
            "## The sweeps behind the tuned choice (seed 0)", "",
            "Final loss at each warm-up, at the paper recipe's best LR (the centre); then, at "
            "the chosen warm-up, the loss at each LR (as a multiple of the centre).", "",
            *sweep_table(results), ""]
    lines, rows = multiplier_table(results)
    text += ["## Compute multipliers against AdamW under the same recipe", "",
             "Mean ± standard error over 3 seeds, each read off AdamW's curve of the same seed "
             "and recipe. The loss gap is paired by seed (the same data order on both sides), "
             "with its t-statistic and the two-sided p of the paired t-test (2 degrees of "
             "freedom with 3 seeds).", "", *lines, "",
             "## Every seed-0 run so far", "",
             "The LR and warm-up sweeps as recorded, at each horizon's steps (AdamW's shorter "
             "and longer budgets are in the records).", "", *seed0_table(results), ""]
    figure = figure_writer(OUT, text)
    for tag, corpus in CORPORA.items():
        figure(f"multiplier_{corpus}", lambda corpus=corpus: multiplier_figure(rows, corpus))
        figure(f"warmup_{corpus}", lambda tag=tag: warmup_figure(results, tag))
    (OUT / "results.md").write_text("\n".join(text))
    SUMMARY.write_text(json.dumps(rows, indent=1) + "\n")
    print("wrote", (OUT / "results.md").relative_to(ROOT), SUMMARY.relative_to(ROOT))


if __name__ == "__main__":
    report()
