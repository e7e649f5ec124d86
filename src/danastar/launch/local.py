"""`danastar train --nproc N`: run real torchrun on this machine with the same arguments.

torchrun starts N workers, each running `python -m danastar train <the same arguments>`; a worker
sees torchrun's WORLD_SIZE and trains instead of launching again. SIGTERM and SIGUSR1 sent to
this process create the run's stop file instead of being passed on: the workers save a
checkpoint after their step and stop however long the save takes (torchrun would kill them 30 s
after forwarding a signal), and this process then exits with `PREEMPTED_EXIT_CODE`. Without a
run directory the signals are forwarded through torchrun as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from danastar.train.signals import PREEMPTED_EXIT_CODE, PREEMPTION_SIGNALS
from danastar.train.status import STOP_FILE, read_status

FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"  # torchrun forwards these to workers


def under_torchrun() -> bool:
    """True inside a worker that torchrun (or SLURM's srun with torchrun's variables) started."""
    return "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def worker_argv(train_argv: list[str]) -> list[str]:
    """The arguments for the workers: `--nproc N` becomes `parallel.nproc=N`, because torchrun's own
    parser would take `--nproc` for an abbreviation of its `--nproc_per_node` and stop."""
    result, arguments = [], iter(train_argv)
    for argument in arguments:
        if argument == "--nproc":
            result.append(f"parallel.nproc={next(arguments, '')}")
        elif argument.startswith("--nproc="):
            result.append(f"parallel.nproc={argument.split('=', 1)[1]}")
        else:
            result.append(argument)
    return result


def torchrun_command(nproc: int, train_argv: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone",  # one machine, rendezvous on a free port
        f"--nproc_per_node={nproc}",
        f"--signals_to_handle={FORWARDED_SIGNALS}",
        "-m", "danastar", "train", *worker_argv(train_argv),
    ]


def launch(nproc: int, train_argv: list[str], run_dir: Path | None = None) -> int:
    """Run torchrun with `nproc` workers; returns its exit code (or the preemption code)."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    process = subprocess.Popen(torchrun_command(nproc, train_argv))
    preempted = []

    def forward(signum, _frame):
        preempted.append(signum)
        if run_dir is not None and Path(run_dir).is_dir():
            (Path(run_dir) / STOP_FILE).touch()
        else:
            process.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in PREEMPTION_SIGNALS}
    try:
        code = process.wait()
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        code = process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if preempted or (code != 0 and stopped_with_work_left(run_dir, started)):
        return PREEMPTED_EXIT_CODE  # torchrun reports a worker's 75 as its own failure (1)
    return code


def stopped_with_work_left(run_dir: Path | None, since: str) -> bool:
    """Whether the workers of this launch saved a checkpoint and stopped with work left."""
    status = read_status(run_dir) if run_dir is not None else {}
    return (status.get("state") in ("preempted", "segment done")
            and status.get("updated", "") >= since)
