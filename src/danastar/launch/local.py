"""`danastar train --nproc N`: run real torchrun on this machine with the same arguments.

torchrun starts N workers, each running `python -m danastar train <the same arguments>`; a worker
sees torchrun's WORLD_SIZE and trains instead of launching again.

torchrun's elastic agent runs in a child process of this one (`python -m danastar.launch.local`,
`torchrun_main`), in a session of its own so that a terminal's Ctrl-C reaches this process only;
torchrun starts each worker in a session of its own too. Signals therefore take one path each,
and every worker sees each of them exactly once:

* SIGTERM and SIGUSR1 (preemption) create the run's stop file instead of being passed on: the
  workers save a checkpoint after their step and stop however long the save takes (torchrun
  would kill them 30 s after forwarding a signal), and exit with `PREEMPTED_EXIT_CODE`. Without
  a run directory they go to the agent, which forwards them to the workers.
* SIGINT (Ctrl-C) goes to the agent, which passes it to each worker itself (torchrun would treat it
  as a reason to shut down): the first makes the workers finish the step, save and exit 130;
  a second stops them at once, also with 130. Rank 0 alone speaks.

The agent reports the workers' own exit code (2 for a user error that rank 0 printed, 130 after
Ctrl-C) instead of torchrun's error report and traceback, so the user reads one message. If this
process dies, the agent is sent SIGTERM (Linux), so the workers save and stop instead of running on.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

from danastar.launch.allocator import with_huge_pages
from danastar.rundir.exits import (
    EXPLAINED_EXIT_CODES,
    INTERRUPTED_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    PREEMPTION_SIGNALS,
    STOP_SIGNALS,
)
from danastar.rundir.status import request_stop

# The agent forwards these to the workers itself; SIGINT is handled by `torchrun_main`.
FORWARDED_SIGNALS = "SIGTERM,SIGHUP,SIGQUIT,SIGUSR1"


def under_torchrun() -> bool:
    """True inside a worker that torchrun (or SLURM's srun with torchrun's variables) started."""
    return "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def is_main_process() -> bool:
    """Rank 0, or a process that is not a torchrun worker: the one that talks to the user."""
    return os.environ.get("RANK", "0") == "0"


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


def torchrun_arguments(nproc: int, train_argv: list[str]) -> list[str]:
    return [
        "--standalone",  # one machine, rendezvous on a free port
        f"--nproc_per_node={nproc}",
        f"--signals_to_handle={FORWARDED_SIGNALS}",
        "-m", "danastar", "train", *worker_argv(train_argv),
    ]


def torchrun_command(nproc: int, train_argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "danastar.launch.local",
            *torchrun_arguments(nproc, train_argv)]


def launch(nproc: int, train_argv: list[str], run_dir: Path | None = None) -> int:
    """Run torchrun with `nproc` workers; returns the workers' exit code (see the module)."""
    process = subprocess.Popen(torchrun_command(nproc, train_argv), start_new_session=True,
                               preexec_fn=prepare_agent, env=with_huge_pages(dict(os.environ)))

    def forward(signum, _frame):
        if signum != signal.SIGINT and run_dir is not None and Path(run_dir).is_dir():
            request_stop(run_dir)  # the workers stop after their step and save
        else:
            process.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        return process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def prepare_agent() -> None:
    """In the agent's process before it starts: Ctrl-C ignored until `torchrun_main` handles it
    (one arriving while Python imports would end in a traceback), and (Linux) SIGTERM when the
    launching process dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the agent outlives a killed launcher
        pass


# ----------------------------------------------------------------------------------------------
# The torchrun agent's process


def children() -> list[int]:
    """Process ids of this process's children (the workers), from /proc (Linux): each thread's
    `children` list, or where the kernel does not provide it, every process's parent id."""
    pids: list[int] = []
    listed = False
    for task in Path("/proc/self/task").glob("*"):
        try:
            pids += [int(pid) for pid in (task / "children").read_text().split()]
            listed = True
        except OSError:
            continue
    if listed:
        return pids
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # pid (name) state ppid ...: the name may hold spaces, so split after its ')'
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid():
            pids.append(int(stat.parent.name))
    return pids


def pass_ctrl_c_to_workers(signum, _frame) -> None:
    workers = children()
    if not workers:  # before torchrun has started them: stop here
        raise KeyboardInterrupt
    for pid in workers:
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            pass


def torchrun_main(arguments: list[str]) -> int:
    """torchrun's agent with `arguments`; returns the workers' exit code rather than raising
    torchrun's report (each worker has already said what went wrong)."""
    # The agent's warnings while workers stop ("Sending process ... closing signal") and its
    # failure report repeat what the workers said; a worker's own traceback still shows.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    signal.signal(signal.SIGINT, pass_ctrl_c_to_workers)
    try:
        run(parse_args(arguments))
    except SignalException as stop:  # SIGTERM/SIGUSR1/...: forwarded, the workers have stopped
        return PREEMPTED_EXIT_CODE if stop.sigval in PREEMPTION_SIGNALS else 128 + stop.sigval
    except ChildFailedError as failed:
        return workers_exit_code(failed.failures)
    except KeyboardInterrupt:
        print("\nCtrl-C: stopped before training started.", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    return 0


def workers_exit_code(failures: dict) -> int:
    """One exit code for the failed workers. Workers stopped by a signal (the agent stops the rest
    once one fails) do not count while any exited by itself: the code those share when it is one
    of ours, else the lowest rank's. A code that is not ours gets a line (the worker printed its
    traceback)."""
    codes = {rank: failure.exitcode for rank, failure in failures.items()}
    own = {rank: code for rank, code in codes.items() if code >= 0} or codes
    if len(set(own.values())) == 1 and set(own.values()) <= set(EXPLAINED_EXIT_CODES):
        return next(iter(own.values()))
    rank = min(own)
    code = own[rank]
    if code not in EXPLAINED_EXIT_CODES:
        print(f"danastar train: worker rank {rank} failed with exit code {code} (its error is "
              f"above).", file=sys.stderr)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    raise SystemExit(torchrun_main(sys.argv[1:]))
