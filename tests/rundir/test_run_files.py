"""A run directory holds the model's options (`model_config.json`), so that its weights can be
rebuilt without planning again; a run trains the plan it is given."""

import json

import pytest

from danastar.config import batch_layout, load_config, make_run_plan, model_config
from danastar.data.planned import SYNTHETIC_VOCAB_SIZE
from danastar.models import ModelConfig
from danastar.rundir.files import MODEL_CONFIG_FILE, PLAN_FILE
from danastar.train import loop
from danastar.train.decision import StartDecision
from danastar.train.identity import RunDirChoice

SMALL = ["--dataset", "synthetic", "--heads", "2", "--batch_size", "4", "--acc_steps", "1",
         "--sequence_length", "32", "--iterations", "2", "--eval_interval", "2", "--no_wandb",
         "train.eval_batches=1", "train.final_eval_batches=1", "train.sample_tokens=0",
         "logging.progress=false"]


def counted_planning(monkeypatch) -> list[tuple]:
    """The calls `train` makes to plan the run (each one planned for real)."""
    calls = []

    def plan(*args):
        calls.append(args)
        return make_run_plan(*args)

    monkeypatch.setattr(loop, "make_run_plan", plan)
    return calls


@pytest.mark.process  # environment.json asks git for the revision
def test_a_run_trains_the_plan_it_is_given_and_records_its_model(tmp_path, monkeypatch):
    config, _ = load_config([*SMALL, "--run_dir", str(tmp_path)])
    plan = make_run_plan(config, SYNTHETIC_VOCAB_SIZE,
                         batch_layout(config, 1).data_parallel_size)
    planning = counted_planning(monkeypatch)
    assert loop.train(config, StartDecision(plan, RunDirChoice(tmp_path))) == 0
    assert planning == []
    saved = json.loads((tmp_path / MODEL_CONFIG_FILE).read_text())
    assert ModelConfig.from_dict(saved) == model_config(config, plan)
    assert json.loads((tmp_path / PLAN_FILE).read_text())["plan"]["iterations"] == 2


@pytest.mark.process  # environment.json asks git for the revision
def test_a_plan_for_another_vocabulary_is_made_again(tmp_path, monkeypatch):
    config, _ = load_config([*SMALL, "--run_dir", str(tmp_path)])
    assumed = make_run_plan(config, 50257, 1)  # as planned before the data said its vocabulary
    planning = counted_planning(monkeypatch)
    assert loop.train(config, StartDecision(assumed, RunDirChoice(tmp_path))) == 0
    assert [call[1] for call in planning] == [SYNTHETIC_VOCAB_SIZE]
    saved = ModelConfig.from_dict(json.loads((tmp_path / MODEL_CONFIG_FILE).read_text()))
    assert saved.vocab_size == SYNTHETIC_VOCAB_SIZE
