"""What `danastar train` refuses before it starts, its dry run refuses alike (one function,
`train.plan.checked_start`, for both): data that is not there, a run directory that another
process is training in; a sweep's dry run refuses the data its runs would. A named source that
this machine has not prepared and training would not prepare (FineWeb) is refused by both, the
dry run after printing its plan (which needs no data). A model that cannot fit in this
machine's memory is refused before anything is allocated."""

import json

import pytest

from danastar.cli import main
from danastar.commands import train as train_command
from danastar.rundir.lock import hold
from danastar.train import memory as memory_module

from train_helpers import TINY


def said(capsys, *args) -> tuple[int, list[str]]:
    """(exit code, stderr's lines) of the command line run in this process."""
    capsys.readouterr()
    code = main([str(arg) for arg in args])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("make, what", [
    (lambda path: None, "is neither a prepared directory nor one of"),
    (lambda path: path.mkdir(), "holds no meta.json"),
], ids=["missing-folder", "empty-folder"])
def test_data_that_is_not_there_is_refused_by_the_dry_run_as_by_training(make, what, tmp_path,
                                                                          capsys):
    data, run_dir = tmp_path / "data", tmp_path / "run"
    make(data)
    args = ["train", *TINY, "--dataset", data, "--iterations", "2", "--run_dir", run_dir]
    planned, trained = said(capsys, *args, "--dry_run"), said(capsys, *args)
    assert planned == trained, (planned, trained)  # the same check, the same sentence
    code, lines = planned
    assert code == 2 and len(lines) == 1 and what in lines[0] and str(data) in lines[0], lines
    assert not run_dir.exists()


def test_a_sweeps_dry_run_refuses_a_point_whose_data_is_not_there(tmp_path, capsys):
    spec = tmp_path / "grid.yaml"
    spec.write_text(json.dumps({"name": "tiny", "base": {"data.dataset": str(tmp_path / "none"),
                                                         "model.heads": 2},
                                "grid": {"train.seed": [0, 1]}}))
    code, lines = said(capsys, "sweep", spec, "--runs_root", tmp_path / "runs", "--dry_run")
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("danastar sweep: sweep tiny, run s0: data ") and \
        "is neither a prepared directory" in lines[0], lines
    assert not (tmp_path / "runs").exists()


def not_prepared(data_root) -> str:
    """What training says of FineWeb not prepared on this machine (data under `data_root`)."""
    return (f"'fineweb' is not prepared yet; run `danastar prepare fineweb` (it writes "
            f"{data_root / 'fineweb'}) or pass a prepared directory.")


def test_a_source_not_prepared_here_is_refused_by_the_dry_run_after_its_plan(tmp_path, capsys,
                                                                            monkeypatch):
    """Before: the dry run planned FineWeb from its name and exited 0; the run refused it."""
    monkeypatch.setenv("DANASTAR_DATA_DIR", str(tmp_path / "data"))
    # the summary's time line measures steps of the GPT-2-vocabulary model (its loss compiles)
    monkeypatch.setattr(train_command, "estimated_time", lambda *args: "not measured here")
    run_dir = tmp_path / "run"
    args = ["train", *TINY, "--dataset", "fineweb", "--iterations", "20", "--run_dir", run_dir]
    sentence = f"danastar train: {not_prepared(tmp_path / 'data')}"
    assert said(capsys, *args) == (2, [sentence])
    for shown in ([], ["--json"]):
        assert main([str(arg) for arg in [*args, "--dry_run", *shown]]) == 2
        out, err = capsys.readouterr()
        # the plan (it needs no data), then the run's refusal as its last line
        plan = json.loads(out)["plan"] if shown else out
        assert ("vocab_size" in plan) if shown else out.startswith("plan (--dry_run --json")
        assert err.strip().splitlines()[-1] == sentence
    assert not run_dir.exists() and not (tmp_path / "data").exists()  # nothing written


def test_a_prepared_source_and_the_embedded_corpus_are_planned_and_prepare_nothing(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DANASTAR_DATA_DIR", str(tmp_path / "data"))
    args = ["train", *TINY, "--iterations", "20", "--run_dir", tmp_path / "run", "--dry_run",
            "--json"]
    # Shakespeare is prepared on first use by training: planned from its name, not prepared
    assert said(capsys, *args, "--dataset", "shakespeare")[0] == 0
    assert not (tmp_path / "data").exists()
    fineweb = tmp_path / "data" / "fineweb"  # the original release's raw GPT-2 files
    fineweb.mkdir(parents=True)
    for name in ("train.bin", "val.bin"):
        (fineweb / name).write_bytes(bytes(2 * 4096))
    assert said(capsys, *args, "--dataset", "fineweb")[0] == 0


def test_a_sweep_refuses_a_source_not_prepared_here_after_its_dry_runs_list(tmp_path, capsys,
                                                                            monkeypatch):
    """Before: its dry run listed the runs, exit 0, and each run then failed on the data."""
    monkeypatch.setenv("DANASTAR_DATA_DIR", str(tmp_path / "data"))
    spec = tmp_path / "grid.yaml"
    spec.write_text(json.dumps({"name": "tiny", "base": {"data.dataset": "fineweb",
                                                         "model.heads": 2},
                                "grid": {"train.seed": [0, 1]}}))
    sentence = f"danastar sweep: {not_prepared(tmp_path / 'data')}"
    args = ["sweep", spec, "--runs_root", tmp_path / "runs"]
    assert said(capsys, *args) == (2, [sentence])
    capsys.readouterr()
    assert main([str(arg) for arg in [*args, "--dry_run"]]) == 2
    out, err = capsys.readouterr()
    assert [line.split()[0] for line in out.splitlines()[:2]] == ["s0", "s1"]
    assert err.strip().splitlines() == [sentence]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()


def test_the_dry_run_of_a_directory_in_use_is_refused_as_training_refuses_it(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    args = ["train", *TINY, "--iterations", "2", "--run_dir", run_dir]
    with hold(run_dir, "danastar train", ""):  # this process stands for a live run there
        planned, trained = said(capsys, *args, "--dry_run"), said(capsys, *args)
        sweep_root = tmp_path / "runs" / "tiny"
        sweep_root.mkdir(parents=True)
        spec = tmp_path / "grid.yaml"
        spec.write_text(json.dumps({"name": "tiny", "base": {"data.dataset": "synthetic",
                                                             "model.heads": 2},
                                    "grid": {"train.seed": [0]}}))
        with hold(sweep_root, "danastar sweep", ""):
            swept = said(capsys, "sweep", spec, "--runs_root", tmp_path / "runs", "--dry_run")
    assert planned == trained, (planned, trained)
    code, lines = planned
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"danastar train: {run_dir} is in use by danastar train (pid ")
    assert lines[0].endswith("; wait for it to end or use another --run_dir.")
    assert sorted(path.name for path in run_dir.iterdir()) == [".lock"]  # nothing written
    code, lines = swept
    assert code == 2 and len(lines) == 1 and "is in use by danastar sweep" in lines[0], lines
    assert lines[0].endswith("or use another --runs_root.")


def test_a_model_that_cannot_fit_in_memory_is_refused_before_anything_is_allocated(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(memory_module, "available_memory", lambda: 2**20)  # 1 MiB available
    run_dir = tmp_path / "run"
    args = ["train", *TINY, "--iterations", "2", "--run_dir", run_dir]
    code, lines = said(capsys, *args)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("danastar train: the model's ") and \
        "for their weights, gradients and optimizer state, and this machine has 0.0 GiB " \
        "available; use fewer --heads (a smaller model), or a machine with more memory" in \
        lines[0], lines
    assert not run_dir.exists()
    # the dry run plans for any machine: it says so where the estimate would be, and exits 0
    capsys.readouterr()
    assert main([str(arg) for arg in args] + ["--dry_run"]) == 0
    assert "so `danastar train` refuses it here" in capsys.readouterr().out
