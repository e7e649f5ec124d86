"""A run directory written before the model's options moved into nested dataclasses (`model.moe`,
`ModelConfig.moe`) still belongs to the same run: the fixture's run.json, config.yaml and
plan.json were written by `danastar train` of that time, with the command line below stopped
after 4 of its 6 steps. Today's code must plan the identical identity (a resume compares it key
by key and refuses any change), read the old flat config.yaml to the same settings, and record
the same plan."""

import json
from pathlib import Path

from danastar.config import batch_layout, load_config, make_run_plan
from danastar.models import ModelConfig
from danastar.train import identity
from danastar.train.data import open_tokens

FIXTURE = Path(__file__).parent / "fixtures" / "moe-run-before-moeconfig"
ARGV = ["--dataset", "synthetic", "--arch", "qwen3next", "--heads", "1", "model.n_embd=32",
        "model.n_head=2", "--moe_num_experts", "4", "--use_gated_shared_expert",
        "--mlp_only_layers", "1", "--lr", "3e-3", "--batch_size", "4", "--sequence_length", "16",
        "--iterations", "6", "--iterations_to_run", "4", "checkpoint.latest_every=2",
        "--log_interval", "1", "--eval_interval", "3", "--no_wandb", "train.eval_batches=2",
        "train.final_eval_batches=2", "train.sample_tokens=0", "logging.progress=false"]


def recorded(name: str) -> dict:
    return json.loads((FIXTURE / name).read_text())


def test_the_identity_planned_today_is_the_recorded_one_key_by_key():
    config, _ = load_config(ARGV)
    current = identity.planned_identity(config, 1, open_tokens(config, prepare=False))
    old = recorded("run.json")["identity"]
    assert current == old
    assert identity.changed_settings(old, current, step=4) == ([], [])


def test_the_old_flat_config_yaml_reads_to_the_same_settings():
    from_flags, _ = load_config(ARGV)
    from_file, _ = load_config(["--config", str(FIXTURE / "config.yaml")])
    assert from_file == from_flags
    assert from_file.model.moe.mlp_only_layers == (1,) and from_file.model.moe.enabled


def test_the_plan_and_the_model_read_back_from_the_old_records():
    config, _ = load_config(ARGV)
    layout = batch_layout(config, 1)
    plan = make_run_plan(config, 512, layout.data_parallel_size)
    old = recorded("plan.json")["plan"]
    assert {key: old[key] for key in plan.to_dict()} == json.loads(json.dumps(plan.to_dict()))
    # the flat identity's model keys are a ModelConfig's flat dict, which from_dict reads back
    fields = set(ModelConfig.from_dict(plan.model.to_dict()).to_dict())
    flat = {key: value for key, value in recorded("run.json")["identity"].items()
            if key in fields}
    rebuilt = ModelConfig.from_dict({**plan.model.to_dict(), **flat})
    assert rebuilt == plan.model and rebuilt.moe.mlp_only_layers == (1,)


def test_the_nested_config_yaml_written_today_reads_back_to_the_same_settings(tmp_path):
    from danastar.config import save_yaml

    config, _ = load_config(ARGV)
    save_yaml(config, tmp_path / "config.yaml")
    assert "num_experts: 4" in (tmp_path / "config.yaml").read_text()
    assert load_config(["--config", str(tmp_path / "config.yaml")])[0] == config
