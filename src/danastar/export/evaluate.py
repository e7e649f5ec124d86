"""Downstream scores of a run: lm-evaluation-harness (its Python API, model type ``hf``) on the
run's Hugging Face export, written to ``<run_dir>/eval/<step>.json``.

A run directory or checkpoint is exported first into a temporary directory (removed after); an
export directory (``danastar export``) is evaluated as it is, and its scores go to the run it
came from (``danastar_export.json``), or beside it when that run is not here. Scores of further
tasks at the same step are added to the same file.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

from danastar.errors import UserError
from danastar.extras import MissingExtra

try:  # first, so that without the extra this says so before importing anything else
    import lm_eval
    from lm_eval.tasks import TaskManager
except ModuleNotFoundError as error:
    if error.name != "lm_eval":
        raise
    raise MissingExtra("danastar eval", "eval", error.name) from None

from danastar.export import PROVENANCE_FILE, export
from danastar.rundir.files import EVAL_DIR

RECORD_KEYS = ("name", "alias", "sample_len", "samples")  # lm-eval's entries that are no score


@dataclasses.dataclass
class Evaluation:
    step: int | None
    scores: dict[str, dict[str, float]]  # task -> metric -> value ("acc", "acc_stderr", ...)
    written: Path


def evaluate(path: Path, tasks: list[str], *, limit: int | None = None,
             include_path: Path | None = None, batch_size: int = 8, device: str = "cpu",
             num_fewshot: int | None = None) -> Evaluation:
    """Score the run, checkpoint or export ``path`` on lm-eval ``tasks``; see the module doc."""
    path = Path(path)
    _quiet_lm_eval()
    manager = task_manager(tasks, include_path)
    check_tasks(tasks, manager)
    if (path / "config.json").is_file():
        return _evaluate_export(path, tasks, manager, limit, batch_size, device, num_fewshot)
    with tempfile.TemporaryDirectory(prefix="danastar-eval-") as scratch:
        exported = export(path, Path(scratch) / "model")
        return _evaluate_export(exported.out, tasks, manager, limit, batch_size, device,
                                num_fewshot)


class _ToStandardError(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (a handler made once would keep the
    stream of its day, which a caller may have replaced and closed since)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _quiet_lm_eval() -> None:
    """lm-eval's own warnings and errors only, on the current standard error."""
    logger = logging.getLogger("lm_eval")
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    logger.handlers = [_ToStandardError()]


def task_manager(tasks: list[str], include_path: Path | None) -> TaskManager:
    """lm-eval's index of the tasks: of `include_path` alone where it holds every task asked
    for (indexing lm-eval's own thousands of YAML files takes tens of seconds), else of both."""
    if include_path:
        own = TaskManager(include_path=str(include_path), include_defaults=False)
        if set(tasks) <= set(own.all_tasks):
            return own
    return TaskManager(include_path=str(include_path) if include_path else None)


def check_tasks(tasks: list[str], manager: TaskManager) -> None:
    known = set(manager.all_tasks)
    for task in tasks:
        if task not in known:
            close = difflib.get_close_matches(task, sorted(known), n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise UserError(f"lm-eval knows no task {task!r}; {hint}`lm-eval ls tasks` lists "
                            "them, and --include_path DIR adds your own YAML tasks.")


def _evaluate_export(export_dir: Path, tasks: list[str], manager: TaskManager,
                     limit: int | None, batch_size: int, device: str,
                     num_fewshot: int | None) -> Evaluation:
    provenance = _read_json(export_dir / PROVENANCE_FILE)
    # a danastar export's own modeling file is trusted; another directory's code is not run
    trusted = bool(provenance) and (export_dir / "modeling_danastar.py").is_file()
    if not (export_dir / "tokenizer.json").is_file():
        raise UserError(f"{export_dir} has no tokenizer (tokenizer.json), and lm-eval's tasks "
                        "are text; evaluate a run trained on tokenised text, not token ids.")
    try:
        results = lm_eval.simple_evaluate(
            model="hf", model_args={"pretrained": str(export_dir), "dtype": "float32",
                                    "trust_remote_code": trusted},
            tasks=tasks, task_manager=manager, limit=limit, batch_size=batch_size,
            device=device, num_fewshot=num_fewshot, log_samples=False)
    except (OSError, ConnectionError) as error:
        raise UserError(f"the data of task(s) {', '.join(tasks)} cannot be fetched "
                        f"({type(error).__name__}: {_first_line(error)}); run once with internet "
                        "to cache it (HF_DATASETS_CACHE), or use a task over local files."
                        ) from None
    scores = {task: _metrics(values) for task, values in results["results"].items()}
    step = provenance.get("step")
    run_dir = Path(provenance["run_dir"]) if provenance.get("run_dir") else None
    home = run_dir if run_dir is not None and run_dir.is_dir() else export_dir
    record = {"step": step, "checkpoint": provenance.get("checkpoint"),
              "architecture": provenance.get("architecture"),
              "lm_eval_version": results.get("lm_eval_version"), "limit": limit,
              "num_fewshot": num_fewshot,
              "samples": {task: results.get("n-samples", {}).get(task, {}).get("effective")
                          for task in scores}}
    written = _write(home / EVAL_DIR / f"{'export' if step is None else step}.json", record,
                     scores)
    return Evaluation(step=step, scores=scores, written=written)


def _metrics(values: dict[str, Any]) -> dict[str, float]:
    """lm-eval's "acc,none" → "acc" (the filter named when it is not the default)."""
    metrics = {}
    for key, value in values.items():
        if key in RECORD_KEYS or not isinstance(value, (int, float)):
            continue
        metric, _, filtering = key.partition(",")
        name = metric if filtering in ("", "none") else f"{metric}[{filtering}]"
        metrics[name] = float(value)
    return metrics


def _write(path: Path, record: dict, scores: dict) -> Path:
    previous = _read_json(path)
    tasks = {**previous.get("tasks", {}), **scores}
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps({**record, "tasks": tasks}, indent=1, sort_keys=True) + "\n")
    temporary.replace(path)
    return path


def table(scores: dict[str, dict[str, float]]) -> str:
    """Task, metric, value, ± stderr: one line per score."""
    rows = [("task", "metric", "value", "stderr")]
    for task, metrics in sorted(scores.items()):
        for metric, value in metrics.items():
            if metric.endswith("_stderr") or "_stderr[" in metric:
                continue
            stderr = metrics.get(metric.replace("[", "_stderr[", 1) if "[" in metric
                                 else f"{metric}_stderr")
            rows.append((task, metric, f"{value:.4f}",
                         "" if stderr is None else f"{stderr:.4f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                     for row in rows)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:200]
