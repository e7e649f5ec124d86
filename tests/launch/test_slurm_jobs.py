"""`danastar submit` against a real SLURM started by the tests: job chains by requeue, USR1 before
the time limit, job arrays from sweep files, ranks from srun. Every run must end with exactly the
losses of an uninterrupted local run (or, with two processes, of torchrun's two workers)."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from danastar.rundir.status import read_status

from local_slurm import LocalSlurm
from train_helpers import TINY, compared, environment, last_step, run_train

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SRC = str(Path(__file__).resolve().parents[2] / "src")
RUN = ["--iterations", "12", "checkpoint.latest_every=-1"]
LONGER = ["--iterations", "40", "checkpoint.latest_every=-1"]  # time to signal it mid-run


def submit(slurm, args, cwd, expect_ok=True, env=None) -> subprocess.CompletedProcess:
    env = {**environment(), "SLURM_CONF": slurm.env["SLURM_CONF"],
           "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    result = subprocess.run([sys.executable, "-m", "danastar", "submit", *args], env=env,
                            cwd=cwd, capture_output=True, text=True, timeout=120)
    if expect_ok:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def job_id(result) -> str:
    first = result.stdout.splitlines()[0]
    assert first.startswith("submitted job "), result.stdout
    return first.split()[2]


def segment_log(run_dir: Path) -> str:
    return "".join(path.read_text() for path in sorted((run_dir / "logs").glob("*.out")))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The losses of uninterrupted local runs, which the SLURM runs must equal."""
    cache = {}

    def get(args, torchrun=0):
        key = (tuple(args), torchrun)
        if key not in cache:
            run_dir = tmp_path_factory.mktemp("reference") / "run"
            result = run_train(list(args), run_dir, torchrun=torchrun)
            assert result.returncode == 0, result.stderr[-3000:]
            cache[key] = compared(run_dir)
        return cache[key]

    return get


def test_a_chain_of_three_segments_requeues_the_same_job_and_equals_an_uninterrupted_run(
        slurm, tmp_path, reference):
    run_dir = tmp_path / "run"
    started = time.monotonic()
    job = job_id(submit(slurm, [*TINY, *RUN, "--iterations_to_run", "4", "--time", "30",
                                "--run_dir", str(run_dir)], tmp_path))
    fields = slurm.wait_job(job, timeout=240)
    elapsed = time.monotonic() - started
    log = segment_log(run_dir)
    assert fields["JobState"] == "COMPLETED", log
    assert fields["Restarts"] == "2"  # three segments, one job id
    assert [f"segment {i} of" in log for i in range(3)] == [True] * 3, log
    assert log.count("requeueing job") == 2 and "the run is complete" in log
    status = read_status(run_dir)
    assert status["state"] == "complete" and status["step"] == 12 and status["job_id"] == job
    assert status["restarts"] == 2
    assert compared(run_dir) == reference(RUN)
    print(f"3-segment chain: {elapsed:.1f} s")  # the measured time the docs quote


def wait_for_progress(run_dir, step, timeout=120):
    deadline = time.monotonic() + timeout
    while last_step(run_dir) < step:
        assert time.monotonic() < deadline, segment_log(run_dir)
        time.sleep(0.05)


def test_usr1_and_an_external_requeue_checkpoint_requeue_and_resume_exactly(
        slurm, tmp_path, reference):
    run_dir = tmp_path / "run"
    job = job_id(submit(slurm, [*TINY, *LONGER, "--time", "30", "--run_dir", str(run_dir)],
                        tmp_path))
    # 1. What SLURM does --signal_lead seconds before the time limit (B: the batch shell only):
    # the script creates the stop file, the run checkpoints, exits 75, the job requeues itself.
    wait_for_progress(run_dir, 2)
    signalled = slurm.run("scancel", "--signal=USR1", "--batch", job)
    assert signalled.returncode == 0, signalled.stderr
    deadline = time.monotonic() + 120
    while "resumed from" not in segment_log(run_dir):
        assert time.monotonic() < deadline, segment_log(run_dir)
        time.sleep(0.05)
    # 2. An external requeue: SLURM sends SIGTERM to the job's processes, and the workers save
    # within KillWait; SLURM starts the job again.
    stopped_at = read_status(run_dir)["step"]
    wait_for_progress(run_dir, stopped_at + 2)
    requeued = slurm.run("scontrol", "requeue", job)
    assert requeued.returncode == 0, requeued.stderr
    fields = slurm.wait_job(job, timeout=180)
    log = segment_log(run_dir)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "2", log
    assert "USR1 (time nearly up)" in log and "STOP: checkpoint saved at step" in log
    assert "SIGTERM: checkpoint saved at step" in log and log.count("resumed from") == 2
    assert not (run_dir / "STOP").exists()
    assert compared(run_dir) == reference(LONGER)


def test_a_job_array_from_a_sweep_file_trains_each_run_in_its_own_directory(slurm, tmp_path):
    sweep = tmp_path / "seeds.yaml"
    sweep.write_text("name: seeds\nbase: {train.iterations: 6}\ngrid:\n  train.seed: [0, 1]\n")
    result = submit(slurm, [*TINY, "--array", str(sweep), "--time", "30",
                            "--runs_root", str(tmp_path / "runs")], tmp_path)
    job = job_id(result)
    root = tmp_path / "runs" / "seeds"
    for task in (0, 1):
        fields = slurm.wait_job(f"{job}_{task}", timeout=180)
        assert fields["JobState"] == "COMPLETED", segment_log(root)
    runs = sorted(path.name for path in root.iterdir() if (path / "status.json").exists())
    assert runs == ["s0", "s1"]
    for seed in (0, 1):
        status = read_status(root / f"s{seed}")
        assert status["state"] == "complete" and status["job_id"] == f"{job}_{seed}"
        config = json.loads((root / f"s{seed}" / "slurm" / "plan.json").read_text())["config"]
        assert config["train"]["seed"] == seed
    assert compared(root / "s0") != compared(root / "s1")


def test_a_dependency_chain_continues_through_presubmitted_successors(slurm, tmp_path,
                                                                       reference):
    run_dir = tmp_path / "run"
    first = job_id(submit(slurm, [*TINY, *RUN, "--iterations_to_run", "6", "--time", "30",
                                  "--chain", "dependency", "--run_dir", str(run_dir)], tmp_path))
    deadline = time.monotonic() + 240
    while read_status(run_dir).get("state") != "complete" or slurm.run(
            "squeue", "-h", "-o", "%i").stdout.strip():
        assert time.monotonic() < deadline, segment_log(run_dir)
        time.sleep(0.5)
    log = segment_log(run_dir)
    jobs = [first] + [line.split()[3] for line in log.splitlines()
                      if line.startswith("danastar: successor job") and line.endswith("submitted")]
    assert len(jobs) == 3, log  # segment 0, segment 1 (completes), a successor with nothing to do
    assert "the run is complete; nothing to do" in log and "requeueing" not in log
    assert [slurm.job(j)["JobState"] for j in jobs] == ["COMPLETED"] * 3
    assert compared(run_dir) == reference(RUN)


@pytest.fixture(scope="module")
def two_nodes(munge):
    """A cluster of two simulated nodes on this machine (two slurmd, own ports), named so that
    both names resolve here: the master address comes from the job's node list."""
    cluster = LocalSlurm(munge.directory.parent / "two-nodes", munge, name="twonodes",
                         nodes=(socket.gethostname(), "localhost"))
    yield cluster
    cluster.stop()


def test_a_two_node_job_trains_as_two_torchrun_workers(two_nodes, tmp_path, reference):
    run_dir = tmp_path / "run"
    job = job_id(submit(two_nodes, [*TINY, *RUN, "--nodes", "2", "--time", "30",
                                    "--run_dir", str(run_dir)], tmp_path))
    fields = two_nodes.wait_job(job, timeout=180)
    log = segment_log(run_dir)
    assert fields["JobState"] == "COMPLETED" and fields["NumNodes"] == "2", log
    assert "2 process(es), backend ddp" in log
    assert compared(run_dir) == reference(RUN, torchrun=2)


def test_torchrun_per_node_trains_as_two_torchrun_workers(two_nodes, tmp_path, reference):
    run_dir = tmp_path / "run"
    job = job_id(submit(two_nodes, [*TINY, *RUN, "--nodes", "2", "--launcher", "torchrun",
                                    "--time", "30", "--run_dir", str(run_dir)], tmp_path))
    fields = two_nodes.wait_job(job, timeout=180)
    log = segment_log(run_dir)
    assert fields["JobState"] == "COMPLETED", log
    assert "2 process(es), backend ddp" in log
    assert compared(run_dir) == reference(RUN, torchrun=2)
