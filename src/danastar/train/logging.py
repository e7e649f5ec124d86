"""Reporting: metrics.jsonl, the console, per-rank logs, wandb, TensorBoard (the run
directory's files are named in rundir/files.py).

Only rank 0 writes metrics, the console and the trackers; every rank writes its own log.
wandb and tensorboard are imported only when asked for.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import numpy
import torch

import danastar
from danastar.errors import UserError
from danastar.progress import bar
from danastar.rundir.files import LOGS_DIR, METRICS_FILE, TENSORBOARD_DIR
from danastar.rundir.metrics import truncate as truncate_metrics

# Dense bf16 peak FLOP/s of common accelerators, matched against the device name (first match wins).
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "H800": 989e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A800": 312e12,
    "A10G": 125e12,
    "A6000": 155e12,
    "L40S": 362e12,
    "L4": 121e12,
    "V100": 125e12,
    "MI300X": 1307e12,
    "MI250X": 383e12,
}


def peak_flops(device: torch.device, given: Optional[float] = None) -> Optional[float]:
    """The device's peak FLOP/s for MFU: the flag if given, else the table; None when unknown
    (CPU)."""
    if given:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_FLOPS.items() if key in name), None)


def environment(world_size: int) -> dict[str, Any]:
    """What produced this run: code revision, versions and the machine."""
    source = Path(danastar.__file__).resolve().parent
    return {
        "git_revision": git(["rev-parse", "HEAD"], source),
        "git_dirty": bool(git(["status", "--porcelain", "--untracked-files=no"], source)),
        "danastar": danastar.__version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": sys.version.split()[0],
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else platform.processor() or "cpu",
        # The CPU and the instruction set torch's kernels were chosen for: runs on CPUs of two
        # instruction sets (AVX2, AVX512) round differently, so this says which a run can match.
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "world_size": world_size,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "command": sys.argv,
    }


def cpu_model() -> str:
    """The CPU's name as the kernel reports it (`/proc/cpuinfo`), else what Python knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git(args: list[str], cwd: Path) -> Optional[str]:
    try:
        result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def rank_logger(run_dir: Path, rank: int) -> logging.Logger:
    """A logger writing to <run_dir>/logs/rank<r>.log (and nowhere else)."""
    (run_dir / LOGS_DIR).mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger(f"danastar.train.rank{rank}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    handler = logging.FileHandler(run_dir / LOGS_DIR / f"rank{rank}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s rank" + str(rank) + " %(message)s"))
    logger.addHandler(handler)
    return logger


class RunLogger:
    """metrics.jsonl + progress bar + console + trackers for rank 0; a file log for every rank."""

    def __init__(
        self,
        run_dir: Path,
        config,
        *,
        rank: int,
        total_steps: int,
        start_step: Optional[int] = None,
        resumed: bool = False,
    ):
        """Messages (`info`) work at once; metrics, the progress bar and the trackers once
        `start` knows where the run starts (given `start_step`, it is called here)."""
        self.run_dir = Path(run_dir)
        self.config = config
        self.total_steps = total_steps
        self.is_main = rank == 0
        self.file_log = rank_logger(self.run_dir, rank)
        self.bar = None
        self.wandb_run = None
        self.tensorboard = None
        self.metrics_path = self.run_dir / METRICS_FILE
        self.metrics_file = None
        if start_step is not None:
            self.start(start_step, resumed)

    def start(self, start_step: int, resumed: bool) -> None:
        """Open metrics.jsonl (dropping lines after `start_step` of a resumed run), the progress
        bar and the trackers (rank 0)."""
        if not self.is_main:
            return
        config = self.config
        if resumed:
            truncate_metrics(self.metrics_path, start_step)
        # A fresh start finds no metrics.jsonl: an earlier run's was moved aside (train/identity).
        self.metrics_file = open(self.metrics_path, "a")
        if config.logging.progress:
            # a pipe or a file gets plain lines (`progress`), not a bar
            self.bar = bar(self.total_steps, initial=start_step, desc="train", unit="step",
                           file=sys.stdout)
        if config.logging.wandb:
            self.wandb_run = start_wandb(config, self.run_dir, resumed)
        if config.logging.tensorboard:
            try:  # the tensorboard extra
                from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415
            except ImportError:
                raise UserError(
                    "TensorBoard is not installed; pip install 'danastar[tensorboard]' "
                    "or drop logging.tensorboard."
                ) from None
            self.tensorboard = SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD_DIR))

    def info(self, message: str) -> None:
        """A line on the console (rank 0, above the progress bar) and in this rank's log."""
        self.file_log.info(message)
        if not self.is_main:
            return
        if self.bar is not None:
            self.bar.write(message)
        else:
            print(message, flush=True)

    def log(self, metrics: dict[str, Any]) -> None:
        """One metrics.jsonl line (and tracker point); `metrics` holds `step`."""
        self.file_log.info(json.dumps(metrics))
        if not self.is_main:
            return
        self.metrics_file.write(json.dumps(metrics, allow_nan=True) + "\n")
        self.metrics_file.flush()
        numbers = tracker_scalars(metrics)
        if self.wandb_run is not None:
            self.wandb_run.log(numbers, step=metrics["step"])
        if self.tensorboard is not None:
            for key, value in numbers.items():
                self.tensorboard.add_scalar(key, value, metrics["step"])

    def progress(self, step: int, metrics: dict[str, Any]) -> None:
        """The bar's position and numbers on a terminal; elsewhere the same as a plain line."""
        if self.bar is None:
            return
        shown = {k: (f"{v:.4g}" if isinstance(v, float) and math.isfinite(v) else v)
                 for k in ("train_loss", "lr", "grad_norm", "moe_max_load")
                 if (v := metrics.get(k)) is not None}
        if self.bar.disable:
            numbers = ", ".join(f"{key} {value}" for key, value in shown.items())
            print(f"step {step}/{self.total_steps}: {numbers}", flush=True)
            return
        self.bar.n = step
        self.bar.set_postfix(shown, refresh=False)
        self.bar.refresh()

    def end_progress(self) -> None:
        """Close the progress bar, so that what is printed next (the sample) stands below it."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        if not self.is_main:
            return
        self.end_progress()
        if self.metrics_file is not None:
            self.metrics_file.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
        if self.tensorboard is not None:
            self.tensorboard.close()


def tracker_scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers of one metrics line that trackers (wandb, TensorBoard) take as scalars: every
    number but the step, and for a mixture of experts each layer's largest load (in units of the
    balanced load, as `moe_max_load`) as `moe_max_load/layer<l>`; per-expert lists stay in
    metrics.jsonl, where a few hundred series per layer do not clutter a dashboard."""
    numbers = {k: v for k, v in metrics.items()
               if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
    for prefix in ("", "val_"):
        load = metrics.get(f"{prefix}moe_load")
        if isinstance(load, list) and load and isinstance(load[0], list):
            for layer, row in enumerate(load):
                numbers[f"{prefix}moe_max_load/layer{layer}"] = max(row) * len(row)
    return numbers


def start_wandb(config, run_dir: Path, resumed: bool):
    try:  # the wandb extra
        import wandb  # noqa: PLC0415
    except ImportError:
        raise UserError(
            "wandb is not installed; pip install 'danastar[wandb]' or pass --no_wandb."
        ) from None
    mode = (
        "offline"
        if config.logging.wandb_offline or os.environ.get("WANDB_MODE") == "offline"
        else None
    )
    return wandb.init(
        project=config.logging.wandb_project,
        name=run_dir.name,
        id=run_dir.name,
        dir=str(run_dir),
        config=config.to_dict(),
        mode=mode,
        resume="allow" if resumed else None,
    )
