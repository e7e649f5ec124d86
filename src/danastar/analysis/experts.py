"""Per-expert statistics of mixture-of-experts runs (`danastar plot experts`): the `experts`
entries the training loop writes into metrics.jsonl at each evaluation (format in
`danastar.train.experts`), read back per run and pooled over the MoE layers.

What the figure asks: does an expert's τ (Dana-Star's estimate of how often its coordinates get
gradient) follow ρ_e, the share of optimizer steps in which some token was routed to it, and how
does its weight norm grow with ρ_e, optimizer by optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from danastar.analysis.records import Run, read_run
from danastar.errors import UserError
from danastar.rundir.files import PLAN_FILE

KEY = "experts"  # the metrics.jsonl entry


@dataclass(frozen=True)
class Snapshot:
    """One run's `experts` entry at one evaluation."""

    run: Run
    step: int
    entry: dict

    @property
    def layers(self) -> int:
        return len(self.entry["routed_share"])

    @property
    def experts(self) -> int:
        return len(self.entry["routed_share"][0]) if self.entry["routed_share"] else 0

    @property
    def has_tau(self) -> bool:
        return "tau_mean" in self.entry

    def pooled(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(layer index, value) of every (layer, expert), all layers pooled, layer-major."""
        rows = self.entry[key]
        values = np.array([v for row in rows for v in row], dtype=float)
        layers = np.repeat(np.arange(len(rows)), [len(row) for row in rows])
        return layers, values


def entries(run: Run) -> dict[int, dict]:
    """Every `experts` entry of a run, by step (the last one written wins: a resumed run may
    repeat an evaluation)."""
    return {int(m["step"]): m[KEY] for m in run.metrics
            if isinstance(m.get(KEY), dict) and "step" in m and m[KEY].get("routed_share")}


def snapshot(run_dir: str | Path, step: int | None = None) -> Snapshot:
    """The `experts` entry of run `run_dir` at `step` (None: the last one)."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(f"{path} does not exist; give a run directory.")
    if not (path / PLAN_FILE).is_file():
        raise UserError(f"{path} is not a run directory (no {PLAN_FILE}); give the directory "
                        "`danastar train` wrote.")
    run = read_run(path)
    found = entries(run)
    if not found:
        raise UserError(f"{path} has no per-expert statistics in metrics.jsonl; plot experts "
                        "needs a mixture-of-experts run (--moe) evaluated at least once.")
    if step is None:
        step = max(found)
    elif step not in found:
        raise UserError(f"{path} has no per-expert statistics at step {step}; --step takes one "
                        f"of its evaluation steps: {', '.join(map(str, sorted(found)))}.")
    return Snapshot(run, step, found[step])


def snapshots(run_dirs, step: int | None = None) -> list[Snapshot]:
    if not run_dirs:
        raise UserError("plot experts needs one or more run directories.")
    return [snapshot(path, step) for path in run_dirs]
