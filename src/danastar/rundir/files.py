"""What a run directory holds, by name (docs/training.md describes each file):

    <run_dir>/config.yaml          the resolved config
    <run_dir>/plan.json            the scaling plan and the batch layout
    <run_dir>/run.json             the run's identity and one entry per start (train/identity.py)
    <run_dir>/model_config.json    the model's options (`ModelConfig.to_dict()`)
    <run_dir>/environment.json     git revision, versions, host, world size
    <run_dir>/metrics.jsonl        one JSON object per line (rundir/metrics.py)
    <run_dir>/status.json, STOP    where the run stands, a request to stop (rundir/status.py)
    <run_dir>/checkpoints/         <kind>-<step>/ each (train/checkpoint.py: what one holds)
    <run_dir>/logs/rank<r>.log     what each rank said
    <run_dir>/tensorboard/         TensorBoard's event files (logging.tensorboard)
    <run_dir>/slurm/               the job `danastar submit` checked: its plan.json, config.yaml
    <run_dir>/eval/<step>.json     `danastar eval`'s scores of a checkpoint (export.json: of an
                                   export, in the export's own directory)
    <run_dir>/previous-<time>/     an earlier run's files, moved aside by a fresh start
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Optional

from danastar.durable import fsync_dir

CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.json"
RUN_FILE = "run.json"
MODEL_CONFIG_FILE = "model_config.json"
ENVIRONMENT_FILE = "environment.json"
METRICS_FILE = "metrics.jsonl"
SUPERSEDED_FILE = "metrics-superseded.jsonl"  # lines a resumed run logs again, kept
STATUS_FILE = "status.json"
STOP_FILE = "STOP"
START_FILE = "start.json"  # `train --nproc N`'s start decision for its workers (gone after them)
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_NAME = re.compile(r"^(latest|permanent)-(\d{8})$")  # a checkpoint in it: <kind>-<step>
LOGS_DIR = "logs"
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"  # wandb's own name for the folder it writes in the run directory
SUBMISSION_DIR = "slurm"
EVAL_DIR = "eval"

# What an earlier run leaves in its directory; a fresh start moves these into previous-<time>/.
RUN_FILES = (CHECKPOINTS_DIR, METRICS_FILE, SUPERSEDED_FILE, CONFIG_FILE, PLAN_FILE,
             MODEL_CONFIG_FILE, ENVIRONMENT_FILE, RUN_FILE, LOGS_DIR, TENSORBOARD_DIR, WANDB_DIR)
# What only a run that trained leaves: config.yaml and plan.json alone are written before the
# first step too (by `danastar submit`, say), and are no earlier run.
TRAINED_FILES = (CHECKPOINTS_DIR, METRICS_FILE, RUN_FILE)


def checkpoint_dirs(directory: Path) -> list[Path]:
    """The checkpoint directories in `directory` (a run's checkpoints/) by name, oldest step
    first (none verified)."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.is_dir() and CHECKPOINT_NAME.match(p.name)]
    return sorted(found, key=lambda p: (checkpoint_step(p), p.name))


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint directory's name says."""
    return int(CHECKPOINT_NAME.match(path.name).group(2))


def has_earlier_run(run_dir: Path) -> bool:
    return any((Path(run_dir) / name).exists() for name in TRAINED_FILES)


def move_aside(run_dir: Path) -> Optional[Path]:
    """Move an earlier run's files into `previous-<UTC time>/` inside the run directory; returns
    where (None when there was nothing). A rename within one filesystem: nothing is copied."""
    if not has_earlier_run(run_dir):
        return None
    present = [run_dir / name for name in RUN_FILES
               if (run_dir / name).exists() and name != LOGS_DIR]
    # The per-rank logs go with the run; other files in logs/ (a job's own output, which its
    # scheduler is still appending to) stay where the job writes them.
    present += sorted((run_dir / LOGS_DIR).glob("rank*.log"))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside, number = run_dir / f"previous-{stamp}", 1
    while aside.exists():
        number += 1
        aside = run_dir / f"previous-{stamp}-{number}"
    aside.mkdir()
    for path in present:
        target = aside / path.relative_to(run_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(target))
    fsync_dir(aside)
    fsync_dir(run_dir)
    return aside
