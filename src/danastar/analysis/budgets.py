"""Compute multipliers within one model size, from runs at several step budgets.

A study at one size sweeps LRs at one budget (the *sweep budget*), then trains each optimizer at
its best LR at shorter (and the baseline also at longer) budgets and with more seeds. The
baseline's final losses at its budgets are a loss-against-compute curve at that size; an
optimizer's final loss read off it gives the compute the baseline needs for that loss:

    multiplier = C*_baseline(L_opt) / C_opt          (``multiplier.baseline_compute_at``)

Runs are paired by seed (the same initialisation and data order) where the baseline has that
seed at two or more budgets, else read off the baseline's seed-mean curve; the multipliers of
the seeds give a mean and standard error. "Steps to the baseline's loss" is the other reading of
the same comparison: the fraction of its steps an optimizer's run took to reach the loss of the
baseline's run with the same seed and budget (None where it never did). Both sides are read on
the same evaluation, the periodic one (`eval_batches` fixed batches): the baseline's loss at its
last periodic evaluation, step s, and the optimizer's periodic curve, giving its crossing / s.
The final evaluation (often the whole validation set) reads differently from the periodic
batches, so it is on neither side.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from danastar.analysis import multiplier, records, seeds
from danastar.analysis.records import Run, complete_runs
from danastar.errors import UserError


def sweep_budget(runs: Sequence[Run]) -> int:
    """The budget (iterations) at which the most distinct LRs were run; ties: the longest."""
    lrs: dict[int, set[float]] = {}
    for run in runs:
        lrs.setdefault(run.iterations, set()).add(records.lr_key(run.lr))
    return max(lrs, key=lambda steps: (len(lrs[steps]), steps))


def lr_sweep_runs(runs: Sequence[Run]) -> list[Run]:
    """Per (optimizer, dataset, size), only the runs at its sweep budget: the ones an LR is
    chosen from. Runs at other budgets (the best LR trained shorter or longer) are left out."""
    by_key: dict[tuple, list[Run]] = {}
    for run in runs:
        by_key.setdefault((run.group, run.data, run.size), []).append(run)
    kept = []
    for group_runs in by_key.values():
        budget = sweep_budget(group_runs)
        kept.extend(r for r in group_runs if r.iterations == budget)
    return [r for r in runs if r in kept]


def other_budget_runs(runs: Sequence[Run]) -> list[Run]:
    """The complete runs that `lr_sweep_runs` leaves out: those at another budget than their
    (optimizer, dataset, size)'s sweep budget."""
    complete = [r for r in runs if r.complete]
    kept = lr_sweep_runs(complete)
    return [r for r in complete if r not in kept]


def untuned(lrs: Sequence[float], best: float) -> str | None:
    """Why an LR chosen as the best of ``lrs`` may not be the optimizer's best: a single LR
    (nothing was compared), or the best at the edge of the grid (a better one may lie beyond
    it); None when the best has a swept LR on each side."""
    grid = sorted({records.lr_key(lr) for lr in lrs})
    best = records.lr_key(best)
    if len(grid) == 1:
        return "only one LR"
    if best in (grid[0], grid[-1]):
        return f"best LR the {'lowest' if best == grid[0] else 'highest'} of {len(grid)}"
    return None


UNTUNED_NOTE = ("† untuned: an optimizer in this comparison has only one LR at that size, or its "
                "best LR at the edge of its LRs, so the number may reflect the LR, not the "
                "optimizer; sweep LRs on both sides of the best.")


def sweep_untuned(runs: Sequence[Run]) -> str | None:
    """`untuned` of one (optimizer, size)'s complete runs: its LRs at the sweep budget."""
    at_budget = [r for r in runs if r.iterations == sweep_budget(runs)]
    best = records.lr_key(best_lr_runs(runs)[0].lr)
    return untuned([r.lr for r in at_budget], best)


def best_lr_runs(runs: Sequence[Run]) -> list[Run]:
    """The complete runs of one (optimizer, size) at its best LR (`seeds.best_lr` of the final
    losses at the sweep budget), at every budget and seed."""
    at_budget = [r for r in runs if r.iterations == sweep_budget(runs)]
    losses: dict[float, dict[int, float]] = {}
    for run in at_budget:
        losses.setdefault(records.lr_key(run.lr), {})[run.seed] = run.final_loss
    best = seeds.best_lr(losses)
    return [r for r in runs if records.lr_key(r.lr) == best]


@dataclasses.dataclass(frozen=True)
class BudgetMultiplier:
    """One optimizer at one size and budget against the baseline at that size."""

    optimizer: str  # group label
    arch: str
    heads: int
    iterations: int
    lr: float
    total_params: int
    seeds: tuple[int, ...]
    losses: seeds.MeanSE
    multiplier: seeds.MeanSE  # over the seeds' multipliers
    kinds: tuple[str, ...]  # per seed: interpolated or extrapolated (below/above)
    paired: bool  # every seed read off the baseline curve of its own seed
    steps_fraction: seeds.MeanSE | None  # steps to the baseline's loss / budget; None: never
    untuned: str | None = None  # why its LR or the baseline's may not be tuned (`untuned`)

    @property
    def extrapolated(self) -> bool:
        return any(kind != multiplier.INTERPOLATED for kind in self.kinds)

    def row(self) -> dict:
        se = self.multiplier.se
        steps = self.steps_fraction
        return {"optimizer": self.optimizer, "arch": self.arch, "heads": self.heads,
                "steps": self.iterations, "lr": self.lr, "seeds": len(self.seeds),
                "final_loss": self.losses.mean,
                "final_loss_se": None if math.isnan(self.losses.se) else self.losses.se,
                "multiplier": self.multiplier.mean,
                "multiplier_se": None if math.isnan(se) else se,
                "multiplier_kind": ("extrapolated" if self.extrapolated
                                    else multiplier.INTERPOLATED),
                "steps_to_baseline": None if steps is None else steps.mean,
                "steps_to_baseline_se": None if steps is None or math.isnan(steps.se)
                else steps.se, "untuned": self.untuned}


def periodic_curve(run: Run) -> tuple[list[float], list[float]]:
    """Steps and validation losses of a run's periodic evaluations (not the final one)."""
    points = sorted((int(r["step"]), float(r["val_loss"])) for r in run.metrics
                    if "val_loss" in r and not r.get("final"))
    return [float(step) for step, _ in points], [loss for _, loss in points]


def last_periodic(run: Run) -> tuple[float, float] | None:
    """(step, loss) of a run's last periodic evaluation; None without one after step 0."""
    steps, losses = periodic_curve(run)
    return (steps[-1], losses[-1]) if steps and steps[-1] > 0 else None


def steps_to(run: Run, target: tuple[float, float] | None) -> float | None:
    """The share of the baseline's steps, up to its last periodic evaluation `target` (step,
    loss), that `run` took to reach that loss on the same evaluation; None where the baseline
    has no such evaluation or the run never reached it."""
    if target is None:
        return None
    steps, losses = periodic_curve(run)
    cross = multiplier.first_crossing(steps, losses, target[1])
    return None if cross is None else cross / target[0]


def _baseline_curves(runs: Sequence[Run]) -> tuple[dict[int, list[tuple[float, float]]],
                                                    list[tuple[float, float]]]:
    """Per seed the (PFH, final loss) points of the baseline's budgets, and the seed-mean curve."""
    per_seed: dict[int, list[tuple[float, float]]] = {}
    per_budget: dict[int, list[Run]] = {}
    for run in runs:
        per_seed.setdefault(run.seed, []).append((run.pfh, run.final_loss))
        per_budget.setdefault(run.iterations, []).append(run)
    mean = [(rs[0].pfh, sum(r.final_loss for r in rs) / len(rs)) for rs in per_budget.values()]
    return {s: sorted(p) for s, p in per_seed.items()}, sorted(mean)


def _check_curve(points: Sequence[tuple[float, float]], baseline: str, size: str) -> None:
    if len(points) < 2:
        raise UserError(f"a compute multiplier within one size needs {baseline} at its best LR "
                        f"at two or more budgets ({size} has {len(points)}); train it at "
                        "shorter or longer --iterations too.")
    if any(b[1] >= a[1] for a, b in zip(points, points[1:])):
        losses = ", ".join(f"{loss:.4g}" for _, loss in points)
        raise UserError(f"{baseline}'s final losses at {size} do not decrease with its budget "
                        f"({losses}, shortest first), so no compute multiplier can be read from "
                        "them; train longer budgets.")


def within_size_multipliers(runs: Sequence[Run], baseline: str = "adamw"
                            ) -> list[BudgetMultiplier]:
    """Every other optimizer's best-LR runs, per size and budget, against the baseline's
    budget curve at that size (see the module docstring). Sizes without baseline runs are
    skipped; UserError when no size has a usable baseline curve, when the runs are on more
    than one dataset, or when two runs of one budget and LR have the same seed."""
    complete = complete_runs(runs, "a compute multiplier")
    records.one_dataset(complete, "a compute multiplier within one size")
    records.check_distinct_seeds(complete)
    by_key: dict[tuple[str, tuple[str, int]], list[Run]] = {}
    for run in complete:
        by_key.setdefault((run.group, run.size), []).append(run)
    baseline = records.match_optimizer({g for g, _ in by_key}, baseline)
    base_groups = [g for g, _ in by_key if g == baseline]
    if not base_groups:
        found = sorted({g for g, _ in by_key})
        raise UserError(f"no complete {baseline} runs found (optimizers: {', '.join(found)}); "
                        "pick the baseline with --vs.")
    results = []
    for (group, size), group_runs in sorted(by_key.items()):
        base = next(((g, s) for g, s in by_key if g in base_groups and s == size), None)
        if group in base_groups or base is None:
            continue
        base_runs = best_lr_runs(by_key[base])
        per_seed, mean_curve = _baseline_curves(base_runs)
        label = f"{size[0]} h{size[1]}"
        _check_curve(mean_curve, baseline, label)
        base_last = {(r.seed, r.iterations): last_periodic(r) for r in base_runs}
        chosen = best_lr_runs(group_runs)
        reasons = [f"{name}: {why}" for name, why in ((group, sweep_untuned(group_runs)),
                                                      (baseline, sweep_untuned(by_key[base])))
                   if why]
        budgets: dict[int, list[Run]] = {}
        for run in chosen:
            budgets.setdefault(run.iterations, []).append(run)
        for steps, rs in sorted(budgets.items()):
            rs = sorted(rs, key=lambda r: r.seed)
            values, kinds, paired, fractions, reached = [], [], True, [], True
            for run in rs:
                curve = per_seed.get(run.seed, [])
                if len(curve) < 2 or any(b[1] >= a[1] for a, b in zip(curve, curve[1:])):
                    curve, paired = mean_curve, False
                (point,) = multiplier.measured_multipliers(curve, [(run.pfh, run.final_loss)])
                values.append(point.multiplier)
                kinds.append(point.kind)
                fraction = steps_to(run, base_last.get((run.seed, steps)))
                if fraction is None:
                    reached = False
                else:
                    fractions.append(fraction)
            steps_fraction = (seeds.mean_se(fractions) if fractions and reached else None)
            results.append(BudgetMultiplier(
                group, size[0], size[1], steps, rs[0].lr, rs[0].total_params,
                tuple(r.seed for r in rs),
                seeds.mean_se([r.final_loss for r in rs]), seeds.mean_se(values), tuple(kinds),
                paired, steps_fraction, "; ".join(reasons) or None))
    if not results:
        raise UserError(f"no size has both {baseline} and another optimizer; nothing to compare.")
    return results

