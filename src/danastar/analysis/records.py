"""Reading run directories: config.yaml, plan.json, metrics.jsonl (and run.json, status.json
when present) into one :class:`Run` per directory.

A run is complete when metrics.jsonl holds a ``final: true`` validation record at
``step == iterations``; anything else is partial, shown as such and left out of fits.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from danastar.analysis import compute
from danastar.errors import UserError

COMPLETE = "complete"
PARTIAL = "partial"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    records = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return records
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a killed run
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


@dataclasses.dataclass
class Run:
    path: Path
    plan: dict[str, Any]
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    status: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def arch(self) -> str:
        """The architecture, and for a mixture of experts its experts (`enoki-moe64k2`: 64
        experts, 2 per token; `+1s` for a shared one), so that a MoE and a dense model with the
        same heads are two models, not one size, in every table and figure."""
        arch = str(self.plan.get("arch", "?"))
        if not self.plan.get("moe"):
            return arch
        shared = self.plan.get("moe_num_shared_experts") or 0
        return (f"{arch}-moe{self.plan.get('moe_num_experts', '?')}"
                f"k{self.plan.get('moe_num_experts_per_tok', '?')}"
                + (f"+{shared}s" if shared else ""))

    @property
    def heads(self) -> int:
        return int(self.plan.get("heads") or self.plan.get("n_head") or 0)

    @property
    def optimizer(self) -> str:
        return str(self.plan.get("opt") or self.config.get("optim", {}).get("name", "?"))

    def _setting(self, name: str) -> float | None:
        """An optimizer setting, only when the optimizer uses it (plans record κ for all)."""
        used = self.plan.get("optimizer_hparams")
        if isinstance(used, dict) and name not in used:
            return None
        return self.plan.get(name)

    @property
    def kappa(self) -> float | None:
        return self._setting("kappa")

    @property
    def clipsnr(self) -> float | None:
        return self._setting("clipsnr")

    @property
    def omega(self) -> float | None:
        value = self.plan.get("omega", self.config.get("optim", {}).get("omega"))
        return None if value is None else float(value)

    @property
    def lr(self) -> float:
        return float(self.plan.get("lr", math.nan))

    @property
    def seed(self) -> int:
        return int(self.plan.get("seed", self.config.get("train", {}).get("seed", 0)) or 0)

    @property
    def global_batch(self) -> int:
        layout = self.plan.get("batch_layout") or {}
        return int(layout.get("global_batch")
                   or self.plan.get("batch_size", 0) * self.plan.get("acc_steps", 1))

    @property
    def iterations(self) -> int:
        return int(self.plan.get("iterations", 0))

    @property
    def non_embedding(self) -> int:
        """N_ne for compute (12·d²·L for Enoki, exact for Qwen3)."""
        return compute.compute_non_embedding(self.plan)

    @property
    def lr_law_params(self) -> int:
        """P of the LR laws: 12·d²·L."""
        return int(self.plan["non_embedding_params"])

    @property
    def total_params(self) -> int:
        return int(self.plan.get("total_params", 0))

    @property
    def size(self) -> tuple[str, int]:
        return (self.arch, self.heads)

    @property
    def group(self) -> str:
        """The optimizer with the settings that make it a different curve (κ, clipsnr)."""
        return optimizer_label(self.optimizer, self.kappa, self.clipsnr)

    def _validation(self) -> list[dict[str, Any]]:
        return [r for r in self.metrics if "val_loss" in r and "step" in r]

    @property
    def final_record(self) -> dict[str, Any] | None:
        finals = [r for r in self._validation() if r.get("final")]
        return finals[-1] if finals else None

    @property
    def complete(self) -> bool:
        final = self.final_record
        return final is not None and int(final["step"]) == self.iterations > 0

    @property
    def wall_seconds(self) -> float | None:
        """Wall time from the run's first start (run.json) to its last status update, for a run
        that ran in one go (None if it was resumed, or the files do not say)."""
        from datetime import datetime

        try:
            starts = json.loads((self.path / "run.json").read_text())["starts"]
            first, last = starts[0]["at"], self.status["updated"]
        except (OSError, KeyError, IndexError, TypeError, ValueError):
            return None
        if len(starts) != 1:
            return None
        return (datetime.fromisoformat(last.replace("Z", "+00:00"))
                - datetime.fromisoformat(first.replace("Z", "+00:00"))).total_seconds()

    @property
    def state(self) -> str:
        if self.complete:
            return COMPLETE
        failed = self.status.get("state") == "failed"
        return "failed" if failed else PARTIAL

    @property
    def steps_done(self) -> int:
        steps = [int(r["step"]) for r in self.metrics if "step" in r]
        return max(steps, default=0)

    @property
    def tokens(self) -> int:
        values = [int(r["tokens"]) for r in self.metrics if "tokens" in r]
        return max(values, default=0)

    @property
    def final_loss(self) -> float | None:
        final = self.final_record
        return float(final["val_loss"]) if final is not None and self.complete else None

    @property
    def best_loss(self) -> float | None:
        losses = [float(r["val_loss"]) for r in self._validation()]
        return min(losses) if losses else None

    @property
    def tokens_per_s(self) -> float | None:
        values = [r["tokens_per_s"] for r in self.metrics if r.get("tokens_per_s")]
        return float(values[-1]) if values else None

    @property
    def flops(self) -> float:
        return compute.flops(self.non_embedding, self.tokens)

    @property
    def pfh(self) -> float:
        return compute.pfh(self.flops)

    def curve(self, x: str = "compute") -> tuple[list[float], list[float]]:
        """Validation loss against ``x`` (compute in PFH, tokens or steps): the periodic
        evaluations, then the final one in place of a periodic one at the same step."""
        by_step: dict[int, dict[str, Any]] = {}
        for record in self._validation():
            step = int(record["step"])
            if record.get("final") or step not in by_step:
                by_step[step] = record
        xs, ys = [], []
        for step, record in sorted(by_step.items()):
            tokens = float(record.get("tokens", 0))
            value = {"compute": compute.pfh(compute.flops(self.non_embedding, tokens)),
                     "tokens": tokens, "steps": float(step)}[x]
            xs.append(value)
            ys.append(float(record["val_loss"]))
        return xs, ys


def optimizer_label(optimizer: str, kappa: float | None = None,
                    clipsnr: float | None = None) -> str:
    label = optimizer
    if kappa is not None:
        label += f" κ={kappa:g}"
    if clipsnr is not None:
        label += f" clipsnr={clipsnr:g}"
    return label


def read_run(path: Path) -> Run:
    plan_file = _read_json(path / "plan.json")
    plan = dict(plan_file.get("plan", plan_file))
    if "batch_layout" in plan_file:
        plan["batch_layout"] = plan_file["batch_layout"]
    plan.update(_read_json(path / "run.json").get("plan", {}))
    try:
        config = yaml.safe_load((path / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        config = {}
    return Run(path=path, plan=plan, config=config if isinstance(config, dict) else {},
               metrics=_read_metrics(path / "metrics.jsonl"),
               status=_read_json(path / "status.json"))


def _is_run_dir(path: Path) -> bool:
    return (path / "plan.json").is_file()


def find_runs(paths: Iterable[str | Path]) -> list[Run]:
    """Every run directory given, or found below a directory given (a sweep), sorted by path.

    Raises UserError for a missing path, or when no run is found at all."""
    paths = [Path(p) for p in paths]
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise UserError(f"{path} does not exist; give run directories or sweep directories.")
        if _is_run_dir(path):
            found.append(path)
        else:
            found.extend(sorted(p.parent for p in path.rglob("plan.json")
                                if "checkpoints" not in p.parts))
    if not found:
        where = ", ".join(str(p) for p in paths)
        raise UserError(f"no run directories (with a plan.json) under {where}; point at a run "
                        "directory or at a sweep directory that holds runs.")
    unique = sorted(set(found))
    return [read_run(p) for p in unique]


def complete_runs(runs: Sequence[Run], what: str) -> list[Run]:
    """The complete runs; UserError naming ``what`` needs them when there are none."""
    complete = [r for r in runs if r.complete]
    if not complete:
        raise UserError(f"{what} needs complete runs, and all {len(runs)} run(s) found are "
                        "partial; let them finish (a complete run has its final validation "
                        "record at step == iterations).")
    return complete
