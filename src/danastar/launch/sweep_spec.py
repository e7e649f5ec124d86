"""Sweep files: a base configuration and the axes to vary, expanded into one run per grid point.

    name: lr-sweep-cpu
    base: {preset: cpu_shakespeare, train.iterations: 900}
    grid:
      optim.name: [adamw, adana, dana-star-mk4]
      model.heads: [2, 3, 4]
      lr_multiplier: [0.25, 0.5, 1, 2, 4]      # times the scaling law's LR
      train.seed: [0]

Keys are the dotted config keys of `danastar train` (`section.key`), plus `preset` (or `config`:
a preset name or YAML file, the `--config` flag) and `lr_multiplier` (times the LR the scaling
plan would choose; turned into `--lr` by whoever plans the run). Points are the product of the
grid axes in the order written; each runs in `runs/<name>/<point name>`, the point's name made
from the values that vary. `danastar submit --array` submits them as one job array.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from danastar.config import FLAGS, all_keys
from danastar.errors import UserError
from danastar.launch.user_yaml import read_user_yaml
from danastar.rundir import metrics
from danastar.rundir.files import METRICS_FILE, PLAN_FILE
from danastar.rundir.status import read_status

SPECIAL_KEYS = ("preset", "config", "lr_multiplier")
SHORT_NAMES = {"optim.name": "", "model.heads": "h", "lr_multiplier": "lrx", "train.seed": "s",
               "optim.lr": "lr", "model.arch": "", "optim.omega": "om", "optim.kappa": "k"}


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep."""

    name: str  # readable, unique within the sweep
    overrides: dict[str, Any]  # dotted config keys -> values (base, then this point's grid values)
    preset: str | None = None
    lr_multiplier: float | None = None
    varied: dict[str, Any] = field(default_factory=dict)  # only this point's grid values

    def train_argv(self) -> list[str]:
        """Arguments for `danastar train` (without `--lr` from `lr_multiplier`)."""
        argv = ["--config", self.preset] if self.preset else []
        return argv + [f"{key}={format_value(value)}" for key, value in self.overrides.items()]


@dataclass(frozen=True)
class Sweep:
    name: str
    base: dict[str, Any]
    grid: dict[str, list]
    source: Path | None = None

    def points(self) -> list[SweepPoint]:
        return expand(self)

    def run_dir(self, point: SweepPoint, root: Path = Path("runs")) -> Path:
        return root / self.name / point.name


def load_sweep(path: Path | str) -> Sweep:
    """Read and check a sweep file; every problem is one sentence naming the fix."""
    path = Path(path)
    return parse_sweep(read_user_yaml(path, "sweep file"), path)


def parse_sweep(loaded: Any, source: Path | None = None) -> Sweep:
    where = f"sweep file {source}" if source else "the sweep"
    if not isinstance(loaded, dict):
        raise UserError(f"{where} must be a mapping with name:, base: and grid:.")
    unknown = set(loaded) - {"name", "base", "grid"}
    if unknown:
        raise UserError(f"{where} has unknown keys {sorted(unknown)}; use name:, base: and grid:.")
    name = loaded.get("name") or (source.stem if source else None)
    if not name or not re.fullmatch(r"[A-Za-z0-9._-]+", str(name)):
        raise UserError(f"{where} needs a name: made of letters, digits, '.', '_' and '-' (it "
                        f"names the folder of its runs).")
    base = loaded.get("base") or {}
    grid = loaded.get("grid") or {}
    if not isinstance(base, dict) or not isinstance(grid, dict):
        raise UserError(f"{where}: base: and grid: must be mappings of config keys to values.")
    if not grid:
        raise UserError(f"{where} has an empty grid:; list at least one key to vary with its "
                        f"values, e.g. grid: {{train.seed: [0, 1]}}.")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise UserError(f"{where}: grid key {key!r} must list at least one value, e.g. "
                            f"{key}: [1, 2].")
    for part, keys in (("base", base), ("grid", grid)):
        for key in keys:
            check_key(str(key), f"{where}: unknown {part} key")
    if "lr_multiplier" in {**base, **grid} and "optim.lr" in {**base, **grid}:
        raise UserError(f"{where} sets both optim.lr and lr_multiplier (which multiplies the "
                        f"scaling law's LR); keep only one of them.")
    for value in grid.get("lr_multiplier", [base.get("lr_multiplier", 1.0)]):
        check_lr_multiplier(value, where)
    return Sweep(str(name), dict(base), {key: list(values) for key, values in grid.items()},
                 source)


def check_lr_multiplier(value: Any, where: str) -> None:
    """An LR multiplier is a finite number above 0 (the run's LR is it times the law's), or
    null (the law's LR)."""
    if value is None:
        return
    number = None if isinstance(value, bool) else value
    if isinstance(number, str):
        try:
            number = float(number)
        except ValueError:
            number = None
    if not isinstance(number, (int, float)) or not math.isfinite(number) or number <= 0:
        raise UserError(f"{where}: lr_multiplier {value!r} must be a number greater than 0 (it "
                        f"multiplies the scaling law's LR, e.g. 0.5 or 2).")


def check_key(key: str, where: str) -> None:
    """A sweep key is a dotted config key of `danastar train` or one of SPECIAL_KEYS; anything
    else is refused with the nearest valid key (a flag name is mapped to its key)."""
    valid = [*all_keys(), *SPECIAL_KEYS]
    if key in valid:
        return
    if key.lstrip("-") in FLAGS:
        hint = f"write it as the config key {FLAGS[key.lstrip('-')][0]!r}"
    else:
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        hint = (f"did you mean {close[0]!r}?" if close else
                "use a dotted config key of danastar train (section.key, e.g. optim.name), "
                f"or one of {', '.join(SPECIAL_KEYS)}")
    raise UserError(f"{where} {key!r}; {hint.rstrip('?.')}"
                    f"{'?' if hint.endswith('?') else '.'}")


def expand(sweep: Sweep) -> list[SweepPoint]:
    """The product of the grid axes, in the order written; each point a full set of overrides."""
    keys = list(sweep.grid)
    points, seen = [], set()
    for values in itertools.product(*(sweep.grid[key] for key in keys)):
        varied = dict(zip(keys, values))
        settings = {**sweep.base, **varied}
        preset = settings.pop("preset", None) or settings.pop("config", None)
        settings.pop("config", None)
        multiplier = settings.pop("lr_multiplier", None)
        name = point_name(varied) or "run"
        if name in seen:
            raise UserError(f"sweep {sweep.name}: two grid points are both named {name!r}; "
                            f"remove the repeated value from the grid.")
        seen.add(name)
        points.append(SweepPoint(name, settings, preset,
                                 None if multiplier is None else float(multiplier), varied))
    return points


def point_name(varied: dict[str, Any]) -> str:
    """`adamw-h2-lrx0.5-s0`: the varied values, each tagged with a short form of its key."""
    parts = []
    for key, value in varied.items():
        tag = SHORT_NAMES.get(key, key.rsplit(".", 1)[-1])
        text = format_value(value)
        parts.append(f"{tag}{text}")
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", "-".join(parts))


def format_value(value: Any) -> str:
    """A value as the text of a `key=value` override, read back as the same value (a float keeps
    a decimal point: YAML would read `1e-05` as a string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        if "e" in text and "." not in text.split("e")[0]:
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        return text
    if value is None:
        return "null"
    return str(value)


def finite(value: Any) -> bool:
    """A logged loss is a finite number (NaN and infinities are logged as such)."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def run_state(run_dir: Path | str, iterations: int | None = None) -> dict:
    """{"state": "complete" | "partial" | "new", "step", "iterations"} of one run directory.

    Complete: metrics.jsonl holds the final validation record (`final: true`) at step ==
    iterations (from plan.json, or `iterations` when given: the total the run is to reach, which
    is more than its plan.json records when a sweep file extends its runs), with a finite loss,
    and status.json does not say the run failed. Partial: the run has started (a plan or
    metrics exist) and is resumed from its latest checkpoint when trained again (a failed run
    too: training says again why it fails). New: nothing there yet."""
    run_dir = Path(run_dir)
    try:
        recorded = json.loads((run_dir / PLAN_FILE).read_text())["plan"]["iterations"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = None
    started = recorded is not None
    iterations = recorded if iterations is None else iterations
    try:
        logged = metrics.records(run_dir / METRICS_FILE)
    except OSError:
        logged = []
    step = max((int(record.get("step", 0)) for record in logged), default=0)
    final = metrics.final_validation(logged)
    final_at = None if final is None else final.get("step")
    failed = read_status(run_dir).get("state") == "failed" or (
        final is not None and not finite(final.get("val_loss")))
    if iterations is not None and final_at == iterations and not failed:
        state = "complete"
    elif started or logged:
        state = "partial"
    else:
        state = "new"
    return {"state": state, "step": step, "iterations": iterations}
