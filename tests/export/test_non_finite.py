"""Weights holding a NaN or an infinity are refused where they come in and where they go out:
an export with damaged tensor bytes (its header intact) by `train --init_from` and its dry run,
a checkpoint saved while a run diverged by `export` and by a resume, and weights whose logits
are not finite by `export`'s comparison, which a NaN never passes."""

import json
import shutil
import struct

import pytest
import torch

pytest.importorskip("safetensors")

import danastar.export as export_module  # noqa: E402
from danastar.cli import main  # noqa: E402
from danastar.errors import UserError  # noqa: E402
from danastar.export.init_from import inspect, read  # noqa: E402
from danastar.train.checkpoint import META_FILE, STATE_FILE, write_meta  # noqa: E402
from danastar.train.weights import load_weights  # noqa: E402

from export_helpers import ARCHS, TINY  # noqa: E402

ARGS = ["--dataset", "synthetic", *ARCHS["llama"], *TINY]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A three-step llama run on the synthetic source and its export."""
    root = tmp_path_factory.mktemp("non-finite")
    assert main(["train", *ARGS, "--run_dir", str(root / "run")]) == 0
    assert main(["export", str(root / "run"), "--out", str(root / "hf")]) == 0
    return root


def said(capsys, *args) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main([str(arg) for arg in args])
    return code, capsys.readouterr().err.strip().splitlines()


def listing(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_an_export_with_damaged_values_is_refused_by_train_and_its_dry_run(trained, tmp_path,
                                                                           capsys):
    damaged = tmp_path / "damaged"
    shutil.copytree(trained / "hf", damaged)
    weights = bytearray((damaged / "model.safetensors").read_bytes())
    start = 8 + struct.unpack("<Q", weights[:8])[0]  # the header as written, the values all NaN
    weights[start:] = b"\xff" * (len(weights) - start)
    (damaged / "model.safetensors").write_bytes(bytes(weights))
    run_dir = tmp_path / "run"
    args = ["train", *ARGS, "--init_from", damaged, "--run_dir", run_dir]
    planned, trained_from = said(capsys, *args, "--dry_run"), said(capsys, *args)
    assert planned == trained_from, (planned, trained_from)
    code, lines = planned
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"danastar train: --init_from {damaged} holds non-finite values "
                               f"(NaN or infinity) in ")
    assert lines[0].endswith("; export the run again with `danastar export`, or start without "
                             "--init_from.")
    assert not run_dir.exists()
    # what every process of a run reads (torchrun's workers, which leave the check above to
    # the launcher) refuses it too
    source = inspect(damaged, load_weights(trained / "run").model_config)
    with pytest.raises(UserError, match="holds non-finite values"):
        read(source)


def with_checkpoint_weights(trained, tmp_path, change) -> tuple:
    """A copy of the run whose newest checkpoint's weights `change` altered (its checksums
    written again, so that it verifies): (run directory, checkpoint)."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained / "run", run_dir)
    checkpoint = sorted((run_dir / "checkpoints").glob("latest-*"))[-1]
    meta = json.loads((checkpoint / META_FILE).read_text())
    state = torch.load(checkpoint / STATE_FILE, map_location="cpu", weights_only=False)
    change(state["model"])
    torch.save(state, checkpoint / STATE_FILE)
    (checkpoint / META_FILE).unlink()
    write_meta(checkpoint, meta["step"], meta["layout"])
    return run_dir, checkpoint


def test_a_checkpoint_with_non_finite_weights_is_neither_exported_nor_resumed(trained, tmp_path,
                                                                               capsys):
    def poison(model):
        next(tensor for tensor in model.values() if tensor.is_floating_point())[0] = float("nan")

    run_dir, checkpoint = with_checkpoint_weights(trained, tmp_path, poison)
    out = tmp_path / "hf"
    code, lines = said(capsys, "export", run_dir, "--out", out)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"danastar export: checkpoint {checkpoint} holds non-finite "
                               f"weights (NaN or infinity in ")
    assert not out.exists()
    # training again in the run directory loads it first, and refuses it, writing nothing
    before = listing(run_dir)
    code, lines = said(capsys, "train", *ARGS, "--run_dir", run_dir)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"danastar train: checkpoint {checkpoint} holds non-finite "
                               f"weights (NaN or infinity in 1 tensor(s)), saved while the run "
                               f"diverged; move it out of ")
    assert listing(run_dir) == before


def test_weights_whose_logits_are_not_finite_are_not_exported(trained, tmp_path, capsys):
    def enormous(model):
        for name, tensor in model.items():
            if "norm" in name:
                tensor.fill_(3e38)  # finite, but the products of what they scale are not

    run_dir, checkpoint = with_checkpoint_weights(trained, tmp_path, enormous)
    out = tmp_path / "hf"
    code, lines = said(capsys, "export", run_dir, "--out", out)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"danastar export: the weights of {checkpoint} give non-finite "
                               f"logits (NaN or infinity) on random tokens")
    assert not out.exists()


def test_a_nan_logit_difference_never_passes_the_comparison(trained, tmp_path, monkeypatch):
    monkeypatch.setattr(export_module, "compare_logits", lambda weights, model: float("nan"))
    with pytest.raises(RuntimeError, match="differ from danastar's by nan"):
        export_module.export(trained / "run", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
