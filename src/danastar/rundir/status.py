"""A run's state for whoever watches or continues it: `status.json` and the STOP file.

`<run_dir>/status.json` is rewritten at the start and the end of every segment (one process's
share of a run: a job, a requeued job, a `--iterations_to_run` chain link):

    {"state": "segment done", "step": 300, "total": 900, "restarts": 1, "job_id": "4242",
     "exit_code": 75, "updated": "2026-11-23T09:12:44Z"}

States: running, preempted (a signal or the stop file; a checkpoint was saved), interrupted
(Ctrl-C; a checkpoint was saved), segment done (`--iterations_to_run` reached; a checkpoint was
saved), complete (all iterations done, with a step that trained and a finite final validation
loss), failed (written by training when the run diverged, when every step was skipped as
non-finite or its final validation loss is not finite, with the sentence in `reason`; and by the
job script when training crashed). `restarts` and `job_id` come from SLURM when it runs the job.

`<run_dir>/STOP`: creating this file asks the run to save a checkpoint and stop, exactly as
SIGUSR1 does. A SLURM job script creates it when its time is nearly up; a person can create it
too (`touch runs/<run>/STOP`). Rank 0 looks for it after every step; the run removes it when it
has stopped.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from danastar.durable import write_atomic
from danastar.rundir.files import STATUS_FILE, STOP_FILE

STATES = ("running", "preempted", "interrupted", "segment done", "complete", "failed")


def read_status(run_dir: Path | str) -> dict:
    """The run's status, or {} when it has none (or it cannot be read)."""
    try:
        status = json.loads((Path(run_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def write_status(run_dir: Path | str, state: str, **fields) -> dict:
    """Update status.json with `state` and `fields` (keeping the others), atomically."""
    assert state in STATES, state
    status = read_status(run_dir)
    if state != "failed":
        status.pop("reason", None)  # an earlier segment's failure, not this one's
    status.update(fields, state=state,
                  updated=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    status.update(slurm_job())
    status.setdefault("restarts", 0)
    write_atomic(Path(run_dir) / STATUS_FILE, json.dumps(status, indent=1) + "\n")
    return status


def slurm_job(environ=None) -> dict:
    """{"job_id", "restarts"} of the SLURM job running this process (an array task as
    `<array job>_<task>`, as squeue shows it); {} outside SLURM."""
    env = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in env:
        return {}
    job_id = env["SLURM_JOB_ID"]
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        job_id = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    # A requeued job counts its restarts; a successor of a dependency chain is told its segment.
    restarts = env.get("SLURM_RESTART_COUNT") or env.get("DANASTAR_SEGMENT") or "0"
    return {"job_id": job_id, "restarts": int(restarts)}


def stop_file(run_dir: Path | str) -> Path:
    return Path(run_dir) / STOP_FILE


def request_stop(run_dir: Path | str) -> None:
    """Ask the run in `run_dir` to save a checkpoint and stop after its step."""
    stop_file(run_dir).touch()


def stop_requested(run_dir: Path | str) -> bool:
    return stop_file(run_dir).exists()


def clear_stop(run_dir: Path | str) -> None:
    """The request has been served: the next segment must not stop at once."""
    stop_file(run_dir).unlink(missing_ok=True)
