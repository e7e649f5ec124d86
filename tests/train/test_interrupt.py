"""Ctrl-C works like SIGTERM (finish the step, save, say how to resume) but exits 130; a second
Ctrl-C stops at once; under --nproc the user reads one message."""

import os
import signal
import time

import pytest

from danastar.rundir.exits import INTERRUPTED_EXIT_CODE
from danastar.train.signals import DUPLICATE_WINDOW_S, PreemptionFlag

from train_helpers import assert_ok, compared, last_step, run_train, start_train, wait_for_step

RUN = ("--iterations", "40", "checkpoint.latest_every=3")  # test_resume's reference run
ONLY_ON_STOP = ("--iterations", "40", "checkpoint.latest_every=-1")  # the stop alone saves


def ctrl_c(process):
    """What a terminal does on Ctrl-C: SIGINT to the whole foreground process group."""
    os.killpg(process.pid, signal.SIGINT)


def test_ctrl_c_saves_says_how_to_resume_and_the_resumed_run_matches(tmp_path, reference_runs):
    run_dir = tmp_path / "run"
    process = start_train(list(ONLY_ON_STOP), run_dir)
    wait_for_step(process, run_dir, 4)
    ctrl_c(process)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == INTERRUPTED_EXIT_CODE, output
    assert "Traceback" not in output
    stopped_at = last_step(run_dir)
    assert f"Ctrl-C: checkpoint saved at step {stopped_at}; to resume, run the same command " \
           "again." in output
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == [f"latest-{stopped_at:08d}"]
    resumed = run_train(list(ONLY_ON_STOP), run_dir)
    assert_ok(resumed)
    assert f"at step {stopped_at}" in resumed.stdout
    assert compared(run_dir) == compared(reference_runs(RUN))  # as if never interrupted


def test_ctrl_c_before_training_starts_exits_130_without_a_traceback(tmp_path):
    process = start_train(list(ONLY_ON_STOP), tmp_path / "run")
    time.sleep(1.0)  # Python is up, still importing or preparing
    ctrl_c(process)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == INTERRUPTED_EXIT_CODE, output
    assert "Traceback" not in output and "Ctrl-C" in output


def test_a_second_ctrl_c_stops_at_once_and_a_repeat_of_the_first_does_not():
    flag = PreemptionFlag(announce=False).install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert flag.is_set and flag.interrupted and flag.exit_code == INTERRUPTED_EXIT_CODE
        os.kill(os.getpid(), signal.SIGINT)  # the same Ctrl-C delivered twice (group + launcher)
        time.sleep(DUPLICATE_WINDOW_S + 0.1)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs here at the latest
    finally:
        flag.uninstall()


@pytest.mark.slow
def test_a_second_ctrl_c_in_a_running_train_stops_at_once_and_the_run_resumes(tmp_path):
    # Slow steps (an evaluation of many batches after each), so that the second Ctrl-C comes
    # before the step the first one waits for has ended.
    args = ["--iterations", "8", "checkpoint.latest_every=2", "--eval_interval", "1",
            "train.eval_batches=300"]
    run_dir = tmp_path / "run"
    process = start_train(args, run_dir)
    wait_for_step(process, run_dir, 3)
    ctrl_c(process)
    time.sleep(DUPLICATE_WINDOW_S + 0.3)
    ctrl_c(process)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == INTERRUPTED_EXIT_CODE, output
    assert "Ctrl-C: stopped at once" in output and "Traceback" not in output, output
    resumed = run_train(args, run_dir)  # nothing half-written is taken for a checkpoint
    assert_ok(resumed)
    assert "resumed from" in resumed.stdout and last_step(run_dir) == 8


def test_sigterm_still_means_preempted():
    flag = PreemptionFlag(announce=False).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.is_set and not flag.interrupted and flag.exit_code == 75
    finally:
        flag.uninstall()


@pytest.mark.slow
def test_ctrl_c_under_nproc_gives_one_message_and_exit_130(tmp_path):
    run_dir = tmp_path / "run"
    process = start_train([*ONLY_ON_STOP, "--iterations", "100000", "--nproc", "2"], run_dir)
    wait_for_step(process, run_dir, 3)
    ctrl_c(process)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == INTERRUPTED_EXIT_CODE, output
    assert output.count("Ctrl-C: checkpoint saved at step") == 1, output
    assert output.count("Ctrl-C: finishing this step") == 1, output
    assert "Traceback" not in output and "ChildFailedError" not in output, output
    assert (run_dir / "checkpoints" / f"latest-{last_step(run_dir):08d}").is_dir()


def test_the_launcher_reports_the_workers_own_exit_code():
    from types import SimpleNamespace

    from danastar.launch.local import workers_exit_code

    def failures(**codes):
        return {int(rank[1:]): SimpleNamespace(exitcode=code) for rank, code in codes.items()}

    assert workers_exit_code(failures(r0=130, r1=130)) == 130
    assert workers_exit_code(failures(r0=130, r1=-15)) == 130  # stopped by the agent after rank 0
    assert workers_exit_code(failures(r0=2, r1=2)) == 2  # a user error rank 0 printed
    assert workers_exit_code(failures(r1=1, r0=-15)) == 1  # a crash: the crashed worker's code
