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
