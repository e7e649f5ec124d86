"""`danastar sweep`: a sweep file's grid trained here, with real `danastar train` processes;
complete runs skipped, interrupted ones resumed; bad sweep files refused in one sentence."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from danastar.errors import UserError
from danastar.launch.sweep_spec import expand, parse_sweep, run_state

from train_helpers import environment

# A tiny model on the in-memory synthetic source (see tests/train/train_helpers.py).
BASE = {"data.dataset": "synthetic", "model.heads": 2, "train.batch_size": 4,
        "train.sequence_length": 32, "train.iterations": 4, "train.eval_interval": 2,
        "train.eval_batches": 2, "train.final_eval_batches": 4, "train.log_interval": 1,
        "train.sample_tokens": 0}
GRID = {"optim.name": ["adamw", "adana"], "lr_multiplier": [0.5, 2]}
NAMES = ["adamw-lrx0.5", "adamw-lrx2", "adana-lrx0.5", "adana-lrx2"]


def sweep(spec: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "danastar", "sweep", str(spec), "--runs_root",
                           str(spec.parent / "runs"), *args],
                          env=environment(), capture_output=True, text=True, timeout=600)


def write_spec(directory: Path, **fields) -> Path:
    spec = directory / "grid.yaml"
    spec.write_text(json.dumps({"name": "tiny", "base": BASE, "grid": GRID, **fields}))
    return spec


def test_expansion_names_every_point_and_keeps_the_grid_order():
    points = expand(parse_sweep({"name": "tiny", "base": BASE, "grid": GRID}))
    assert [point.name for point in points] == NAMES
    assert [point.lr_multiplier for point in points] == [0.5, 2.0, 0.5, 2.0]
    assert points[3].varied == {"optim.name": "adana", "lr_multiplier": 2}
    assert "optim.name=adana" in points[3].train_argv()
    assert "model.heads=2" in points[3].train_argv()


@pytest.mark.parametrize("grid, message", [
    ({"optim.nmae": ["adamw"]}, "unknown grid key 'optim.nmae'; did you mean 'optim.name'?"),
    ({"heads": [2]}, "unknown grid key 'heads'; write it as the config key 'model.heads'."),
    ({}, "has an empty grid:; list at least one key to vary"),
    ({"optim.lr": [1e-3], "lr_multiplier": [1]}, "keep only one of them."),
])
def test_bad_sweep_files_are_one_sentence(grid, message):
    with pytest.raises(UserError, match=message.replace("?", r"\?").replace("(", r"\(")):
        parse_sweep({"name": "x", "grid": grid})


def test_a_bad_sweep_file_exits_2_without_traceback(tmp_path):
    spec = write_spec(tmp_path, grid={"optim.nmae": ["adamw"]})
    result = sweep(spec)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"danastar sweep: sweep file {spec}: unknown grid key 'optim.nmae'; did you mean "
        "'optim.name'?"]
    assert not (tmp_path / "runs").exists()


def test_run_state_reads_completion_from_the_final_record(tmp_path):
    assert run_state(tmp_path / "absent")["state"] == "new"
    (tmp_path / "plan.json").write_text(json.dumps({"plan": {"iterations": 4}}))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 0, "val_loss": 6.0}\n{"step": 2, "train_loss": 5.0}\n')
    assert run_state(tmp_path) == {"state": "partial", "step": 2, "iterations": 4}
    # A final record before the end (a run extended to more iterations) is not completion.
    metrics.write_text('{"step": 2, "val_loss": 5.0, "final": true}\n{"step": 4, "val_lo')
    assert run_state(tmp_path)["state"] == "partial"
    metrics.write_text('{"step": 4, "val_loss": 5.0, "final": true}\n')
    assert run_state(tmp_path) == {"state": "complete", "step": 4, "iterations": 4}


@pytest.mark.slow
def test_a_sweep_trains_each_point_skips_complete_runs_and_resumes_interrupted_ones(tmp_path):
    spec = write_spec(tmp_path)
    root = tmp_path / "runs" / "tiny"

    listed = sweep(spec, "--dry_run")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[:4]] == NAMES
    assert "4 runs, 0 complete, 4 to train" in listed.stdout and not root.exists()

    # One run is asked to stop after its first step (the stop file a job's time limit writes).
    (root / "adana-lrx2").mkdir(parents=True)
    (root / "adana-lrx2" / "STOP").touch()
    first = sweep(spec, "--parallel", "2", "--no_wandb")
    assert first.returncode == 1, first.stderr
    assert "3 of 4 runs complete; not complete: adana-lrx2 (exit 75)" in first.stderr
    states = {name: run_state(root / name) for name in NAMES}
    assert [states[name]["state"] for name in NAMES] == ["complete"] * 3 + ["partial"]
    assert states["adana-lrx2"]["step"] == 1

    # The expanded list and the run records: each run's LR is its multiple of the law's LR.
    listed = json.loads((root / "sweep.json").read_text())
    lrs = {run["name"]: run["lr"] for run in listed["runs"]}
    assert [run["name"] for run in listed["runs"]] == NAMES
    for opt in ("adamw", "adana"):
        assert lrs[f"{opt}-lrx2"] == pytest.approx(4 * lrs[f"{opt}-lrx0.5"])
    point = json.loads((root / "adamw-lrx2" / "sweep_point.json").read_text())
    assert point == {"sweep": "tiny", "name": "adamw-lrx2", "lr_multiplier": 2.0,
                     "lr": lrs["adamw-lrx2"], "varied": {"optim.name": "adamw",
                                                         "lr_multiplier": 2}}
    plan = json.loads((root / "adamw-lrx2" / "plan.json").read_text())["plan"]
    assert plan["lr"] == pytest.approx(lrs["adamw-lrx2"])
    assert plan["opt"] == "adamw" and plan["iterations"] == 4 and plan["seed"] == 0
    for key in ("omega", "kappa", "delta", "clipsnr", "weight_decay", "wd_ts", "global_batch",
                "seq_len", "non_embedding_params", "exact_non_embedding_params", "total_params",
                "exact_total_params"):
        assert key in plan, key

    done = {name: (root / name / "metrics.jsonl").read_bytes() for name in NAMES[:3]}
    second = sweep(spec, "--parallel", "2", "--no_wandb")
    assert second.returncode == 0, second.stderr
    assert run_state(root / "adana-lrx2") == {"state": "complete", "step": 4, "iterations": 4}
    assert "resumed from" in (root / "logs" / "adana-lrx2.log").read_text()
    assert {name: (root / name / "metrics.jsonl").read_bytes() for name in NAMES[:3]} == done
    assert all((root / "logs" / f"{name}.log").read_text().count("$ danastar train") == 1
               for name in NAMES[:3])

    everything = {path: path.read_bytes() for path in root.rglob("*.jsonl")}
    third = sweep(spec, "--no_wandb")
    assert third.returncode == 0, third.stderr
    assert "all 4 runs are complete; nothing to train" in third.stdout
    assert {path: path.read_bytes() for path in root.rglob("*.jsonl")} == everything


@pytest.mark.parametrize("sig, code", [pytest.param(signal.SIGTERM, 75, marks=pytest.mark.slow),
                                       (signal.SIGINT, 130)])
def test_a_signal_to_the_sweep_stops_its_runs_where_they_can_resume(tmp_path, sig, code):
    # Long enough to be running when the signal comes; SIGINT is ignored by the parent, as for a
    # sweep started in the background, and the sweep must stop on it all the same.
    spec = write_spec(tmp_path, base={**BASE, "train.iterations": 400, "train.eval_interval": 400,
                                      "train.log_interval": 1},
                      grid={"optim.name": ["adamw", "adana"], "lr_multiplier": [1]})
    root = tmp_path / "runs" / "tiny"
    command = [sys.executable, "-m", "danastar", "sweep", str(spec), "--runs_root",
               str(tmp_path / "runs"), "--parallel", "2", "--no_wandb"]
    process = subprocess.Popen(command, env=environment(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    metrics = [root / name / "metrics.jsonl" for name in ("adamw-lrx1", "adana-lrx1")]
    deadline = time.monotonic() + 120
    while not all(m.is_file() and '"train_loss"' in m.read_text() for m in metrics):
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.2)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == code, stderr
    assert "run the same command again to resume it" in stderr and "Traceback" not in stderr
    steps = {m: m.read_bytes() for m in metrics}
    time.sleep(1.0)  # nothing left training: the metrics stay as they are
    assert {m: m.read_bytes() for m in metrics} == steps
    for name in ("adamw-lrx1", "adana-lrx1"):
        state = run_state(root / name)
        assert state["state"] == "partial" and 0 < state["step"] < 400, state
        assert any((root / name / "checkpoints").iterdir())  # it saved before stopping
