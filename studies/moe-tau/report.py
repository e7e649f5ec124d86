"""The τ study's tables and figures, rebuilt from the committed records alone (no training).

    python studies/moe-tau/report.py        # writes docs/moe-tau/*.png|pdf and results.md

Tables (results.md): the LR sweeps, the final losses at the best LRs over three seeds (the sparse
mixture and its dense counterpart), and per optimizer how the experts' τ and weight norms follow
ρ_e, the share of steps in which each expert was routed. Figures: the LR sweeps, τ and weight norm
per expert against ρ_e, Dana-Star-MK4's τ distributions with the experts panel, the validation
curves of the sparse mixture (seed 0).
"""

from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RECORDS = HERE / "records"
OUT = ROOT / "docs" / "moe-tau"
OPTIMIZERS = ("adamw", "dana-mk4", "dana-star-mk4")
MODELS = {"moe": "sparse mixture (64 experts, 2 per token)",
          "dense": "dense counterpart (2 experts, both used)"}
SEEDS = (0, 1, 2)
RARE, OFTEN = 0.05, 0.5  # ρ_e below: rarely routed; above: routed in most steps

sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing

from danastar.analysis import experts, plots, records, seeds, tau  # noqa: E402


def sweep_point(run: records.Run) -> dict:
    return json.loads((run.path / "sweep_point.json").read_text())


@functools.cache
def recorded_runs() -> tuple[records.Run, ...]:
    """Every recorded run, read once (the tables and figures each select from them)."""
    return tuple(records.find_runs([RECORDS]))


def runs_of(prefix: str) -> list[records.Run]:
    return [run for run in recorded_runs()
            if run.path.parent.name.startswith(prefix) and run.complete]


def sweep_runs(model: str) -> list[records.Run]:
    return [run for run in runs_of(f"tau-lr-{model}") + runs_of(f"tau-widen-{model}")
            if run.seed == 0]


def final_runs(model: str, optimizer: str) -> list[records.Run]:
    """The best LR's runs, seeds 0-2 (the dense model's seed 0 is its sweep run)."""
    finals = runs_of(f"tau-final-{model}-{optimizer}")
    if model == "dense" and finals:
        multiplier = sweep_point(finals[0])["lr_multiplier"]
        finals += [run for run in sweep_runs(model) if run.optimizer == optimizer
                   and sweep_point(run)["lr_multiplier"] == multiplier]
    return sorted(finals, key=lambda run: run.seed)


def fmt_mean(values: list[float]) -> str:
    summary = seeds.mean_se(values)
    return (f"{summary.mean:.4f} ± {summary.se:.4f}" if len(values) > 1
            else f"{summary.mean:.4f}")


def sweep_table(model: str) -> list[str]:
    runs = sweep_runs(model)
    multipliers = sorted({sweep_point(run)["lr_multiplier"] for run in runs})
    lines = [f"| optimizer | {' | '.join(f'{m:g}×' for m in multipliers)} |",
             "|---|" + "---:|" * len(multipliers)]
    for optimizer in OPTIMIZERS:
        losses = {sweep_point(run)["lr_multiplier"]: run.final_loss for run in runs
                  if run.optimizer == optimizer}
        if not losses:
            continue
        best = min(losses, key=losses.get)
        cells = [("**{:.4f}**" if m == best else "{:.4f}").format(losses[m]) if m in losses
                 else "–" for m in multipliers]
        lines.append(f"| {plots.display_name(optimizer)} | {' | '.join(cells)} |")
    return lines


def finals_table() -> list[str]:
    lines = ["| optimizer | model | LR (× law) | final loss, seeds 0 / 1 / 2 | mean ± s.e. | "
             "− AdamW (paired) |", "|---|---|---:|---|---:|---:|"]
    for model in MODELS:
        baseline = {run.seed: run.final_loss for run in final_runs(model, "adamw")}
        for optimizer in OPTIMIZERS:
            runs = final_runs(model, optimizer)
            if not runs:
                continue
            losses = {run.seed: run.final_loss for run in runs}
            paired = [s for s in SEEDS if s in losses and s in baseline]
            difference = "–"
            if optimizer != "adamw" and len(paired) > 1:
                d = seeds.difference([losses[s] for s in paired], [baseline[s] for s in paired])
                difference = f"{d.difference:+.4f} (t = {d.t:.1f})"
            lines.append(
                f"| {plots.display_name(optimizer)} | {model} | "
                f"{sweep_point(runs[0])['lr_multiplier']:g} ({runs[0].lr:.3g}) | "
                f"{' / '.join(f'{losses[s]:.4f}' if s in losses else '–' for s in SEEDS)} | "
                f"{fmt_mean(list(losses.values()))} | {difference} |")
    return lines


def expert_rows() -> tuple[list[str], dict]:
    """Per optimizer, pooled over the seeds of the sparse mixture's final runs."""
    lines = ["| optimizer | experts × seeds | ρ_e median | share with ρ_e < 5% | "
             "Spearman(τ_e, ρ_e) | weight norm / initial, ρ_e < 5% | ρ_e > 50% |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    numbers = {}
    for optimizer in OPTIMIZERS:
        rho, tau_mean, growth = [], [], []
        for run in final_runs("moe", optimizer):
            last, first = experts.snapshot(run.path), experts.snapshot(run.path, 0)
            rho.append(last.pooled("routed_share")[1])
            growth.append(last.pooled("weight_norm")[1] / first.pooled("weight_norm")[1])
            if last.has_tau:
                tau_mean.append(last.pooled("tau_mean")[1])
        if not rho:
            continue
        rho, growth = np.concatenate(rho), np.concatenate(growth)
        rare, often = rho < RARE, rho > OFTEN
        correlation = (stats.spearmanr(np.concatenate(tau_mean), rho).statistic
                       if tau_mean else math.nan)
        numbers[optimizer] = {"rho_median": float(np.median(rho)),
                              "rare_share": float(rare.mean()), "spearman": float(correlation),
                              "growth_rare": float(growth[rare].mean()) if rare.any() else None,
                              "growth_often": float(growth[often].mean()) if often.any() else None}
        n = numbers[optimizer]
        cells = [plots.display_name(optimizer), str(rho.size), f"{n['rho_median']:.3f}",
                 f"{100 * n['rare_share']:.0f}%", number(correlation),
                 number(n["growth_rare"]), number(n["growth_often"])]
        lines.append(f"| {' | '.join(cells)} |")
    return lines, numbers


def number(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.3f}"


def figures() -> list[Path]:
    written = []
    sweeps = sweep_runs("moe") + sweep_runs("dense")
    written += plots.save(plots.lr_sweeps(sweeps), OUT / "lr_sweep")
    seed0 = [run for optimizer in OPTIMIZERS for run in final_runs("moe", optimizer)
             if run.seed == 0]
    written += plots.save(plots.experts([experts.snapshot(run.path) for run in seed0]),
                          OUT / "experts")
    star = [run for run in seed0 if run.optimizer == "dana-star-mk4"]
    if star:
        written += plots.save(plots.tau(tau.read_collections(star[0].path),
                                        title="Dana-Star-MK4, sparse mixture, seed 0"),
                              OUT / "tau")
    written += plots.save(plots.curves(seed0, x="steps"), OUT / "curves")
    return written


def report() -> None:
    recorded_runs.cache_clear()  # the records as they are now
    OUT.mkdir(parents=True, exist_ok=True)
    written = figures()
    expert_lines, _ = expert_rows()
    every = runs_of("tau-")
    seconds = [run.wall_seconds for run in every if run.wall_seconds is not None]
    text = ["# The τ study: results", "",
            "Rebuilt by `python studies/moe-tau/report.py` from `studies/moe-tau/records/`.", ""]
    for model, label in MODELS.items():
        text += [f"## LR sweep, {label}: final validation loss (seed 0; best in bold)", "",
                 *sweep_table(model), ""]
    text += ["## At the best LRs, three seeds", "", *finals_table(), "",
             "## Experts of the sparse mixture against their routing share ρ_e (final runs, "
             "all seeds pooled)", "", *expert_lines, "",
             f"Runs: {len(every)}, {sum(seconds) / 3600:.2f} run-hours of wall time (two "
             "one-thread runs at a time on a 2-core CPU).", ""]
    (OUT / "results.md").write_text("\n".join(text))
    for path in [*written, OUT / "results.md"]:
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    report()
