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
    # Before: -1 and 0 were reported as `optim.lr (--lr) must be greater than 0`, naming a flag
    # the sweep file does not use; "x" was a ValueError traceback.
    ({"lr_multiplier": [0.5, -1]}, "the sweep: lr_multiplier -1 must be a number greater than 0"),
    ({"lr_multiplier": [0]}, "lr_multiplier 0 must be a number greater than 0"),
    ({"lr_multiplier": ["x"]}, "lr_multiplier 'x' must be a number greater than 0"),
    ({"lr_multiplier": [float("inf")]}, "lr_multiplier inf must be a number greater than 0"),
    ({"lr_multiplier": [True]}, "lr_multiplier True must be a number greater than 0"),
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
    # A sweep file that now asks for 8 iterations: the run is to be trained on.
    assert run_state(tmp_path, 8) == {"state": "partial", "step": 4, "iterations": 8}


@pytest.mark.slow
def test_a_sweep_trains_each_point_skips_complete_runs_and_resumes_interrupted_ones(tmp_path):
    spec = write_spec(tmp_path)
    root = tmp_path / "runs" / "tiny"

    listed = sweep(spec, "--dry_run")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[:4]] == NAMES
    assert "4 runs, 0 complete, 4 to train; each reads 0.00128 epochs of synthetic" in \
        listed.stdout
    assert " 0.00128 epochs  new " in listed.stdout and not root.exists()

    # One run is asked to stop after its first step (the stop file a job's time limit writes).
    (root / "adana-lrx2").mkdir(parents=True)
    (root / "adana-lrx2" / "STOP").touch()
    first = sweep(spec, "--parallel", "2", "--no_wandb")
    assert first.returncode == 1, first.stderr
    assert "3 of 4 runs complete; not complete: adana-lrx2 (exit 75)" in first.stderr
    states = {name: run_state(root / name) for name in NAMES}
    assert [states[name]["state"] for name in NAMES] == ["complete"] * 3 + ["partial"]
    assert states["adana-lrx2"]["step"] == 1
    final = [json.loads(line) for line in (root / "adamw-lrx2" / "metrics.jsonl").read_text()
             .splitlines() if '"final"' in line][-1]["val_loss"]
    assert f"adamw-lrx2: complete, final validation loss {final:.4f}" in first.stdout

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
    assert "adana-lrx2: complete, final validation loss " in second.stdout
    assert second.stdout.splitlines()[-1] == (f"next: danastar results {root} --best  |  danastar "
                                              f"plot lr-sweep {root} --out tiny-lr-sweep")
    assert {name: (root / name / "metrics.jsonl").read_bytes() for name in NAMES[:3]} == done
    assert all((root / "logs" / f"{name}.log").read_text().count("$ danastar train") == 1
               for name in NAMES[:3])

    everything = {path: path.read_bytes() for path in root.rglob("*.jsonl")}
    third = sweep(spec, "--no_wandb")
    assert third.returncode == 0, third.stderr
    assert "all 4 runs are complete; nothing to train" in third.stdout
    assert third.stdout.splitlines()[-1].startswith(f"next: danastar results {root} --best")
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


# -- the command line and the file -------------------------------------------------------------

@pytest.mark.parametrize("grid, args, message", [
    ({"train.seed": [0, 1]}, ["--iterations", "6", "--seed", "7"],
     "--seed sets train.seed for every run, but sweep file {spec} varies train.seed in its grid "
     "(0, 1); remove --seed from the command line, or train.seed from the grid."),
    ({"train.seed": [0, 1]}, ["train.seed=7"], "train.seed=7 sets train.seed for every run"),
    ({"lr_multiplier": [0.5, 2]}, ["--lr", "0.01"],
     "varies lr_multiplier in its grid (0.5, 2); remove --lr from the command line"),
    ({"train.seed": [0]}, ["--run_dir", "elsewhere"],
     "--run_dir is not for a sweep, which puts each run in <runs_root>/tiny/<point>; choose "
     "where with --runs_root instead."),
    ({"train.seed": [0]}, ["logging.run_dir=elsewhere"], "choose where with --runs_root instead"),
], ids=["flag", "dotted", "lr", "run_dir", "dotted_run_dir"])
def test_a_command_line_key_that_the_grid_varies_or_the_run_dir_is_refused(tmp_path, grid, args,
                                                                          message):
    from danastar.commands.sweep import main

    spec = write_spec(tmp_path, grid=grid)
    with pytest.raises(UserError) as refused:
        main([str(spec), "--runs_root", str(tmp_path / "runs"), *args])
    assert message.format(spec=spec) in str(refused.value)
    assert not (tmp_path / "runs").exists()


def refusal(capsys, *args) -> str:
    """The one line of a refusal through the command line's entry point (exit 2)."""
    from danastar.cli import main

    capsys.readouterr()
    assert main(["sweep", *map(str, args)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("danastar sweep: "), err
    return err[0].removeprefix("danastar sweep: ")


def test_a_negative_lr_multiplier_is_named_as_the_sweep_file_says_it(tmp_path, capsys):
    spec = write_spec(tmp_path, grid={"lr_multiplier": [-1, 1]})
    assert refusal(capsys, spec, "--dry_run") == (
        f"sweep file {spec}: lr_multiplier -1 must be a number greater than 0 (it multiplies the "
        "scaling law's LR, e.g. 0.5 or 2).")


def test_a_runs_root_that_cannot_hold_the_sweep_is_refused_naming_runs_root(tmp_path, capsys):
    # Before: "run directory ... cannot be created because ... is a file; pass another
    # --run_dir", a flag a sweep refuses.
    spec = write_spec(tmp_path, grid={"train.seed": [0]})
    a_file = tmp_path / "a_file"
    a_file.write_text("kept")
    for dry_run in ([], ["--dry_run"]):
        assert refusal(capsys, spec, "--runs_root", a_file, *dry_run) == (
            f"--runs_root {a_file} is a file; give --runs_root a folder.")
        assert refusal(capsys, spec, "--runs_root", a_file / "runs", *dry_run) == (
            f"--runs_root {a_file / 'runs'} cannot be written: {a_file} is a file, not a folder; "
            "give --runs_root a path in a writable folder.")
    assert a_file.read_text() == "kept"
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    (tmp_path / "runs" / "tiny" / "s0").write_text("kept")
    assert refusal(capsys, spec, "--runs_root", tmp_path / "runs") == (
        f"{tmp_path / 'runs' / 'tiny' / 's0'} is a file, where run s0's directory goes; move it "
        "away or give another --runs_root.")
    assert sorted(p.name for p in (tmp_path / "runs" / "tiny").iterdir()) == ["s0"]


def test_a_run_name_longer_than_the_file_system_allows_is_refused(tmp_path):
    from danastar.commands.sweep import main

    # Before: an OSError traceback from mkdir, after sweep.json was written.
    spec = write_spec(tmp_path, grid={"train.sample_prompt": ["x" * 300]})
    with pytest.raises(UserError) as refused:
        main([str(spec), "--runs_root", str(tmp_path / "runs")])
    assert str(refused.value).startswith(f"sweep tiny: run directory {tmp_path / 'runs' / 'tiny'}")
    assert ("has a name of 313 bytes (sample_promptxxxxxxxxxxx...), longer than the 255 its file "
            "system allows; shorten the sweep's name") in str(refused.value)
    assert not (tmp_path / "runs").exists()


def test_the_command_line_overrides_the_files_base(tmp_path):
    from danastar.commands.sweep import command_line_keys, overridden, plan_run
    from danastar.config import load_config

    sweep_file = parse_sweep({"name": "tiny", "base": {**BASE, "lr_multiplier": 2},
                              "grid": {"train.seed": [0]}})
    argv = ["--iterations", "6", "train.batch_size=8", "--lr", "0.01"]
    point = overridden(sweep_file.points()[0], command_line_keys(argv))
    run = plan_run("tiny", point, tmp_path, argv, prepare=False)
    config = load_config(run.argv)[0]
    # Before, the file's base won: 4 iterations, batch 4, twice the law's LR.
    assert (config.train.iterations, config.train.batch_size, config.optim.lr) == (6, 8, 0.01)
    assert run.lr == 0.01 and config.train.seed == 0


@pytest.mark.slow
def test_an_edited_sweep_trains_on_where_the_schedule_allows_and_else_is_refused(tmp_path):
    # The file's base says seed 0; the command line's --seed 7 wins, and is then part of the runs.
    base = {**BASE, "train.iterations": 6, "train.seed": 0}
    spec = write_spec(tmp_path, base=base, grid={"optim.scheduler": ["none", "cos_inf"]})
    root = tmp_path / "runs" / "tiny"
    first = sweep(spec, "--seed", "7", "--no_wandb")
    assert first.returncode == 0, first.stderr
    for name in ("schedulernone", "schedulercos_inf"):
        plan = json.loads((root / name / "plan.json").read_text())["plan"]
        assert (plan["seed"], plan["iterations"]) == (7, 6)
    assert json.loads((root / "sweep.json").read_text())["command_line"] == [
        "--seed", "7", "--no_wandb"]
    before = {path: path.read_bytes() for path in root.rglob("*") if path.is_file()}

    # iterations 6 -> 12: cos_inf's factor at the steps taken depends on the total. Before, this
    # said "all 2 runs are complete; nothing to train" and rewrote sweep.json for 12 steps.
    spec.write_text(json.dumps({"name": "tiny", "base": {**base, "train.iterations": 12},
                                "grid": {"optim.scheduler": ["none", "cos_inf"]}}))
    refused = sweep(spec, "--seed", "7", "--no_wandb")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [  # one sentence: off a terminal, no stages
        f"danastar sweep: sweep tiny: {root / 'schedulercos_inf'} was trained with other "
        "settings than the sweep now gives it (iterations: 6 → 12 (the cos_inf schedule's factor "
        "at the steps already taken depends on the total; none and powerlaw never do)); to keep "
        "those runs, give the changed sweep file another name (its name: key) or another "
        "--runs_root, or undo the change to go on with them (--no_auto_resume moves them aside "
        "and trains them afresh), or pass --extend (rewarm; or --extend stretch, reanchor) to "
        "continue them to the longer train.iterations."]
    assert {path: path.read_bytes() for path in root.rglob("*") if path.is_file()} == before

    # Without the cos_inf point, the constant schedule's run trains on from step 6 to 12.
    spec.write_text(json.dumps({"name": "tiny", "base": {**base, "train.iterations": 12},
                                "grid": {"optim.scheduler": ["none"]}}))
    extended = sweep(spec, "--seed", "7", "--no_wandb")
    assert extended.returncode == 0, extended.stderr
    assert run_state(root / "schedulernone") == {"state": "complete", "step": 12,
                                                 "iterations": 12}
    assert "resumed from" in (root / "logs" / "schedulernone.log").read_text()
    assert json.loads((root / "schedulernone" / "plan.json").read_text())["plan"]["seed"] == 7

    # With --extend (alone: rewarm), the cos_inf point is continued past its planned 6 steps too.
    spec.write_text(json.dumps({"name": "tiny", "base": {**base, "train.iterations": 12},
                                "grid": {"optim.scheduler": ["none", "cos_inf"]}}))
    extended = sweep(spec, "--seed", "7", "--no_wandb", "--extend")
    assert extended.returncode == 0, extended.stderr
    cos_inf = root / "schedulercos_inf"
    assert run_state(cos_inf) == {"state": "complete", "step": 12, "iterations": 12}
    assert [(e["from_step"], e["iterations"], e["schedule_rule"]) for e in json.loads(
        (cos_inf / "run.json").read_text())["extensions"]] == [(6, 12, "rewarm")]


def test_a_sweep_file_that_is_not_utf8_is_one_sentence(tmp_path, capsys):
    from danastar import cli

    spec = tmp_path / "latin1.yaml"
    spec.write_bytes("name: caf\xe9\ngrid: {train.seed: [0]}\n".encode("latin-1"))
    assert cli.main(["sweep", str(spec), "--dry_run"]) == 2
    assert capsys.readouterr().err == (f"danastar sweep: sweep file {spec} is not UTF-8 text "
                                       "(byte 0xe9 at offset 9); save it as UTF-8.\n")


def test_the_sweep_plan_says_the_epochs_and_warns_past_a_few(tmp_path, capsys):
    from danastar import cli

    spec = tmp_path / "long.yaml"
    spec.write_text(json.dumps({"name": "long", "base": {"preset": "cpu_shakespeare",
                                                         "train.iterations": 5000},
                                "grid": {"lr_multiplier": [1, 2]}}))
    assert cli.main(["sweep", str(spec), "--runs_root", str(tmp_path / "runs"), "--dry_run"]) == 0
    out, err = capsys.readouterr()
    assert err == ""  # the planning line and its count are said on a terminal only
    assert "  5.41 epochs  new " in out  # 5000 steps × 2,048 tokens of 1,892,697
    assert "2 runs, 0 complete, 2 to train; each reads 5.41 epochs of shakespeare" in out
    assert ("warning: 2 of 2 runs read their corpus more than a few times; the longest reads "
            "shakespeare 5.41 times over") in out
    assert "(--dataset fineweb) or a shorter run (--iterations 3696 reads 4 epochs)" in out
