"""The LR-port study's table, figure and summary.json, rebuilt from records alone.

    python studies/lr-port/report.py    # docs/lr-port/*, studies/lr-port/summary.json

Reads the language-model studies' committed records (`LM_SETTINGS`) and this study's own
(`records/*.json`, written by `study.py run`). For every setting where AdamW and a DANA
optimizer were both tuned, the ratio of their best peak LRs; pooled over the settings, the one
ratio to start from (the median of every DANA optimizer's ratio, to one significant figure: the
ratio that is the fewest factors of 2 from the measured ones) and how far the measured ratios spread
around it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/common.py, which puts src/ on the path too
sys.path.insert(0, str(HERE))

from common import ROOT, figure_writer, final_loss, fmt, pm  # noqa: E402
from study import BASELINE, OPTIMIZERS, RECORDS, SEEDS, TASKS  # noqa: E402

from danastar.analysis import plots, seeds  # noqa: E402

OUT = ROOT / "docs" / "lr-port"
SUMMARY = HERE / "summary.json"
DANA = tuple(name for name in (*OPTIMIZERS, "dana-star") if name != BASELINE)
OTHERS = ("adamw-decaying-wd",)  # tuned in the first study too: in the table, not in the pool


@dataclasses.dataclass(frozen=True)
class LMSetting:
    """One size, horizon or model of a language-model study: the sweeps (folders under its
    records/, shell patterns) where each optimizer's LR was swept at one budget."""

    study: str
    label: str
    sweeps: tuple[str, ...]


LM_SETTINGS = (
    LMSetting("cpu-shakespeare", "Enoki 2 heads, 128 steps", ("study-lr-h2", "study-widen-h2-*")),
    LMSetting("cpu-shakespeare", "Enoki 3 heads, 254 steps", ("study-lr-h3", "study-widen-h3-*")),
    LMSetting("cpu-shakespeare", "Enoki 4 heads, 460 steps", ("study-lr-h4", "study-widen-h4-*")),
    LMSetting("horizon", "Enoki 2 heads, 512 steps", ("x4-*-lr", "x4-*-widen*")),
    LMSetting("horizon", "Enoki 2 heads, 2048 steps", ("x16-*-lr", "x16-*-widen*")),
    LMSetting("moe-tau", "Enoki dense, 600 steps", ("tau-lr-dense", "tau-widen-dense-*")),
    LMSetting("moe-tau", "Enoki MoE, 600 steps", ("tau-lr-moe", "tau-widen-moe-*")),
)


@dataclasses.dataclass
class Sweep:
    """One optimizer's LR sweep in one setting: LR -> loss (the mean over seeds for the small
    tasks, seed 0's for the language models) and, for the small tasks, the seeds' losses."""

    source: str  # "language model" or "small task"
    setting: str
    optimizer: str
    losses: dict[float, float]
    per_seed: dict[float, list[float]] = dataclasses.field(default_factory=dict)
    unit: str = "final val loss, seed 0"

    @property
    def best(self) -> float:
        return min(self.losses, key=self.losses.get)

    @property
    def at_edge(self) -> bool:
        return self.best in (min(self.losses), max(self.losses))

    def vertex(self) -> float:
        """The best LR refined by a parabola in log LR through the best and its two neighbours
        (kept between them); the grid's best where it sits at an edge."""
        lrs = sorted(self.losses)
        i = lrs.index(self.best)
        if self.at_edge or not all(math.isfinite(self.losses[lr]) for lr in lrs[i - 1:i + 2]):
            return self.best
        (x0, x1, x2), (y0, y1, y2) = ([math.log2(lr) for lr in lrs[i - 1:i + 2]],
                                      [self.losses[lr] for lr in lrs[i - 1:i + 2]])
        curvature = (y2 - y1) / (x2 - x1) - (y1 - y0) / (x1 - x0)
        if curvature <= 0:
            return self.best
        slope_left, slope_right = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
        # vertex of the parabola through the three points (equal spacing not assumed)
        x = (x0 + x1) / 2 - slope_left * (x2 - x0) / (2 * (slope_right - slope_left))
        return 2 ** min(max(x, x0), x2)

    def loss_at(self, lr: float) -> float | None:
        """The loss at `lr`, linear in log LR between the two swept LRs around it; None outside
        the sweep."""
        lrs = sorted(self.losses)
        if not lrs[0] <= lr <= lrs[-1]:
            return None
        for low, high in zip(lrs, lrs[1:]):
            if low <= lr <= high:
                t = (math.log(lr) - math.log(low)) / (math.log(high) - math.log(low))
                return self.losses[low] + t * (self.losses[high] - self.losses[low])
        return self.losses[lr]


# ---- reading ------------------------------------------------------------------------------------

def lm_sweeps(setting: LMSetting) -> list[Sweep]:
    """Each optimizer's seed-0 final losses at the setting's budget, from the study's records."""
    folder = ROOT / "studies" / setting.study / "records"
    found: dict[str, dict[float, float]] = {}
    for pattern in setting.sweeps:
        for run in sorted(folder.glob(f"{pattern}/*")):
            status = json.loads((run / "status.json").read_text())
            plan = json.loads((run / "plan.json").read_text())["plan"]
            if status.get("state") != "complete" or plan["seed"] != 0:
                continue
            found.setdefault(plan["opt"], {})[plan["lr"]] = final_loss(run)
    return [Sweep("language model", setting.label, optimizer, losses)
            for optimizer, losses in found.items()]


def task_sweeps() -> list[Sweep]:
    sweeps = []
    for path in sorted(RECORDS.glob("*.json")):
        record = json.loads(path.read_text())
        per_seed: dict[float, list[float]] = {}
        for run in record["runs"]:
            loss = run["heldout_loss"]
            per_seed.setdefault(run["lr"], []).append(math.inf if loss is None else loss)
        per_seed = {lr: losses for lr, losses in per_seed.items() if len(losses) == len(SEEDS)}
        if per_seed:
            sweeps.append(Sweep("small task", record["task"], record["optimizer"],
                                {lr: sum(v) / len(v) for lr, v in per_seed.items()}, per_seed,
                                unit=f"{TASKS[record['task']].loss_name}, mean of "
                                     f"{len(SEEDS)} seeds"))
    return sweeps


@dataclasses.dataclass(frozen=True)
class Ratio:
    sweep: Sweep
    baseline: Sweep

    @property
    def grid(self) -> float:
        return self.sweep.best / self.baseline.best

    @property
    def refined(self) -> float:
        return self.sweep.vertex() / self.baseline.vertex()

    @property
    def pooled(self) -> bool:
        return self.sweep.optimizer in DANA and not (self.sweep.at_edge or self.baseline.at_edge)


def ratios(sweeps: list[Sweep]) -> list[Ratio]:
    baselines = {s.setting: s for s in sweeps if s.optimizer == BASELINE}
    return [Ratio(s, baselines[s.setting]) for s in sweeps
            if s.optimizer != BASELINE and s.setting in baselines]


# ---- the recommendation -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Pool:
    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return 2 ** statistics.median(math.log2(v) for v in self.values)

    @property
    def start(self) -> float:
        """The ratio to recommend: the median, to one significant figure."""
        return float(f"{self.median:.1g}")

    @property
    def geometric_sd(self) -> float:
        return 2 ** statistics.stdev(math.log2(v) for v in self.values)

    def quantile(self, q: float) -> float:
        logs = sorted(math.log2(v) for v in self.values)
        position = q * (len(logs) - 1)
        low = math.floor(position)
        high = min(low + 1, len(logs) - 1)
        return 2 ** (logs[low] + (position - low) * (logs[high] - logs[low]))

    def within(self, ratio: float, factor: float) -> int:
        return sum(1 for v in self.values if abs(math.log2(v / ratio)) <= math.log2(factor)
                   + 1e-9)


def pool_of(chosen: list[Ratio]) -> Pool:
    return Pool(tuple(r.grid for r in chosen))


# ---- the report ---------------------------------------------------------------------------------

def ratio_table(found: list[Ratio], start: float) -> list[str]:
    lines = [f"| source | setting | optimizer | LRs swept | best LR | AdamW's best LR | ratio | "
             f"ratio, refined | LR ÷ best at {start:g}× | loss at {start:g}× − best | "
             "best loss |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in found:
        s = r.sweep
        at_start = s.loss_at(start * r.baseline.best)
        off = math.log2(start * r.baseline.best / s.best)
        edge = " (edge)" if s.at_edge else ""
        best_loss = (pm(seeds.mean_se(s.per_seed[s.best])) if s.per_seed
                     else fmt(s.losses[s.best]))
        lines.append(
            f"| {s.source} | {s.setting} | {s.optimizer} | {len(s.losses)} "
            f"({short(min(s.losses))}–{short(max(s.losses))}) | {short(s.best)}{edge} | "
            f"{short(r.baseline.best)} | {r.grid:.2f} | {r.refined:.2f} | "
            f"{2 ** off:.2g}× | {fmt(None if at_start is None else at_start - s.losses[s.best])} | "
            f"{best_loss} |")
    return lines


def short(lr: float) -> str:
    return f"{lr:.3g}"


def pool_lines(name: str, pool: Pool) -> str:
    n = len(pool.values)
    return (f"| {name} | {n} | {pool.median:.2f} | {pool.quantile(0.25):.2f}–"
            f"{pool.quantile(0.75):.2f} | {min(pool.values):.2f}–{max(pool.values):.2f} | "
            f"×/÷ {pool.geometric_sd:.2f} | {pool.within(pool.start, 2)}/{n} | "
            f"{pool.within(pool.start, 4)}/{n} |")


def ratio_figure(found: list[Ratio], start: float):
    figure, (left, right) = plots.style.new_figure(6.0, 5.0, ncols=2)
    settings = list(dict.fromkeys(r.sweep.setting for r in found))
    offsets = {name: (i - (len(DANA) - 2) / 2) * 0.12 for i, name in enumerate(DANA)}
    for optimizer in (*DANA, *OTHERS):
        mine = [r for r in found if r.sweep.optimizer == optimizer]
        if not mine:
            continue
        xs = [settings.index(r.sweep.setting) + offsets.get(optimizer, 0.3) for r in mine]
        left.scatter(xs, [r.grid for r in mine], color=plots.colour(optimizer),
                     marker="o" if optimizer in DANA else "x", s=28, zorder=3,
                     label=plots.display_name(optimizer))
    left.axhline(start, color="black", linewidth=1.0, label=f"start: {start:g} × AdamW's LR")
    left.axhspan(start / 2, start * 2, color="black", alpha=0.08, label="start ×/÷ 2")
    left.axhline(1.0, color=plots.colour(BASELINE), linewidth=0.8, linestyle=":",
                 label="AdamW (1 ×)")
    left.set_yscale("log", base=2)
    left.set_xticks(range(len(settings)), settings, rotation=60, ha="right", fontsize=7)
    small = sum(1 for s in settings if s in TASKS)
    if small and small < len(settings):
        left.axvline(len(settings) - small - 0.5, color="grey", linewidth=0.6)
    left.set_ylabel("best LR ÷ AdamW's best LR (same setting)")
    left.set_title("Ratio of best LRs: language-model studies | small tasks", fontsize=9)
    left.grid(True, axis="y", alpha=0.2)
    figure.legend(*left.get_legend_handles_labels(), fontsize=7, loc="outside lower center",
                  ncols=7)
    for r in found:
        if r.sweep.optimizer not in DANA:
            continue
        s = r.sweep
        points = sorted(s.losses)
        xs = [lr / r.baseline.best for lr in points]
        ys = [100 * (s.losses[lr] / s.losses[s.best] - 1) for lr in points]
        right.plot(xs, ys, color=plots.colour(s.optimizer), linewidth=0.8, alpha=0.6,
                   linestyle="-" if s.source == "small task" else "--", marker=".",
                   markersize=3)
    right.axvline(start, color="black", linewidth=1.0)
    right.axvspan(start / 2, start * 2, color="black", alpha=0.08)
    right.set_xscale("log", base=2)
    right.set_yscale("symlog", linthresh=1.0)
    right.set_ylim(bottom=0)
    right.set_xlabel("peak LR ÷ AdamW's best LR (same setting)")
    right.set_ylabel("loss above the optimizer's best (%)")
    right.set_title("Each DANA sweep (dashed: language models; solid: small tasks)",
                    fontsize=9)
    right.grid(True, which="both", alpha=0.2)
    return figure


def report() -> None:
    lm = [s for setting in LM_SETTINGS for s in lm_sweeps(setting)]
    tasks = task_sweeps()
    found = ratios(lm) + ratios(tasks)
    chosen = [r for r in found if r.pooled]
    OUT.mkdir(parents=True, exist_ok=True)
    text = ["# The LR to port from AdamW: results", "",
            "Generated by `python studies/lr-port/study.py report` from the committed records "
            "of `studies/cpu-shakespeare`, `studies/horizon` and `studies/moe-tau` and from "
            "`studies/lr-port/records/`; do not edit. What the study does: "
            "[`studies/lr-port/study.py`](../../studies/lr-port/study.py).", ""]
    figure = figure_writer(OUT, text)
    if not chosen:
        text += ["No setting has both AdamW and a DANA optimizer tuned yet.", ""]
        (OUT / "results.md").write_text("\n".join(text))
        return
    pool = pool_of(chosen)
    start = pool.start
    pools = {"every DANA optimizer, every setting": pool}
    for optimizer in DANA:
        mine = [r for r in chosen if r.sweep.optimizer == optimizer]
        if mine:
            pools[optimizer] = pool_of(mine)
    for source in ("language model", "small task"):
        mine = [r for r in chosen if r.sweep.source == source]
        if mine:
            pools[f"{source}s"] = pool_of(mine)
    text += ["## The ratio to start from", "",
             f"**{start:g} × AdamW's best LR**: the median of the {len(pool.values)} measured "
             f"ratios ({pool.median:.2f}), to one significant figure. Half of them lie within "
             f"{pool.quantile(0.25):.2f}–{pool.quantile(0.75):.2f}, all within "
             f"{min(pool.values):.2f}–{max(pool.values):.2f}; {pool.within(start, 2)} of "
             f"{len(pool.values)} within a factor of 2 of {start:g}, "
             f"{pool.within(start, 4)} within a factor of 4.", "",
             "| pool | ratios | median | middle half | range | geometric s.d. | "
             f"within ×/÷ 2 of {start:g} | within ×/÷ 4 |",
             "|---|---|---|---|---|---|---|---|"]
    text += [pool_lines(name, p) for name, p in pools.items()] + [""]
    text += ["## Every setting", "",
             "Best LR: the lowest loss on the grid (the language models: seed 0's final "
             "validation loss, the rule of the studies' own reports; the small tasks: the mean "
             f"held-out loss over {len(SEEDS)} seeds). *Refined*: each best moved to the vertex "
             "of a parabola in log LR through it and its two neighbours. The last columns: "
             f"where {start:g} × AdamW's best LR falls relative to the optimizer's best, and "
             "the loss there above the best (linear in log LR between swept LRs; – outside the "
             "sweep). AdamW with decaying weight decay (first study only) is listed, not "
             "pooled.", ""]
    text += ratio_table(found, start) + [""]
    figure("ratios", lambda: ratio_figure(found, start))
    text += ["![the ratios](ratios.png)", ""]
    (OUT / "results.md").write_text("\n".join(text))
    summary = {
        "start_ratio": start, "median_ratio": round(pool.median, 4),
        "pools": {name: {"ratios": len(p.values), "median": round(p.median, 4),
                         "q25": round(p.quantile(0.25), 4), "q75": round(p.quantile(0.75), 4),
                         "min": round(min(p.values), 4), "max": round(max(p.values), 4),
                         "geometric_sd": round(p.geometric_sd, 4),
                         "within_2x_of_start": p.within(start, 2),
                         "within_4x_of_start": p.within(start, 4)}
                  for name, p in pools.items()},
        "settings": [{"source": r.sweep.source, "setting": r.sweep.setting,
                      "optimizer": r.sweep.optimizer, "best_lr": round(r.sweep.best, 8),
                      "adamw_best_lr": round(r.baseline.best, 8), "ratio": round(r.grid, 4),
                      "ratio_refined": round(r.refined, 4), "at_edge": r.sweep.at_edge,
                      "pooled": r.pooled} for r in found],
    }
    SUMMARY.write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    print("wrote", (OUT / "results.md").relative_to(ROOT), "and", SUMMARY.relative_to(ROOT))


if __name__ == "__main__":
    report()
