"""A `danastar train` start plans once and builds its model on the meta device once: the plan
counts the parameters of the model the dry run builds its optimizer over."""

import collections

import pytest

import danastar.config.plan as config_plan
import danastar.scaling as scaling
import danastar.train.loop as loop
from danastar.cli import main


@pytest.fixture
def counted(monkeypatch):
    """Counts of plans, meta-device builds and real builds while the test runs (the meta models
    kept by earlier tests forgotten first)."""
    counts = collections.Counter()
    monkeypatch.setattr(scaling, "_META_MODELS", {})

    def wrap(module, name, key):
        original = getattr(module, name)

        def counting(*args, **kwargs):
            counts[key] += 1
            return original(*args, **kwargs)
        monkeypatch.setattr(module, name, counting)

    wrap(config_plan, "plan_for", "plans")
    wrap(scaling, "build_meta_model", "meta builds")  # scaling builds only on the meta device
    wrap(loop, "build_model", "builds")
    return counts


@pytest.mark.parametrize("options", [[], ["model.tie_embeddings=true", "model.z_loss=0"]],
                         ids=["defaults", "model-options"])
def test_a_start_plans_once_and_builds_one_meta_model(counted, tmp_path, options):
    code = main(["train", "--dataset", "synthetic", "--heads", "2", "--iterations", "1",
                 "--batch_size", "2", "--sequence_length", "16", "--eval_interval", "1",
                 "--run_dir", str(tmp_path / "run"), "train.eval_batches=1",
                 "train.final_eval_batches=1", "train.sample_tokens=0", "--no_wandb", *options])
    assert code == 0
    assert counted == {"plans": 1, "meta builds": 1, "builds": 1}
