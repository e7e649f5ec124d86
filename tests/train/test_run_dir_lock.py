"""One live run per run directory: a second `danastar train` there (resuming, or starting afresh
with --no_auto_resume) is refused naming the live one, and touches none of its files; `kill -9`
leaves no lock behind; under `--nproc` and torchrun one message, and every process exits 2."""

import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from danastar.rundir.lock import hold

from train_helpers import (
    TINY,
    assert_stopped_with_work_left,
    environment,
    last_step,
    metrics,
    run_train,
    start_train,
    wait_for_step,
)

LONG = ["--iterations", "100000", "checkpoint.latest_every=2"]  # stopped by the test


def in_use_by(pid: int) -> str:
    return f"is in use by danastar train (pid {pid} on host {socket.gethostname()}, since "


@pytest.mark.slow
def test_a_second_run_in_a_live_directory_is_refused_and_the_live_one_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    first = start_train(LONG, run_dir)
    try:
        wait_for_step(first, run_dir, 3)
        # resuming it, or moving it aside to start afresh with other settings
        for extra in ([], ["--no_auto_resume", "--lr", "1e-3"]):
            second = run_train([*LONG, *extra, "--iterations_to_run", "1"], run_dir)
            assert second.returncode == 2, second.stdout + second.stderr
            lines = second.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(
                f"danastar train: {run_dir} {in_use_by(first.pid)}"), second.stderr
            assert lines[0].endswith("; wait for it to end or use another --run_dir.")
        assert first.poll() is None  # still training, in its own files
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the lock goes with the process
        first.wait()
    assert not list(run_dir.glob("previous-*"))
    steps = [m["step"] for m in metrics(run_dir) if "train_loss" in m]
    assert steps == list(range(1, len(steps) + 1))  # one run's history, never restarted
    resumed = run_train([*LONG, "--iterations_to_run", "2"], run_dir)
    assert_stopped_with_work_left(resumed)
    at = re.search(r"resumed from \S+ at step (\d+)", resumed.stdout)
    assert at and int(at.group(1)) >= 2, resumed.stdout
    assert last_step(run_dir) == int(at.group(1)) + 2


@pytest.mark.slow
def test_under_nproc_and_torchrun_the_refusal_is_one_message_and_exit_2(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with hold(run_dir, "danastar train", ""):  # this process stands for a live run
        # `--nproc 2`: the launcher looks before it starts torchrun
        launched = run_train(["--iterations", "4", "--nproc", "2"], run_dir)
        # torchrun's workers (as srun's or mpirun's would): rank 0 takes the lock and is refused;
        # the other rank learns it, and the agent reports the workers' own exit code
        command = [sys.executable, "-m", "danastar.launch.local", "--standalone",
                   "--nproc_per_node=2", "-m", "danastar", "train", *TINY, "--iterations", "4",
                   "--run_dir", str(run_dir)]
        workers = subprocess.run(command, env=environment(), capture_output=True, text=True,
                                 timeout=300)
    for result in (launched, workers):
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.count(in_use_by(os.getpid())) == 1, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
    assert sorted(path.name for path in run_dir.iterdir()) == [".lock"]  # nothing written
