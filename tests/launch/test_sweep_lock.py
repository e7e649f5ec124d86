"""Two `danastar sweep` processes of one sweep file do not race over its runs: the one that comes
second is refused, naming the first, while each run holds its own run directory's lock."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from danastar.rundir.exits import PREEMPTED_EXIT_CODE

from train_helpers import environment

BASE = {"data.dataset": "synthetic", "model.heads": 2, "train.batch_size": 4,
        "train.sequence_length": 32, "train.iterations": 100000, "train.eval_interval": 50,
        "train.eval_batches": 2, "train.sample_tokens": 0}  # stopped by the test


def sweep_command(spec):
    return [sys.executable, "-m", "danastar", "sweep", str(spec), "--runs_root",
            str(spec.parent / "runs")]


def holder(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.slow
def test_a_second_sweep_of_the_same_file_is_refused_naming_the_first(tmp_path):
    spec = tmp_path / "long.yaml"
    spec.write_text(json.dumps({"name": "long", "base": BASE, "grid": {"optim.name": ["adamw"]}}))
    root, run_dir = tmp_path / "runs" / "long", tmp_path / "runs" / "long" / "adamw"
    first = subprocess.Popen(sweep_command(spec), env=environment(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while holder(run_dir / ".lock").get("command") != "danastar train":  # its run has begun
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the sweep's run did not start"
            time.sleep(0.2)
        assert holder(root / ".lock")["pid"] == first.pid
        # (a second sweep that trained would stop after a step: it would not wait for 100000)
        second = subprocess.run([*sweep_command(spec), "train.iterations_to_run=1"],
                                env=environment(), capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stdout + second.stderr
        message = second.stderr.strip()
        assert message.startswith(f"danastar sweep: {root} is in use by danastar sweep (pid "
                                  f"{first.pid} on host "), message
        assert message.endswith("; wait for it to end or use another --runs_root."), message
        assert first.poll() is None
    finally:
        os.killpg(first.pid, signal.SIGTERM)  # the sweep stops its run, which saves and stops
        first.communicate(timeout=300)
    assert first.returncode == PREEMPTED_EXIT_CODE
