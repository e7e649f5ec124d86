"""`danastar train --init_from EXPORT`: a run exported and trained from again starts where the
export left off (its first training loss is the exported weights' loss on that batch, computed
here independently), resumes bitwise, and refuses in one sentence an export of another model,
a missing directory and a directory that is no export (test_init_from_resume.py: a resume
whose export has moved or gone)."""

import json
import shutil
import sys

import pytest
import torch

pytest.importorskip("safetensors")

from danastar.cli import main  # noqa: E402
from danastar.commands.train import continuing_advice  # noqa: E402
from danastar.config import batch_layout, default_run_dir, load_config  # noqa: E402
from danastar.config.plan import make_run_plan  # noqa: E402
from danastar.export.init_from import inspect, read  # noqa: E402
from danastar.models import build_model  # noqa: E402
from danastar.train import parallel  # noqa: E402
from danastar.train.data import TrainingData  # noqa: E402
from danastar.train.weights import load_weights  # noqa: E402

from export_helpers import ARCHS, TINY, danastar  # noqa: E402

# The module's fixture trains its runs once: keep its tests on one xdist worker, which
# would otherwise train them again.
pytestmark = pytest.mark.xdist_group("init-from-exports")


@pytest.fixture(scope="module")
def exports(runs, tmp_path_factory):
    """Each tiny run exported: {arch: export directory} (llama and both Qwen3 natively)."""
    root = tmp_path_factory.mktemp("exports")
    for arch, run_dir in runs.items():
        assert main(["export", str(run_dir), "--out", str(root / arch)]) == 0
    return {arch: root / arch for arch in runs}


def train(corpus, arch, run_dir, *extra) -> int:
    return main(["train", "--dataset", str(corpus), *ARCHS[arch], *TINY, "--run_dir",
                 str(run_dir), *extra])


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def first_batch_loss(run_dir, state_dict) -> float:
    """The cross-entropy of ``state_dict`` on the first training batch of the run in
    ``run_dir``: its own model and data, built here, not by the training loop."""
    config, _ = load_config(["--config", str(run_dir / "config.yaml")])
    env = parallel.Distributed("single", 0, 0, 1, torch.device("cpu"), 0, 1)
    data = TrainingData.open(config, env, batch_layout(config, 1))
    try:
        inputs, targets = data.train_batch(0, 0)
    finally:
        data.close()
    model = build_model(load_weights(run_dir).model_config)
    model.load_state_dict(state_dict)
    with torch.no_grad():
        return model(inputs, targets).ce.item()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["enoki", "llama", "qwen3", "qwen3next"])
def test_a_run_from_an_export_starts_with_the_exported_weights(arch, runs, exports, corpus,
                                                               tmp_path):
    exported = load_weights(runs[arch])
    # the export's files read back: the run's tensors (Qwen3-Next's norms w - 1 + 1: 1 ulp)
    state = read(inspect(exports[arch], exported.model_config))
    assert set(state) == set(exported.state_dict)
    for name, tensor in exported.state_dict.items():
        assert (state[name] - tensor).abs().max().item() <= 1e-7 * max(1, tensor.abs().max())

    run_dir = tmp_path / "continued"
    assert train(corpus, arch, run_dir, "--init_from", str(exports[arch])) == 0
    first = next(r for r in records(run_dir) if r.get("step") == 1 and "train_loss" in r)
    expected = first_batch_loss(run_dir, exported.state_dict)
    assert abs(first["train_loss"] - expected) <= 1e-6
    # the step-0 validation loss is the exported run's final one (the same batches, weights)
    start = next(r for r in records(run_dir) if r.get("step") == 0 and "val_loss" in r)
    assert abs(start["val_loss"] - exported.val_loss) <= 1e-6
    identity = json.loads((run_dir / "run.json").read_text())["identity"]
    assert identity["init_from"] == str(exports[arch].resolve())


@pytest.mark.slow
def test_a_run_from_an_export_resumes_bitwise(exports, corpus, tmp_path):
    source = ["--init_from", str(exports["llama"])]
    assert train(corpus, "llama", tmp_path / "whole", *source) == 0
    assert train(corpus, "llama", tmp_path / "parts", *source, "--iterations_to_run", "1") == 75
    assert train(corpus, "llama", tmp_path / "parts", *source) == 0

    def losses(run_dir):
        return [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in records(run_dir)
                if "train_loss" in r or "val_loss" in r]

    assert losses(tmp_path / "parts") == losses(tmp_path / "whole")
    log = (tmp_path / "parts" / "logs" / "rank0.log").read_text()
    assert log.count("starting from the weights of the export") == 1  # the resume: checkpoint


@pytest.mark.slow
def test_every_fsdp_rank_starts_from_the_export(runs, exports, corpus, tmp_path):
    """Two FSDP processes each read the export whole and load it before sharding: the first
    validation loss is the exported run's last (to the ranks' float reductions)."""
    run_dir = tmp_path / "fsdp"
    danastar("train", "--dataset", corpus, *ARCHS["llama"], *TINY, "--run_dir", run_dir,
             "--init_from", exports["llama"], "--distributed_backend", "fsdp", torchrun=2)
    start = next(r for r in records(run_dir) if r.get("step") == 0 and "val_loss" in r)
    assert abs(start["val_loss"] - load_weights(runs["llama"]).val_loss) <= 1e-5


def refusal(capsys, *args) -> str:
    capsys.readouterr()
    assert main(list(map(str, args))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("danastar train: "), err
    return err[0]


@pytest.mark.slow
def test_an_export_of_another_model_is_refused_naming_its_flags(exports, corpus, tmp_path,
                                                                capsys):
    args = ["train", "--dataset", corpus, *TINY, "--init_from", exports["llama"]]
    said = refusal(capsys, *args, "--arch", "enoki", "--heads", "2", "--dry_run")
    assert "is llama at 2 heads" in said and "pass --arch llama --heads 2." in said
    said = refusal(capsys, *args, "--arch", "llama", "--heads", "3", "--run_dir", tmp_path / "r")
    assert "n_head 2 (this run: 3)" in said and not (tmp_path / "r").exists()

    # without danastar_export.json: the class, then each tensor, say what differs
    bare = tmp_path / "bare"
    shutil.copytree(exports["llama"], bare)
    (bare / "danastar_export.json").unlink()
    said = refusal(capsys, "train", "--dataset", corpus, *TINY, "--init_from", bare,
                   "--arch", "qwen3", "--heads", "1", "--dry_run")
    assert "is a LlamaForCausalLM (llama at 2 heads)" in said and "--arch llama --heads 2" in said
    said = refusal(capsys, "train", "--dataset", corpus, *TINY, "--init_from", bare,
                   "--arch", "llama", "--heads", "3", "--dry_run")
    assert "has no tensor model.layers.1." in said  # the export has one layer, this run two
    said = refusal(capsys, "train", "--dataset", corpus, *TINY, "--init_from", bare,
                   "--arch", "llama", "--heads", "3", "model.n_layer=1", "--dry_run")
    assert "of shape [" in said and "where this run's is [" in said and "differ" in said


@pytest.mark.slow
def test_the_dry_run_names_the_export_and_its_own_directory(exports, corpus, capsys):
    args = ["--dataset", str(corpus), *ARCHS["llama"], *TINY]
    capsys.readouterr()
    assert main(["train", *args, "--init_from", str(exports["llama"]), "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert f"init from    {exports['llama']} (LlamaForCausalLM, step 3: llama at 2 heads" in out
    # the next line: what restarts, and the settings that continue a trained model
    advice = out.split("init from    ", 1)[1].splitlines()[1].strip()
    assert advice.startswith("only the weights: the optimizer's state and schedule start afresh")
    # ω·wd_ts/(wd_ts + step) = 4·1/(1 + 3) = 1; a tenth of 3 steps adds no warm-up; --lr given
    assert advice.endswith("to continue one: --omega 1 (the decay where the exported run left "
                           "it)")
    config, _ = load_config([*args, "--init_from", str(exports["llama"])])
    fresh, _ = load_config(args)
    assert default_run_dir(config).name == default_run_dir(fresh).name + "-from-llama"
    assert main(["train", *args, "--init_from", str(exports["llama"]), "--dry_run",
                 "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["init_from"]["architecture"] == "LlamaForCausalLM"


@pytest.mark.slow
def test_a_sharded_export_reads_as_the_single_file_one(runs, exports, tmp_path):
    """transformers' shards (model-0000k-of-0000n.safetensors and their index) read whole."""
    from transformers import AutoModelForCausalLM

    sharded = tmp_path / "sharded"
    model = AutoModelForCausalLM.from_pretrained(exports["qwen3next"], dtype=torch.float32)
    model.save_pretrained(sharded, max_shard_size="100KB")
    shutil.copy(exports["qwen3next"] / "danastar_export.json", sharded)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    config = load_weights(runs["qwen3next"]).model_config
    whole, shards = (read(inspect(path, config)) for path in (exports["qwen3next"], sharded))
    assert set(whole) == set(shards)
    assert all(torch.equal(whole[name], shards[name]) for name in whole)


@pytest.mark.parametrize("make, said", [
    (lambda path: None, "does not exist, and a fresh start takes its weights from it"),
    (lambda path: path.write_text("x"), "is not a directory"),
    (lambda path: path.mkdir(), "has no readable config.json"),
    (lambda path: (path.mkdir(), (path / "config.json").write_text(
        '{"architectures": ["GPT2LMHeadModel"]}')), "holds a GPT2LMHeadModel"),
    (lambda path: (path.mkdir(), (path / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"]}')), "has no model.safetensors"),
], ids=["missing", "a-file", "no-config", "another-class", "no-weights"])
def test_a_path_that_is_no_export_is_one_sentence(make, said, tmp_path, capsys):
    path = tmp_path / "hf"
    make(path)
    message = refusal(capsys, "train", "--dataset", "synthetic", "--arch", "llama", "--heads",
                      "2", "--init_from", path, "--dry_run")
    assert f"--init_from {path} {said}" in message


def test_a_fresh_start_whose_export_is_not_there_says_why_it_needs_it(tmp_path, capsys):
    # Before: "...; to resume a run started from an export that has since moved, put the export
    # back at ...", though a resume takes its checkpoint's weights and needs no export.
    message = refusal(capsys, "train", "--dataset", "synthetic", "--arch", "llama", "--heads",
                      "2", "--init_from", tmp_path / "hf", "--run_dir", tmp_path / "run",
                      "--dry_run")
    assert message == (f"danastar train: --init_from {tmp_path / 'hf'} does not exist, and a "
                       f"fresh start takes its weights from it ({tmp_path / 'run'} has no "
                       f"checkpoint to resume from); pass the directory that `danastar export` "
                       f"wrote, where it is now (once a run has a checkpoint, its resume needs "
                       f"no export).")


def test_an_empty_init_from_is_refused(capsys):
    assert "--init_from) is empty" in refusal(capsys, "train", "--init_from", " ", "--dry_run")


def test_without_safetensors_it_says_which_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "safetensors", None)
    said = refusal(capsys, "train", "--dataset", "synthetic", "--init_from", tmp_path,
                   "--dry_run")
    assert said.endswith("needs the 'export' extra: pip install 'danastar[export]'.")



def advice(*flags, exported_step=300):
    config, _ = load_config(["--arch", "enoki", "--heads", "2", "--iterations", "300", *flags])
    plan = make_run_plan(config, vocab_size=4096, data_parallel_size=1).to_dict()
    return continuing_advice(config, plan, exported_step)


def test_the_dry_run_says_what_restarts_and_how_to_continue_a_trained_model():
    """The plan's own peak LR, warm-up and log-time decay raised a continued Shakespeare run's
    validation loss from 5.12 to 5.75 in 20 steps; the settings named kept it at 5.15
    (docs/export.md). Only those not given are suggested."""
    said = advice()
    assert said.startswith("only the weights: the optimizer's state and schedule start afresh "
                           "(peak LR ")
    assert "weight decay ω 4 over wd_ts 30 from its first, strongest step" in said
    # ω·wd_ts/(wd_ts + step): the decay this run starts at is where the exported run left it
    assert ("to continue one: --omega 0.36 (the decay where the exported run left it), "
            "--warmup_steps 30 (a tenth of the steps), --lr ") in said
    assert said.endswith("(a quarter of the peak)")
    given = advice("--lr", "1e-3", "--warmup_steps", "50", "--omega", "0.5")
    assert "to continue one" not in given and "peak LR 0.001 after 50 warm-up steps" in given
    assert "a smaller --omega" in advice(exported_step=None)
    # AdamW's decay is scaled by the LR: no restart of a decay clock to undo
    adamw = advice("--opt", "adamw")
    assert "--omega" not in adamw and "--warmup_steps 30" in adamw
