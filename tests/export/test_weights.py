"""`danastar.train.weights.load_weights`: the one reader of a run's weights (`generate`,
`export`, `eval`), for runs with `model_config.json` and for older runs without it."""

import json
import shutil

import pytest
import torch

from danastar.models import build_model
from danastar.train.weights import MODEL_CONFIG_FILE, load_weights


@pytest.mark.slow
def test_a_run_gives_its_weights_shape_and_record(runs, corpus):
    weights = load_weights(runs["qwen3next"])
    config = weights.model_config
    assert (config.arch, config.moe.num_experts,
            config.moe.mlp_only_layers) == ("qwen3next", 4, (1,))
    assert config.vocab_size == 300 and config.max_seq_len == 32
    assert weights.step == 3 and weights.layout == "single" and weights.tokens == 3 * 4 * 32
    assert weights.checkpoint == runs["qwen3next"] / "checkpoints" / "latest-00000003"
    assert weights.dataset == str(corpus) and weights.identity["opt"] == "adana"
    records = [json.loads(line) for line in
               (runs["qwen3next"] / "metrics.jsonl").read_text().splitlines()]
    assert weights.val_loss == [r["val_loss"] for r in records if "val_loss" in r][-1]
    build_model(config).load_state_dict(weights.state_dict)  # every tensor, every shape


@pytest.mark.slow
def test_a_run_without_model_config_json_is_rebuilt_from_its_settings(runs, tmp_path):
    """Runs trained before training wrote model_config.json: the model config rebuilt from
    config.yaml and plan.json is the same one."""
    old = tmp_path / "old"
    shutil.copytree(runs["llama"], old)
    (old / MODEL_CONFIG_FILE).unlink()
    rebuilt, saved = load_weights(old), load_weights(runs["llama"])
    assert rebuilt.model_config == saved.model_config
    assert all(torch.equal(rebuilt.state_dict[k], t) for k, t in saved.state_dict.items())


@pytest.mark.slow
def test_a_checkpoint_folder_names_its_run(runs):
    checkpoint = runs["enoki"] / "checkpoints" / "latest-00000003"
    weights = load_weights(checkpoint)
    assert weights.run_dir == runs["enoki"] and weights.checkpoint == checkpoint
