"""`mpirun -n 2 python -m danastar train ...` trains exactly as torchrun's two workers do: ranks
come from Open MPI's variables (skipped, saying why, where Open MPI's mpirun is missing)."""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from train_helpers import TINY, compared, environment, run_train

RUN = ["--iterations", "12", "checkpoint.latest_every=-1"]
SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mpirun") is None,
                    reason="Open MPI's mpirun is not installed (apt-get install openmpi-bin)")
def test_two_mpirun_ranks_train_as_two_torchrun_workers(tmp_path):
    run_dir = tmp_path / "mpirun"
    env = {**environment(), "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "MASTER_PORT": str(free_port())}  # not the default 29500 another job may hold
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    result = subprocess.run(
        ["mpirun", *root, "--oversubscribe", "-n", "2", "-x", "PYTHONPATH", "-x",
         "OMP_NUM_THREADS", "-x", "MASTER_PORT", sys.executable, "-m", "danastar", "train",
         *TINY, *RUN,
         "--run_dir", str(run_dir)],
        env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 process(es), backend ddp" in result.stdout + result.stderr
    reference = tmp_path / "torchrun"
    assert run_train(RUN, reference, torchrun=2).returncode == 0
    assert compared(run_dir) == compared(reference)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
