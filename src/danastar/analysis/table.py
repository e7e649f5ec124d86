"""The results table: one row per run, the best LR per (optimizer, size) with seed statistics,
and the measured compute multiplier against a baseline optimizer."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from danastar.analysis import budgets, multiplier, records, seeds
from danastar.analysis.records import Run, complete_runs
from danastar.errors import UserError

COLUMNS = ("run", "arch", "heads", "dataset", "optimizer", "lr", "omega", "batch", "steps",
           "tokens", "pfh", "final_loss", "best_loss", "tokens_per_s", "state")
BEST_COLUMNS = ("optimizer", "arch", "heads", "dataset", "steps", "lr", "seeds", "final_loss",
                "final_loss_se", "pfh", "total_params", "runs_at_size")


def run_row(run: Run, labels: dict[tuple[str, str], str] | None = None,
            evals: Sequence[str] = (), extended: bool = False) -> dict[str, Any]:
    """One run's row; ``labels``: `records.dataset_labels` of all the table's runs; ``evals``:
    the score columns (`eval_columns`), after the losses, None where this run has no score;
    ``extended``: with the `extended` column (`Run.extended`, where a table's run has one)."""
    dataset = (labels or records.dataset_labels([run]))[run.data]
    scores = run.eval_scores
    steps = {"steps": f"{run.steps_done}/{run.iterations}",
             **({"extended": run.extended} if extended else {})}
    return {"run": run.name, "arch": run.arch, "heads": run.heads,
            "dataset": None if dataset == "?" else dataset, "optimizer": run.group,
            "lr": run.lr, "omega": run.omega, "batch": run.global_batch,
            **steps, "tokens": run.tokens,
            "pfh": run.pfh, "final_loss": run.final_loss, "best_loss": run.best_loss,
            **{column: scores.get(column) for column in evals},
            "tokens_per_s": run.tokens_per_s, "state": run.state}


def eval_columns(runs: Sequence[Run]) -> tuple[str, ...]:
    """The score columns of the runs' newest evaluations (`danastar eval`), ``"<task>
    <metric>"``, sorted; none when no run was evaluated."""
    return tuple(sorted({column for run in runs for column in run.eval_scores}))


def run_columns(evals: Sequence[str] = (), extended: bool = False) -> tuple[str, ...]:
    """The run table's columns, the score columns after the losses; ``extended``: the
    `extended` column after the steps (where a run was continued past its planned steps)."""
    at, steps = COLUMNS.index("best_loss") + 1, COLUMNS.index("steps") + 1
    columns = COLUMNS[:at] + tuple(evals) + COLUMNS[at:]
    return columns[:steps] + ("extended",) + columns[steps:] if extended else columns


@dataclasses.dataclass(frozen=True)
class Best:
    """The best LR of one (optimizer, dataset, size): its runs (one per seed) and their mean
    loss."""

    optimizer: str  # the group label (name with κ, clipsnr)
    base_optimizer: str
    arch: str
    heads: int
    lr: float
    loss: seeds.MeanSE
    runs: tuple[Run, ...]
    runs_at_size: int  # complete runs of this optimizer at this size (all LRs)
    data: tuple[str, str] = ("", "")  # Run.data of its runs
    dataset: str | None = None  # its display name (records.dataset_labels)
    lrs: tuple[float, ...] = ()  # every LR it was chosen from (at the sweep budget)

    @property
    def iterations(self) -> int:
        """The steps of its runs: the sweep budget of this optimizer and size."""
        return self.runs[0].iterations

    @property
    def untuned(self) -> str | None:
        """Why its LR may not be the optimizer's best (`budgets.untuned`); None if tuned."""
        return budgets.untuned(self.lrs or (self.lr,), self.lr)

    @property
    def pfh(self) -> float:
        return sum(r.pfh for r in self.runs) / len(self.runs)

    @property
    def total_params(self) -> int:
        return self.runs[0].total_params

    @property
    def lr_law_params(self) -> int:
        return self.runs[0].lr_law_params

    def row(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "arch": self.arch, "heads": self.heads,
                "dataset": None if self.dataset == "?" else self.dataset,
                "steps": self.iterations, "lr": self.lr, "seeds": len({r.seed for r in self.runs}),
                "final_loss": self.loss.mean,
                "final_loss_se": None if math.isnan(self.loss.se) else self.loss.se,
                "pfh": self.pfh, "total_params": self.total_params,
                "runs_at_size": self.runs_at_size, "untuned": self.untuned}


def best_per_size(runs: Sequence[Run]) -> list[Best]:
    """Per (optimizer group, dataset, arch, heads), the best LR (``seeds.best_lr``: the lowest
    mean final loss over the seeds every LR has) among the runs at the sweep budget
    (``budgets.lr_sweep_runs``: the budget with the most LRs; the runs at other budgets,
    ``budgets.other_budget_runs``, are left out), with the mean over all its seeds; partial
    runs left out.
    Runs on different data (`Run.data`) are never pooled; UserError when two runs of one LR
    have the same seed (``records.check_distinct_seeds``). Sorted by optimizer, dataset, then
    size."""
    complete = complete_runs(runs, "choosing the best LR")
    records.check_distinct_seeds(complete)
    labels = records.dataset_labels(complete)
    groups: dict[tuple[str, tuple[str, str], str, int], dict[float, list[Run]]] = {}
    for run in budgets.lr_sweep_runs(complete):
        groups.setdefault((run.group, run.data, run.arch, run.heads), {}).setdefault(
            records.lr_key(run.lr), []).append(run)
    best = []
    for (group, data, arch, heads), by_lr in sorted(groups.items()):
        stats = {lr: seeds.mean_se([r.final_loss for r in rs]) for lr, rs in by_lr.items()}
        lr = seeds.best_lr({lr: {r.seed: r.final_loss for r in rs} for lr, rs in by_lr.items()})
        best.append(Best(group, by_lr[lr][0].optimizer, arch, heads, lr, stats[lr],
                         tuple(by_lr[lr]), sum(len(rs) for rs in by_lr.values()), data,
                         labels[data], tuple(by_lr)))
    return best


def baseline_points(best: Sequence[Best], baseline: str) -> list[tuple[float, float]]:
    return sorted((b.pfh, b.loss.mean) for b in best if b.optimizer == baseline)


def check_baseline(best: Sequence[Best], baseline: str) -> list[tuple[float, float]]:
    """The baseline's (PFH, loss) points; UserError when it has fewer than two sizes. ``best``
    holds the runs of one dataset."""
    points = baseline_points(best, baseline)
    datasets = {b.dataset for b in best} - {None, "?"}
    on = f" on {datasets.pop()}" if len(datasets) == 1 else ""
    if len(points) >= 2 and any(b[1] <= a[1] for a, b in zip(points[1:], points)):
        losses = ", ".join(f"{loss:.4g}" for _, loss in points)
        raise UserError(f"{baseline}'s best final losses{on} do not decrease with compute "
                        f"({losses}, smallest size first), so no compute multiplier can be read "
                        "from them; train longer or add sizes.")
    if len(points) < 2:
        have = sorted({b.optimizer for b in best})
        raise UserError(f"a compute multiplier against {baseline} needs complete {baseline} runs "
                        f"at two or more sizes{on}, found {len(points)} (optimizers found: "
                        f"{', '.join(have)}); run the baseline too, or pick it with --vs.")
    return points


def with_multipliers(best: Sequence[Best], baseline: str,
                     runs: Sequence[Run] = ()) -> list[dict[str, Any]]:
    """The best rows with the measured multiplier vs ``baseline`` (1 for the baseline itself)
    and how it was obtained (interpolated or extrapolated); with ``runs``, also the fraction of
    compute saved: how early any complete run of the optimizer at that size first reached the
    baseline's best final loss there (None if none did). Each dataset's rows against the
    baseline on that dataset. ``untuned`` says why the row's LR, or the baseline's at that
    size, may not be tuned (`budgets.untuned`), None when both are."""
    points = {data: check_baseline([b for b in best if b.data == data], baseline)
              for data in dict.fromkeys(b.data for b in best)}
    base_loss = {(b.data, b.arch, b.heads): b.loss.mean for b in best if b.optimizer == baseline}
    base_untuned = {(b.data, b.arch, b.heads): b.untuned for b in best
                    if b.optimizer == baseline}
    rows = []
    for b in best:
        row = b.row()
        if b.optimizer == baseline:
            row["multiplier"], row["multiplier_kind"] = 1.0, "baseline"
        else:
            (m,) = multiplier.measured_multipliers(points[b.data], [(b.pfh, b.loss.mean)])
            row["multiplier"], row["multiplier_kind"] = m.multiplier, m.kind
        row["saved_fraction"] = None
        here = (b.data, b.arch, b.heads)
        reasons = [f"{name}: {why}" for name, why in (
            (b.optimizer, b.untuned),
            (baseline, base_untuned.get(here) if b.optimizer != baseline else None)) if why]
        row["untuned"] = "; ".join(reasons) or None
        if runs and b.optimizer != baseline and here in base_loss:
            curves = [r.curve("compute") for r in runs if r.complete and r.group == b.optimizer
                      and r.data == b.data and r.size == (b.arch, b.heads)]
            crossing = multiplier.compute_saved(base_loss[here], [c for c in curves if c[0]])
            row["saved_fraction"] = None if crossing is None else crossing.fraction_saved
        rows.append(row)
    return rows
