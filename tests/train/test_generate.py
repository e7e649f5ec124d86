"""`danastar generate`: sampling from a run's checkpoint, sharded (DCP) or single-file."""

import hashlib
import json
import shutil
import subprocess
import sys

import pytest
import torch

from danastar.commands.generate import generate
from danastar.errors import UserError

from train_helpers import assert_ok, environment, run_train

# The module's fixture trains its runs once: keep its tests on one xdist worker, which
# would otherwise train them again.
pytestmark = pytest.mark.xdist_group("generate-runs")


def test_a_path_that_is_no_run_is_one_sentence(tmp_path):
    with pytest.raises(UserError, match="neither a run directory"):
        generate(tmp_path, "", tokens=3, temperature=0, top_k=None, seed=0)
    (tmp_path / "config.yaml").write_text("{}\n")
    with pytest.raises(UserError, match="has no complete checkpoint yet"):
        generate(tmp_path, "", tokens=3, temperature=0, top_k=None, seed=0)


@pytest.mark.slow
def test_generation_from_a_sharded_checkpoint_equals_the_single_file_one(tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    run_dir = tmp_path / "fsdp"
    assert_ok(run_train(["--iterations", "3", "--distributed_backend", "fsdp"], run_dir,
                        torchrun=2))
    (checkpoint,) = (run_dir / "checkpoints").iterdir()
    assert json.loads((checkpoint / "meta.json").read_text())["layout"] == "dcp"

    # The same weights as one file, converted by torch's own tool, in a run directory of its own.
    copy = tmp_path / "single"
    single = copy / "checkpoints" / checkpoint.name
    single.mkdir(parents=True)
    for name in ("config.yaml", "plan.json"):
        shutil.copy(run_dir / name, copy / name)
    dcp_to_torch_save(checkpoint, tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=False)
    torch.save({"model": whole["model"]}, single / "state.pt")
    digest = hashlib.sha256((single / "state.pt").read_bytes()).hexdigest()
    (single / "meta.json").write_text(json.dumps({"step": 3, "layout": "single",
                                                  "files": {"state.pt": digest}}))

    settings = dict(tokens=12, temperature=0.8, top_k=20, seed=3)
    sharded = generate(run_dir, "5 6 7", **settings)
    assert sharded == generate(copy, "5 6 7", **settings)
    assert sharded == generate(checkpoint, "5 6 7", **settings)  # a checkpoint folder named
    assert sharded.split()[:3] == ["5", "6", "7"] and len(sharded.split()) == 15
    assert sharded != generate(run_dir, "5 6 7", **{**settings, "seed": 4})

    result = subprocess.run([sys.executable, "-m", "danastar", "generate", str(run_dir),
                             "--prompt", "5 6 7", "--tokens", "12", "--temperature", "0.8",
                             "--top_k", "20", "--seed", "3"],
                            env=environment(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == sharded


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """A tiny run with its checkpoints at steps 2 and 4 (context 32, vocabulary 512)."""
    run_dir = tmp_path_factory.mktemp("generate") / "run"
    assert_ok(run_train(["--iterations", "4", "checkpoint.latest_every=2"], run_dir))
    assert len(list((run_dir / "checkpoints").iterdir())) == 2
    return run_dir


def refusal(capsys, *args) -> str:
    from danastar.cli import main

    capsys.readouterr()
    assert main(["generate", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("danastar generate: "), err
    return err[0]


def test_bad_arguments_are_refused_naming_generates_own(two_checkpoints, capsys):
    run = str(two_checkpoints)
    cases = [
        (["--prompt", "1 999999"], "--prompt holds token id(s) 999999 outside this model's "
                                   "vocabulary of 512 (ids 0 to 511)"),
        (["--prompt", "-1 2"], "--prompt holds token id(s) -1 outside"),
        (["--temperature", "nan"], "--temperature nan must be a finite number >= 0"),
        (["--temperature", "-0.5"], "--temperature -0.5 must be a finite number >= 0"),
        (["--device", "bogus"], "--device 'bogus' is not known; use auto, cpu, cuda or cuda:N."),
        (["--tokens", "0"], "--tokens 0 must be at least 1."),
        # before: "ValueError: Overflow when unpacking long long", a traceback
        (["--seed", str(2**64)], f"--seed {2**64} is outside the seeds torch takes "
                                 f"({-2**63} to {2**64 - 1}); give a seed in that range"),
    ]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda:0"], "--device cuda:0 asks for a GPU, but no CUDA "
                                              "device is visible; use --device cpu"))
    for args, message in cases:
        assert message in refusal(capsys, run, *args)


def test_more_tokens_than_the_context_says_where_it_stopped(two_checkpoints, capsys):
    from danastar.cli import main

    assert main(["generate", str(two_checkpoints), "--prompt", "1 2", "--tokens", "500"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.split()) == 32  # the whole context: 2 given, 30 new
    assert "stopped after 30 new tokens, at the model's context of 32 tokens (the prompt takes " \
           "2); ask for --tokens 30 or fewer" in captured.err


def test_the_default_length_fits_the_context_without_a_warning(two_checkpoints, capsys):
    """The command `train`'s `next:` line suggests has no --tokens: its default fills what the
    context leaves (30 of 32 here, under the default 200) and says nothing about stopping."""
    from danastar.cli import main

    capsys.readouterr()
    assert main(["generate", str(two_checkpoints), "--prompt", "1 2"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.split()) == 32 and "stopped" not in captured.err


def test_a_corrupt_newest_checkpoint_is_named_when_an_older_one_is_used(two_checkpoints,
                                                                        tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(two_checkpoints, run_dir)
    older, newer = sorted((run_dir / "checkpoints").iterdir())
    state = newer / "state.pt"
    state.write_bytes(state.read_bytes()[:-10] + b"0123456789")
    settings = dict(tokens=5, temperature=0, top_k=None, seed=0)
    sampled = generate(run_dir, "1 2 3", **settings)
    assert (f"danastar generate: checkpoint {newer} cannot be used (state.pt does not match its "
            f"checksum); sampling from the older {older.name} instead.") in capsys.readouterr().err
    assert sampled == generate(older, "1 2 3", **settings)


def test_the_checkpoint_sampled_from_is_named_with_its_step(two_checkpoints, capsys):
    from danastar.cli import main

    capsys.readouterr()
    assert main(["generate", str(two_checkpoints), "--prompt", "1 2", "--tokens", "3"]) == 0
    captured = capsys.readouterr()
    newest = sorted((two_checkpoints / "checkpoints").iterdir())[-1]
    assert len(captured.out.split()) == 5  # the sample alone on standard output
    assert f"danastar generate: sampling from {newest} (step 4, " in captured.err


def test_a_run_whose_data_is_gone_says_to_put_it_back(two_checkpoints, tmp_path, capsys):
    # Before: "prepare it first with `danastar prepare SOURCE --out DIR` and pass DIR", and
    # generate takes no data directory.
    run_dir = tmp_path / "run"
    shutil.copytree(two_checkpoints, run_dir)
    gone = tmp_path / "corpus"
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace("dataset: synthetic", f"dataset: {gone}"))
    said = refusal(capsys, str(run_dir), "--prompt", "the")
    assert said.startswith(f"danastar generate: this run trained on the data in {gone}, which is "
                           "not there now (a relative path is read from the current folder), "
                           "and sampling needs the tokenizer prepared with it")
    assert said.endswith("; put that directory back, or run danastar generate from the folder "
                         "the run was trained in.")
