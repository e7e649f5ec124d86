"""A run directory belongs to one run: a resume with settings that change the trajectory is
refused before anything is loaded, listing each change; settings that do not are accepted and
recorded in run.json."""

import json
import shutil
import subprocess
import sys

import pytest

from train_helpers import STOPPED_RUN as BASE
from train_helpers import (
    TINY,
    assert_ok,
    assert_stopped_with_work_left,
    environment,
    last_step,
    metrics,
    prepare_words,
    run_train,
)


def listing(run_dir):
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))


@pytest.mark.parametrize("flags, change", [
    (["--lr", "1e-3"], "lr: 0.003 → 0.001"),
    (["--seed", "1"], "seed: 0 → 1"),
    (["--batch_size", "8"], "batch_size: 4 → 8"),
    (["--opt", "adamw"], "opt: adana → adamw"),
    (["--heads", "3"], "heads: 2 → 3"),
    (["--kappa", "0.9"], "kappa: 0.85 → 0.9"),
    (["--state_dtype", "bfloat16"], "state_dtype: float32 → bfloat16"),
    (["--dataset", "OTHER"], "dataset: "),
    # the default cos_inf decays to its floor at the last step: its past depends on the total
    (["--iterations", "24"], "iterations: 12 → 24 (the cos_inf schedule"),
])
def test_a_resume_that_changes_the_trajectory_is_refused_listing_the_change(
        stopped_run, flags, change):
    run_dir = stopped_run["run_dir"]
    if "OTHER" in flags:
        other = stopped_run["root"] / "other-data"
        if not other.exists():
            prepare_words(stopped_run["root"], "other-data", seed=1)
        flags = ["--dataset", str(other)]
    before = listing(run_dir), metrics(run_dir)
    result = run_train(["--dataset", str(stopped_run["data"]), *BASE, *flags], run_dir)
    assert result.returncode == 2, result.stdout + result.stderr
    message = result.stderr.strip()
    assert "Traceback" not in message and len(message.splitlines()) == 1, message
    assert change in message, message
    assert "another --run_dir" in message and "--no_auto_resume" in message
    assert (listing(run_dir), metrics(run_dir)) == before  # nothing written, moved or loaded


def test_the_optimizer_states_dtype_is_compared_and_float32_is_recorded_as_before():
    """A float32 run's identity has no state_dtype (its hash, and so its automatic directory,
    is what it was before the setting was recorded), and reads as float32 when compared."""
    from danastar.train.identity import changed_settings

    float32, bfloat16 = {"opt": "adana"}, {"opt": "adana", "state_dtype": "bfloat16"}
    assert changed_settings(float32, bfloat16, step=4) == (
        ["state_dtype: float32 → bfloat16"], [])
    assert changed_settings(bfloat16, float32, step=4) == (
        ["state_dtype: bfloat16 → float32"], [])
    assert changed_settings(float32, {**float32, "state_dtype": "float32"}, step=4) == ([], [])


def test_the_export_a_run_started_from_is_compared_by_its_weights_fingerprint():
    """A resume takes its checkpoint's weights: the same export moved is accepted, a missing one
    (no fingerprint now) is no change, another export (or none) is another run; a run recorded
    before the fingerprint resumes under its path. Real exports: tests/export/."""
    from danastar.train.identity import changed_settings, identity_digest

    started = {"init_from": "/a/hf", "init_from_fingerprint": "f1"}
    hint = "resume with --init_from /a/hf, which need not be there now"
    cases = [
        (started, {"init_from": "/b/hf", "init_from_fingerprint": "f1"},
         ([], ["init_from: /a/hf → /b/hf (the same export, moved)"])),
        (started, {"init_from": "/a/hf"}, ([], [])),  # the export gone
        (started, {"init_from": "/b/hf", "init_from_fingerprint": "f2"},
         ([f"init_from: /a/hf → /b/hf (another export: other weights; {hint})"], [])),
        (started, {"init_from": "/b/hf"},
         ([f"init_from: /a/hf → /b/hf (/b/hf holds no export to compare; {hint})"], [])),
        (started, {}, ([f"init_from: /a/hf → null (the run started from an export; {hint})"],
                       [])),
        (started, {"init_from": "/a/hf", "init_from_fingerprint": "f2"},
         ([], ["init_from_fingerprint: f1 → f2 (the export there has changed since the run "
               "started from it; the run goes on from its checkpoint's weights)"])),
        ({}, started, (["init_from: null → /a/hf"], [])),  # a run from random weights
        ({"init_from": "/a/hf"}, started, ([], [])),  # recorded before the fingerprint
        ({"init_from": "/a/hf"}, {"init_from": "/b/hf", "init_from_fingerprint": "f1"},
         ([f"init_from: /a/hf → /b/hf (the run recorded no fingerprint of its export to "
           f"compare; {hint})"], [])),
    ]
    for recorded, current, expected in cases:
        assert changed_settings(recorded, current, step=4) == expected, (recorded, current)
    # the automatic directory's hash is what it was, and the same without the export
    assert identity_digest(started) == identity_digest({"init_from": "/a/hf"})


def continue_copy(stopped, tmp_path, flags, name="run"):
    run_dir = tmp_path / name
    shutil.copytree(stopped["run_dir"], run_dir)
    result = run_train(["--dataset", str(stopped["data"]), *BASE, *flags], run_dir)
    if "--iterations_to_run" in flags:
        assert_stopped_with_work_left(result)
    else:
        assert_ok(result)
    return run_dir, result


def test_settings_that_keep_the_trajectory_may_change_and_are_recorded(stopped_run, tmp_path):
    # the same data under another path, other logging and evaluation cadence, a shorter chain
    same_data = tmp_path / "same-data"
    shutil.copytree(stopped_run["data"], same_data)
    run_dir, result = continue_copy(stopped_run, tmp_path, [
        "--dataset", str(same_data), "--eval_interval", "3", "--log_interval", "2",
        "--iterations_to_run", "2", "checkpoint.latest_every=1"])
    assert "resumed from" in result.stdout and "at step 4" in result.stdout, result.stdout
    assert last_step(run_dir) == 6
    record = json.loads((run_dir / "run.json").read_text())
    assert [start["step"] for start in record["starts"]] == [0, 4]
    changed = " ".join(record["starts"][-1]["changed"])
    assert "train.eval_interval: 5 → 3" in changed and "train.iterations_to_run: 4 → 2" in changed
    assert "(the same data)" in " ".join(record["starts"][-1]["accepted"])


@pytest.mark.slow
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


def test_an_older_run_directory_is_checked_against_its_checkpoints_plan(stopped_run, tmp_path):
    run_dir = tmp_path / "old"
    shutil.copytree(stopped_run["run_dir"], run_dir)
    (run_dir / "run.json").unlink()  # as written before run.json existed
    result = run_train(["--dataset", str(stopped_run["data"]), *BASE, "--lr", "1e-3"], run_dir)
    assert result.returncode == 2 and "lr: 0.003 → 0.001" in result.stderr, result.stderr
    assert "only its saved plan was compared" in result.stderr


@pytest.mark.slow
def test_the_process_count_may_change_when_the_global_batch_is_the_same(stopped_run, tmp_path):
    run_dir, result = continue_copy(stopped_run, tmp_path, ["--nproc", "2", "--iterations_to_run",
                                                        "2"])
    assert "at step 4" in result.stdout and last_step(run_dir) == 6, result.stdout


@pytest.mark.slow
def test_a_refusal_under_nproc_is_said_once_and_every_process_exits_2(stopped_run):
    run_dir = stopped_run["run_dir"]
    result = run_train(["--dataset", str(stopped_run["data"]), *BASE, "--lr", "1e-3", "--nproc",
                        "2"], run_dir)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("lr: 0.003 → 0.001") == 1, result.stderr
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr


@pytest.mark.slow
def test_the_dry_run_and_submit_refuse_the_resume_training_refuses_and_write_nothing(
        stopped_run, tmp_path):
    run_dir = (tmp_path / "run").resolve()
    shutil.copytree(stopped_run["run_dir"], run_dir)
    (run_dir / "slurm").mkdir()
    for name in ("config.yaml", "plan.json"):  # what an earlier `danastar submit` recorded
        (run_dir / "slurm" / name).write_text("as submitted\n")
    before = listing(run_dir), metrics(run_dir)
    args = ["--dataset", str(stopped_run["data"]), *BASE, "--lr", "1e-3"]
    trained = run_train(args, run_dir)
    planned = run_train([*args, "--dry_run"], run_dir)
    submitted = subprocess.run(  # no sbatch here: a job that passed the check would fail later
        [sys.executable, "-m", "danastar", "submit", *TINY, *args, "--run_dir", str(run_dir)],
        env={**environment(), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=300)
    refusal = (f"{run_dir} holds another run (its checkpoint at step 4 was trained with other "
               f"settings): lr: 0.003 → 0.001; to keep it, use another --run_dir, or pass "
               f"--no_auto_resume to move the old run into {run_dir}/previous-<time>/ and start "
               f"afresh.")
    for result, command in ((trained, "train"), (planned, "train"), (submitted, "submit")):
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.strip() == f"danastar {command}: {refusal}"
    assert (listing(run_dir), metrics(run_dir)) == before
    assert (run_dir / "slurm" / "config.yaml").read_text() == "as submitted\n"


def test_a_resume_with_unchanged_settings_records_no_change(tmp_path):
    """run.json holds the settings as JSON: a tuple setting (`model.moe.mlp_only_layers`, on
    dense models too) read back as a list must not count as a change at the next start."""
    from danastar.config import batch_layout, load_config
    from danastar.train.identity import record_start

    config, _ = load_config(["--heads", "1", "--iterations", "4"])
    assert isinstance(config.model.moe.mlp_only_layers, tuple)
    layout = batch_layout(config, 1)
    record_start(tmp_path, {"lr": 1e-3}, config, layout, 0, 1, [])
    record_start(tmp_path, {"lr": 1e-3}, config, layout, 2, 1, [])
    starts = json.loads((tmp_path / "run.json").read_text())["starts"]
    assert [start["changed"] for start in starts] == [[], []]
