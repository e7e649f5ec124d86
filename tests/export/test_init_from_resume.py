"""A run started with `--init_from EXPORT` resumes from its checkpoint, whose weights need no
export: with the export moved (the same weights at a new path: accepted, and recorded in
run.json), or gone; another export at a new path is another run, and a fresh start still needs
the export, refused in one sentence saying why. Real tiny exports of a run on the synthetic
source."""

import json
import shutil

import pytest

pytest.importorskip("safetensors")
pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

from danastar.cli import main  # noqa: E402
from danastar.commands import train as train_command  # noqa: E402

from export_helpers import ARCHS, TINY  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("init-from-resume")]
CONTINUED = ["--iterations", "4"]  # a run from the export; stopped at step 2 below


def train_args(run_dir, *extra) -> list[str]:
    return ["train", "--dataset", "synthetic", *ARCHS["llama"], *TINY, "--run_dir",
            *map(str, [run_dir, *extra])]


def train(run_dir, *extra) -> int:
    return main(train_args(run_dir, *extra))


def refusal(capsys, *args) -> str:
    capsys.readouterr()
    assert main(list(args)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def losses(run_dir) -> list:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in records
            if "train_loss" in r or "val_loss" in r]


def recorded(run_dir) -> dict:
    return json.loads((run_dir / "run.json").read_text())


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """A three-step llama run exported: the weights the runs below start from."""
    root = tmp_path_factory.mktemp("export")
    assert train(root / "run") == 0
    assert main(["export", str(root / "run"), "--out", str(root / "hf")]) == 0
    return root / "hf"


@pytest.fixture(scope="module")
def uninterrupted(export, tmp_path_factory):
    """The losses of a run from the export trained in one go."""
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    assert train(run_dir, *CONTINUED, "--init_from", export) == 0
    return losses(run_dir)


def stopped_run(export, tmp_path):
    """A run from a copy of the export, stopped at step 2 with a checkpoint: (copy, run dir)."""
    source, run_dir = tmp_path / "hf", tmp_path / "run"
    shutil.copytree(export, source)
    assert train(run_dir, *CONTINUED, "--init_from", source, "--iterations_to_run", "2") == 75
    started = recorded(run_dir)["identity"]
    assert started["init_from"] == str(source.resolve())
    assert len(started["init_from_fingerprint"]) == 16  # a hash of the weights' bytes
    return source, run_dir


def test_a_moved_export_resumes_its_run_and_the_move_is_recorded(export, uninterrupted,
                                                                  tmp_path):
    """Before: refused as another run ("init_from: A → B"), the export being the same."""
    source, run_dir = stopped_run(export, tmp_path)
    started = recorded(run_dir)["identity"]
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    source.rename(moved)
    assert train(run_dir, *CONTINUED, "--init_from", moved) == 0
    record = recorded(run_dir)
    assert record["identity"] == {**started, "init_from": str(moved.resolve())}
    assert record["starts"][-1]["accepted"] == [
        f"init_from: {source.resolve()} → {moved.resolve()} (the same export, moved)"]
    assert losses(run_dir) == uninterrupted  # its checkpoint's weights, resumed bitwise


def test_a_run_resumes_without_its_export_once_it_has_a_checkpoint(export, uninterrupted,
                                                                    tmp_path, capsys,
                                                                    monkeypatch):
    """Before: "--init_from ... does not exist; ... put the export back at ...", though a
    resume takes its checkpoint's weights."""
    source, run_dir = stopped_run(export, tmp_path)
    started = recorded(run_dir)["identity"]
    shutil.rmtree(source)
    monkeypatch.setattr(train_command, "estimated_time", lambda *args: "not measured here")
    capsys.readouterr()
    assert main(train_args(run_dir, *CONTINUED, "--init_from", source, "--dry_run")) == 0
    out = capsys.readouterr().out
    assert (f"init from    {source} is not there now; the run resumes from its checkpoint, whose "
            "weights need no export") in out
    assert "resumes from its checkpoint at step 2" in out
    assert main(train_args(run_dir, *CONTINUED, "--init_from", source, "--dry_run",
                           "--json")) == 0
    assert json.loads(capsys.readouterr().out)["init_from"] == {"path": str(source),
                                                                "present": False}
    assert train(run_dir, *CONTINUED, "--init_from", source) == 0
    assert recorded(run_dir)["identity"] == started  # still the export it started from
    assert losses(run_dir) == uninterrupted
    # a fresh start needs the export: refused, saying why, before anything is moved aside
    said = refusal(capsys, *train_args(run_dir, *CONTINUED, "--init_from", source,
                                       "--no_auto_resume"))
    assert said == (f"danastar train: --init_from {source} does not exist, and a fresh start "
                    f"takes its weights from it (--no_auto_resume starts the run afresh); pass "
                    f"the directory that `danastar export` wrote, where it is now (once a run "
                    f"has a checkpoint, its resume needs no export).")
    assert not list(run_dir.glob("previous-*"))


def test_another_export_at_a_new_path_is_another_run(export, tmp_path, capsys):
    source, run_dir = stopped_run(export, tmp_path)
    other = tmp_path / "other"
    shutil.copytree(export, other)
    weights = load_file(other / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 0.5  # the same model, other weights
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    said = refusal(capsys, *train_args(run_dir, *CONTINUED, "--init_from", other))
    assert said == (
        f"danastar train: {run_dir} holds another run (its checkpoint at step 2 was trained "
        f"with other settings): init_from: {source.resolve()} → {other.resolve()} (another "
        f"export: other weights; resume with --init_from {source.resolve()}, which need not be "
        f"there now); to keep it, use another --run_dir, or pass --no_auto_resume to move the "
        f"old run into {run_dir}/previous-<time>/ and start afresh.")
