"""`danastar train --nproc N`: run real torchrun on this machine with the same arguments.

torchrun starts N workers, each running `python -m danastar train <the same arguments>`; a worker
sees torchrun's WORLD_SIZE and trains instead of launching again. SIGTERM and SIGUSR1 sent to
this process are passed on to torchrun, which forwards them to the workers; they save a
checkpoint and stop, and this process then exits with `PREEMPTED_EXIT_CODE`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from danastar.train.signals import PREEMPTED_EXIT_CODE, PREEMPTION_SIGNALS

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


def launch(nproc: int, train_argv: list[str]) -> int:
    """Run torchrun with `nproc` workers; returns its exit code (or the preemption code)."""
    process = subprocess.Popen(torchrun_command(nproc, train_argv))
    preempted = []

    def forward(signum, _frame):
        preempted.append(signum)
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
    return PREEMPTED_EXIT_CODE if preempted else code
