"""A run directory belongs to one run: a resume with settings that change the trajectory is
refused before anything is loaded, listing each change; settings that do not are accepted and
recorded in run.json."""

import json
import shutil
import subprocess
import sys

import pytest

from train_helpers import assert_ok, environment, last_step, metrics, run_train

BASE = ("--iterations", "12", "checkpoint.latest_every=2")


def prepare(root, name, seed):
    """A small prepared dataset (bytes tokenizer) of random words."""
    import random

    texts = root / f"{name}-text"
    texts.mkdir()
    words = "the of and to in is was that for on with as by at from his her it be are".split()
    rng = random.Random(seed)
    for index in range(12):
        (texts / f"doc{index}.txt").write_text(" ".join(rng.choice(words) for _ in range(2000)))
    out = root / name
    result = subprocess.run(
        [sys.executable, "-m", "danastar", "prepare", str(texts), "--out", str(out),
         "--tokenizer", "bytes", "--workers", "1", "--no_progress", "--val_fraction", "0.2"],
        env=environment(), capture_output=True, text=True, timeout=120)
    assert_ok(result)
    return out


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """One run stopped at step 4 of 12 (checkpoints at 2 and 4), shared by the cases below: a
    refusal happens before anything is loaded or written, so each case reuses it as it is."""
    root = tmp_path_factory.mktemp("identity")
    data = prepare(root, "data", seed=0)
    run_dir = root / "run"
    assert_ok(run_train(["--dataset", str(data), *BASE, "--iterations_to_run", "4"], run_dir))
    assert last_step(run_dir) == 4
    return {"root": root, "data": data, "run_dir": run_dir}


def listing(run_dir):
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))


@pytest.mark.parametrize("flags, change", [
    (["--lr", "1e-3"], "lr: 0.003 → 0.001"),
    (["--seed", "1"], "seed: 0 → 1"),
    (["--batch_size", "8"], "batch_size: 4 → 8"),
    (["--opt", "adamw"], "opt: adana → adamw"),
    (["--heads", "3"], "heads: 2 → 3"),
    (["--kappa", "0.9"], "kappa: 0.85 → 0.9"),
    (["--dataset", "OTHER"], "dataset: "),
    # the default cos_inf decays to its floor at the last step: its past depends on the total
    (["--iterations", "24"], "iterations: 12 → 24 (the cos_inf schedule"),
])
def test_a_resume_that_changes_the_trajectory_is_refused_listing_the_change(stopped, flags,
                                                                            change):
    run_dir = stopped["run_dir"]
    if "OTHER" in flags:
        other = stopped["root"] / "other-data"
        if not other.exists():
            prepare(stopped["root"], "other-data", seed=1)
        flags = ["--dataset", str(other)]
    before = listing(run_dir), metrics(run_dir)
    result = run_train(["--dataset", str(stopped["data"]), *BASE, *flags], run_dir)
    assert result.returncode == 2, result.stdout + result.stderr
    message = result.stderr.strip()
    assert "Traceback" not in message and len(message.splitlines()) == 1, message
    assert change in message, message
    assert "another --run_dir" in message and "--no_auto_resume" in message
    assert (listing(run_dir), metrics(run_dir)) == before  # nothing written, moved or loaded


def continue_copy(stopped, tmp_path, flags, name="run"):
    run_dir = tmp_path / name
    shutil.copytree(stopped["run_dir"], run_dir)
    result = run_train(["--dataset", str(stopped["data"]), *BASE, *flags], run_dir)
    assert_ok(result)
    return run_dir, result


def test_settings_that_keep_the_trajectory_may_change_and_are_recorded(stopped, tmp_path):
    # the same data under another path, other logging and evaluation cadence, a shorter chain
    same_data = tmp_path / "same-data"
    shutil.copytree(stopped["data"], same_data)
    run_dir, result = continue_copy(stopped, tmp_path, [
        "--dataset", str(same_data), "--eval_interval", "3", "--log_interval", "2",
        "--iterations_to_run", "2", "checkpoint.latest_every=1"])
    assert "resumed from" in result.stdout and "at step 4" in result.stdout, result.stdout
    assert last_step(run_dir) == 6
    record = json.loads((run_dir / "run.json").read_text())
    assert [start["step"] for start in record["starts"]] == [0, 4]
    changed = " ".join(record["starts"][-1]["changed"])
    assert "train.eval_interval: 5 → 3" in changed and "train.iterations_to_run: 4 → 2" in changed
    assert "(the same data)" in " ".join(record["starts"][-1]["accepted"])


def test_iterations_may_grow_where_the_schedule_does_not_depend_on_them(tmp_path):
    # `none` (and `powerlaw`) give each step the same factor whatever the total; AdamW's weight
    # decay and the warm-up are given, else they would follow from the iterations.
    fixed = ["--opt", "adamw", "--scheduler", "none", "--warmup_steps", "0",
             "optim.weight_decay=0.1"]
    extended, reference = tmp_path / "extended", tmp_path / "reference"
    assert_ok(run_train([*fixed, "--iterations", "6"], extended))
    result = run_train([*fixed, "--iterations", "10"], extended)
    assert_ok(result)
    assert "iterations: 6 → 10" in result.stdout and "resumed from" in result.stdout
    assert_ok(run_train([*fixed, "--iterations", "10"], reference))

    def train_losses(run_dir):
        return [(m["step"], m["train_loss"]) for m in metrics(run_dir) if "train_loss" in m]

    assert train_losses(extended) == train_losses(reference)


def test_an_older_run_directory_is_checked_against_its_checkpoints_plan(stopped, tmp_path):
    run_dir = tmp_path / "old"
    shutil.copytree(stopped["run_dir"], run_dir)
    (run_dir / "run.json").unlink()  # as written before run.json existed
    result = run_train(["--dataset", str(stopped["data"]), *BASE, "--lr", "1e-3"], run_dir)
    assert result.returncode == 2 and "lr: 0.003 → 0.001" in result.stderr, result.stderr
    assert "only its saved plan was compared" in result.stderr


@pytest.mark.slow
def test_the_process_count_may_change_when_the_global_batch_is_the_same(stopped, tmp_path):
    run_dir, result = continue_copy(stopped, tmp_path, ["--nproc", "2", "--iterations_to_run",
                                                        "2"])
    assert "at step 4" in result.stdout and last_step(run_dir) == 6, result.stdout


@pytest.mark.slow
def test_a_refusal_under_nproc_is_said_once_and_every_process_exits_2(stopped):
    run_dir = stopped["run_dir"]
    result = run_train(["--dataset", str(stopped["data"]), *BASE, "--lr", "1e-3", "--nproc",
                        "2"], run_dir)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("lr: 0.003 → 0.001") == 1, result.stderr
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr
