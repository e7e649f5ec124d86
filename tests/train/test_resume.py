"""Exact resume after kill -9, preemption by SIGTERM, --iterations_to_run, corrupt checkpoints."""

import os
import random
import shutil
import signal

import pytest

from danastar.rundir.exits import PREEMPTED_EXIT_CODE
from danastar.rundir.status import read_status
from danastar.train.checkpoint import Checkpointer, verify

from train_helpers import (
    assert_ok,
    compared,
    last_step,
    metrics,
    run_train,
    start_train,
    wait_for_step,
)

RUN = ("--iterations", "40", "checkpoint.latest_every=3")


def kill_and_resume(tmp_path, torchrun=0, extra=()):
    """Kill -9 the whole process tree at a random step, then run the same command again."""
    run_dir = tmp_path / "run"
    args = [*RUN, *extra]
    process = start_train(args, run_dir, torchrun)
    kill_step = random.Random().randint(6, 25)
    wait_for_step(process, run_dir, kill_step)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    killed_at = last_step(run_dir)
    assert killed_at < 40, "the run finished before it could be killed"
    resumed = run_train(args, run_dir, torchrun)
    assert_ok(resumed)
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "resumed from" in log, log
    return run_dir, killed_at


def test_kill_9_then_auto_resume_is_bitwise_identical(tmp_path, reference_runs):
    run_dir, _ = kill_and_resume(tmp_path)
    assert compared(run_dir) == compared(reference_runs(RUN))


@pytest.mark.slow
def test_kill_9_then_auto_resume_is_bitwise_identical_with_ddp(tmp_path, reference_runs):
    run_dir, _ = kill_and_resume(tmp_path, torchrun=2)
    assert compared(run_dir) == compared(reference_runs(RUN, torchrun=2))


@pytest.mark.slow
def test_fsdp_resume_matches_within_rounding(tmp_path, reference_runs):
    fsdp = ("--distributed_backend", "fsdp")
    run_dir, _ = kill_and_resume(tmp_path, torchrun=2, extra=fsdp)
    reference = compared(reference_runs((*RUN, *fsdp), torchrun=2))
    resumed = compared(run_dir)
    assert [(step, key) for step, key, _ in resumed] == [(step, key) for step, key, _ in reference]
    for (step, key, got), (_, _, expected) in zip(resumed, reference):
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), (step, key)
    assert (
        "dcp"
        in (
            run_dir / "checkpoints" / sorted(os.listdir(run_dir / "checkpoints"))[-1] / "meta.json"
        ).read_text()
    )


@pytest.mark.slow
def test_fsdp_checkpoints_staged_on_slurm_tmpdir_are_published_complete_and_resume(
    tmp_path, monkeypatch, reference_runs
):
    fsdp = ("--distributed_backend", "fsdp")
    reference = compared(reference_runs((*RUN, *fsdp), torchrun=2))
    node = tmp_path / "node"
    monkeypatch.setenv("SLURM_TMPDIR", str(node))  # both ranks share this "node-local" disk
    run_dir = tmp_path / "run"
    # Work is left: the workers exit 75, which bare torchrun reports as its own failure.
    assert run_train([*RUN, *fsdp, "--iterations_to_run", "20"], run_dir, torchrun=2).returncode
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest-00000018", "latest-00000020"]
    for path in checkpoints.iterdir():
        meta, problem = verify(path)
        assert meta is not None, (path, problem)
        assert meta["layout"] == "dcp" and {".metadata", "run_state.pt"} <= set(meta["files"])
        assert (
            len([name for name in meta["files"] if name.endswith(".distcp")]) >= 2
        )  # both ranks' shards
    assert node.is_dir() and not [
        p for p in node.rglob("*") if p.is_file()
    ]  # staged copies removed
    assert_ok(run_train([*RUN, *fsdp], run_dir, torchrun=2))
    assert "resumed from" in (run_dir / "logs" / "rank0.log").read_text()
    assert "at step 20" in (run_dir / "logs" / "rank0.log").read_text()
    resumed = compared(run_dir)
    assert [(step, key) for step, key, _ in resumed] == [(step, key) for step, key, _ in reference]
    for (step, key, got), (_, _, expected) in zip(resumed, reference):
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), (step, key)


def test_sigterm_saves_a_loadable_checkpoint_and_exits_with_the_preemption_code(
    tmp_path, reference_runs
):
    run_dir = tmp_path / "run"
    args = [*RUN[:2], "checkpoint.latest_every=-1"]  # only the signal writes a checkpoint
    process = start_train(args, run_dir)
    wait_for_step(process, run_dir, 4)
    os.killpg(process.pid, signal.SIGTERM)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == PREEMPTED_EXIT_CODE, output
    assert "SIGTERM" in output and "checkpoint saved" in output
    found = Checkpointer(run_dir / "checkpoints", sharded=False).find_latest()
    assert found is not None and found.step == last_step(run_dir)
    assert_ok(run_train(args, run_dir))  # and the run continues from it to the same end
    assert compared(run_dir) == compared(reference_runs(RUN))


def test_iterations_to_run_stops_cleanly_and_the_chain_continues(tmp_path, reference_runs):
    run_dir = tmp_path / "run"
    for expected_step, code in ((15, PREEMPTED_EXIT_CODE), (30, PREEMPTED_EXIT_CODE), (40, 0)):
        result = run_train([*RUN, "--iterations_to_run", "15"], run_dir)
        assert result.returncode == code, result.stderr[-3000:]  # 0 only when the run is complete
        assert last_step(run_dir) == expected_step
        assert read_status(run_dir)["state"] == ("complete" if code == 0 else "segment done")
    assert compared(run_dir) == compared(reference_runs(RUN))


def test_a_corrupt_latest_checkpoint_is_skipped_with_a_message(tmp_path, reference_runs):
    run_dir = tmp_path / "run"
    # checkpoints at 9 and 10; work is left, so the exit code asks for more
    assert run_train([*RUN, "--iterations_to_run", "10"], run_dir).returncode == PREEMPTED_EXIT_CODE
    newest = sorted((run_dir / "checkpoints").iterdir())[-1]
    assert newest.name == "latest-00000010"
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[:-10])  # a truncated write
    result = run_train(list(RUN), run_dir)
    assert_ok(result)
    assert "latest-00000010 is incomplete or corrupt" in result.stdout + result.stderr
    assert "resumed from" in (run_dir / "logs" / "rank0.log").read_text()
    assert "at step 9" in (run_dir / "logs" / "rank0.log").read_text()
    assert compared(run_dir) == compared(reference_runs(RUN))


def test_no_auto_resume_starts_afresh(tmp_path, reference_runs):
    run_dir = tmp_path / "run"
    shutil.copytree(reference_runs(RUN), run_dir)
    assert_ok(run_train([*RUN, "--no_auto_resume"], run_dir))
    assert metrics(run_dir)[0]["step"] == 0 and compared(run_dir) == compared(reference_runs(RUN))


@pytest.mark.slow
def test_sigusr1_to_the_nproc_launcher_reaches_every_worker(tmp_path):
    run_dir = tmp_path / "run"
    process = start_train(
        ["--iterations", "100000", "checkpoint.latest_every=-1", "--nproc", "2"], run_dir
    )
    wait_for_step(process, run_dir, 3)
    # Only the launcher: it creates the stop file, which the workers obey after their step (a
    # forwarded signal would give a slow checkpoint only torchrun's 30 s grace).
    process.send_signal(signal.SIGUSR1)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == PREEMPTED_EXIT_CODE, output
    assert "STOP: checkpoint saved" in output and not (run_dir / "STOP").exists()
    found = Checkpointer(run_dir / "checkpoints", sharded=False).find_latest()
    assert found is not None and found.step == last_step(run_dir)
