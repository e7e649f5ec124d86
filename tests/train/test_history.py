"""Never lose history: --no_auto_resume moves the old run aside, unusable checkpoints refuse
rather than restart, a corrupt-* left by an earlier resume does not block, a full disk keeps the
last good checkpoint."""

import errno
import io
import shutil

import pytest
import torch

from danastar.errors import UserError
from danastar.rundir.metrics import records as read_metrics
from danastar.train.checkpoint import Checkpointer

from train_helpers import (
    STOPPED_RUN,
    assert_stopped_with_work_left,
    last_step,
    metrics,
    run_train,
)


@pytest.fixture
def run_dir(stopped_run, tmp_path):
    """A copy of the shared run stopped at step 4 of 12 (checkpoints at steps 2 and 4)."""
    run_dir = tmp_path / "run"
    shutil.copytree(stopped_run["run_dir"], run_dir)
    return run_dir


@pytest.fixture
def args(stopped_run):
    return ("--dataset", str(stopped_run["data"]), *STOPPED_RUN)


def test_no_auto_resume_moves_the_old_run_aside_and_the_next_start_resumes_the_new_one(
        run_dir, args):
    old_metrics = metrics(run_dir)
    result = run_train([*args, "--no_auto_resume", "--iterations_to_run", "2"], run_dir)
    assert_stopped_with_work_left(result)
    [aside] = run_dir.glob("previous-*")
    assert f"moved the earlier run in {run_dir} to {aside}" in result.stdout
    assert metrics(aside) == old_metrics
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == [
        "latest-00000002", "latest-00000004"]
    assert {"config.yaml", "plan.json", "run.json", "logs"} <= {p.name for p in aside.iterdir()}
    # the new run: its own metrics from step 0, its own checkpoints only
    assert metrics(run_dir)[0]["step"] == 0 and last_step(run_dir) == 2
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["latest-00000002"]
    resumed = run_train([*args, "--iterations_to_run", "2"], run_dir)
    assert_stopped_with_work_left(resumed)
    assert "at step 2" in resumed.stdout and last_step(run_dir) == 4  # the new run, not the old


def test_when_every_checkpoint_is_unusable_the_run_refuses_and_names_them(run_dir, args):
    for checkpoint in (run_dir / "checkpoints").iterdir():
        state = checkpoint / "state.pt"
        state.write_bytes(state.read_bytes()[:-10])
    old_metrics = metrics(run_dir)
    result = run_train(list(args), run_dir)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    for name in ("latest-00000002", "latest-00000004"):
        assert f"{name} (state.pt does not match its checksum)" in result.stderr
        assert (run_dir / "checkpoints" / name).is_dir()  # left where they were
    assert "--no_auto_resume" in result.stderr
    assert metrics(run_dir) == old_metrics  # nothing restarted at step 0


def test_a_corrupt_checkpoint_set_aside_earlier_does_not_block_resuming(run_dir, args):
    checkpoints = run_dir / "checkpoints"
    (checkpoints / "corrupt-latest-00000004").mkdir()  # the same step failed once before
    state = checkpoints / "latest-00000004" / "state.pt"
    state.write_bytes(state.read_bytes()[:-10])
    result = run_train([*args, "--iterations_to_run", "2"], run_dir)
    assert_stopped_with_work_left(result)
    assert "moved it to corrupt-latest-00000004-2" in result.stdout
    assert "at step 2" in result.stdout and last_step(run_dir) == 4
    # the lines of steps 3-4 that the corrupt checkpoint described were kept aside, not lost
    superseded = run_dir / "metrics-superseded.jsonl"
    assert sorted({line["step"] for line in read_metrics(superseded)}) == [3, 4]


def test_a_full_disk_says_so_removes_its_partial_copy_and_keeps_the_last_good_checkpoint(
        tmp_path, monkeypatch):
    # A full disk cannot be made safely everywhere the tests run: here the checkpoint file's
    # writes fail part way with ENOSPC, as they do on a full disk (checked on a small tmpfs).
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpointer = Checkpointer(tmp_path, sharded=False)
    checkpointer.save(2, model, optimizer, {"step": 2})
    real_open = open

    class FullDisk(io.FileIO):
        written = 0

        def write(self, data):
            if self.written > 1000:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.written += len(data)
            return super().write(data)

    def open_on_a_full_disk(path, mode="r", *args, **kwargs):
        if str(path).endswith("state.pt") and "w" in mode:
            return io.BufferedWriter(FullDisk(path, "w"), buffer_size=256)
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", open_on_a_full_disk)
    with pytest.raises(UserError, match=f"no space left in {tmp_path}") as error:
        checkpointer.save(4, model, optimizer, {"step": 4})
    monkeypatch.undo()
    assert "latest-00000002 is kept" in str(error.value)
    assert not list(tmp_path.glob(".tmp-*"))  # the partial copy is gone
    assert [p.name for p in checkpointer.checkpoints()] == ["latest-00000002"]
    assert checkpointer.find_latest().step == 2


def test_a_disk_too_full_for_the_next_checkpoint_is_refused_before_training(tmp_path,
                                                                          monkeypatch):
    # Before, a resume on a full disk trained until its first save, which failed and cost every
    # step since. As above, the full disk is what the file system reports (checked by hand on a
    # full tmpfs: the resume refused with this sentence and left the run directory as it was).
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpointer = Checkpointer(tmp_path / "checkpoints", sharded=False)
    checkpointer.save(2, model, optimizer, {"step": 2})
    checkpointer.check_space()  # this disk has room
    size = sum(p.stat().st_size for p in (tmp_path / "checkpoints").rglob("*") if p.is_file())
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=size - 1))
    with pytest.raises(UserError) as refused:
        checkpointer.check_space()
    assert str(refused.value) == (
        f"no space left in {tmp_path / 'checkpoints'}: {(size - 1) / 2**20:.1f} MiB free, and "
        f"the next checkpoint needs about {size / 2**20:.1f} MiB (the size of latest-00000002); "
        "free some space and run the same command again (nothing was written).")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=0))
    with pytest.raises(UserError, match=r"no space left in .*: 0.0 MiB free; free some space"):
        Checkpointer(tmp_path / "fresh" / "checkpoints", sharded=False).check_space()
