"""The stop file: `touch <run_dir>/STOP` stops a run like SIGUSR1 (checkpoint, exit 75), and the
run continues from there to the uninterrupted run's losses."""

import pytest

from danastar.rundir.exits import PREEMPTED_EXIT_CODE
from danastar.rundir.status import read_status

from train_helpers import assert_ok, compared, last_step, run_train, start_train, wait_for_step

RUN = ("--iterations", "40", "checkpoint.latest_every=3")


def test_the_stop_file_checkpoints_exits_75_and_the_run_resumes_exactly(tmp_path, reference_runs):
    run_dir = tmp_path / "run"
    args = [*RUN[:2], "checkpoint.latest_every=-1"]  # only the stop writes a checkpoint
    process = start_train(args, run_dir)
    wait_for_step(process, run_dir, 3)
    (run_dir / "STOP").touch()
    output = process.communicate(timeout=120)[0]
    assert process.returncode == PREEMPTED_EXIT_CODE, output
    assert "STOP: checkpoint saved at step" in output
    assert not (run_dir / "STOP").exists()  # consumed: the next segment runs
    status = read_status(run_dir)
    assert status["state"] == "preempted" and status["step"] == last_step(run_dir) < 40
    assert status["exit_code"] == PREEMPTED_EXIT_CODE
    assert_ok(run_train(args, run_dir))
    assert read_status(run_dir)["state"] == "complete"
    assert compared(run_dir) == compared(reference_runs(RUN))


@pytest.mark.slow
def test_nproc_reports_75_while_work_remains_and_0_when_complete(tmp_path):
    # torchrun turns a worker's 75 into its own failure (1); the launcher reads status.json.
    run_dir = tmp_path / "run"
    args = ["--iterations", "12", "checkpoint.latest_every=-1", "--nproc", "2"]
    first = run_train([*args, "--iterations_to_run", "6"], run_dir)
    assert first.returncode == PREEMPTED_EXIT_CODE, first.stderr[-3000:]
    assert read_status(run_dir)["state"] == "segment done"
    assert_ok(run_train([*args, "--iterations_to_run", "6"], run_dir))
    assert read_status(run_dir)["state"] == "complete" and last_step(run_dir) == 12
