"""danastar's optimizers in the Hugging Face Trainer (danastar.integrations.hf), on the CPU with
the tiny Llama of docs/examples/hf_trainer.py (built from a config, no hub): the example trains,
the weight decay follows from the Trainer's T, the LR each step is the Trainer's schedule's, a
resumed run continues bit for bit, a finished run continues past its T (ExtendRun), and AdamW's
weight decay is refused."""

import warnings

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from danastar.integrations.hf import (  # noqa: E402
    DanastarTrainer,
    ExtendRun,
    optimizer_cls_and_kwargs,
)
from danastar.optim import ADana, DanaStar, ShortRunWeightDecayWarning  # noqa: E402
from danastar.optim.group_scalars import schedule_factor  # noqa: E402


@pytest.fixture
def hf(example):
    return example("hf_trainer")


class StepRecorder:
    """Every optimizer step's group LR and schedule factor, read by a step pre-hook (what the
    update sees) on whatever optimizer steps."""

    def __init__(self):
        self.steps: list[dict] = []

    def __enter__(self):
        self.handle = register_optimizer_step_pre_hook(self.record)
        return self

    def record(self, optimizer, args, kwargs):
        if isinstance(optimizer, ADana | DanaStar):
            group = optimizer.param_groups[0]
            self.steps.append({"lr": group["lr"], "factor": schedule_factor(group)})

    def __exit__(self, *exc):
        self.handle.remove()


def losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_the_example_trains_with_the_trainers_schedule_and_the_papers_decay(hf, tmp_path):
    steps = 30
    with StepRecorder() as recorded:
        trainer = hf.main(output_dir=str(tmp_path), steps=steps)
    loss = losses(trainer)
    # Counting is learnt: the mean loss of the last 10 steps is far below the first 10's (3.9 ->
    # 2.3 with transformers 5, 3.7 -> 2.8 with 4.47; ln 64 = 4.16 is a uniform guess).
    assert loss[-1] < loss[0] - 0.5, loss

    optimizer = trainer.optimizer.optimizer  # accelerate's wrapper around ADana
    decay, no_decay = optimizer.param_groups
    assert type(optimizer) is ADana
    assert decay["wd_ts"] == steps // 10 and decay["weight_decay"] == 4.0 / (steps // 10)
    assert no_decay["weight_decay"] == 0.0
    assert "model.embed_tokens.weight" in no_decay["names"]
    assert "model.norm.weight" in no_decay["names"]
    assert "model.layers.0.mlp.up_proj.weight" in decay["names"]

    # The LR each update saw is the Trainer's scheduler's, step for step (the same scheduler
    # rebuilt from the arguments); the schedule factor is that LR over the peak.
    args = trainer.args
    probe = torch.optim.SGD([torch.zeros(1)], lr=args.learning_rate)
    scheduler = transformers.get_scheduler(
        args.lr_scheduler_type, probe, num_warmup_steps=args.warmup_steps,
        num_training_steps=steps, scheduler_specific_kwargs=args.lr_scheduler_kwargs)
    expected = []
    for _ in range(steps):
        expected.append(scheduler.get_last_lr()[0])
        probe.step()
        scheduler.step()
    assert [step["lr"] for step in recorded.steps] == pytest.approx(expected, rel=1e-12)
    assert [step["factor"] for step in recorded.steps] == pytest.approx(
        [lr / args.learning_rate for lr in expected], rel=1e-12)
    assert recorded.steps[0]["factor"] < 0.1 and max(s["factor"] for s in recorded.steps) == 1


def test_a_resumed_run_continues_bit_for_bit(hf, tmp_path):
    """DanastarTrainer, with T from the epochs (96 sequences, batch 8: 12 steps), saved at step 6
    and resumed there by a fresh Trainer, ends with the same parameters and the same losses as
    the run that was never stopped: the optimizer's state, its step counts and the scheduler
    come back exactly (the CPU's kernels are deterministic, so no tolerance is needed)."""

    def run(output_dir, resume=None):
        args = hf.training_arguments(str(output_dir), max_steps=-1, num_train_epochs=1,
                                     save_strategy="steps", save_steps=6, logging_steps=1)
        trainer = DanastarTrainer(hf.tiny_llama(), args,
                                  train_dataset=hf.CountingSequences(count=96),
                                  optimizer_name="dana-star-mk4")
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    whole = run(tmp_path / "whole")
    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "whole" / "checkpoint-6"))
    optimizer = whole.optimizer.optimizer
    assert type(optimizer) is DanaStar and optimizer.param_groups[0]["clipsnr"] == 2.0
    assert whole.state.global_step == resumed.state.global_step == 12
    assert optimizer.param_groups[0]["wd_ts"] == 12 // 10  # T from the Trainer's epochs
    # The resumed history holds the first 6 steps' losses as saved, then its own 6.
    assert len(losses(resumed)) == len(losses(whole)) == 12
    assert losses(resumed)[6:] == losses(whole)[6:]
    for (name, a), (_, b) in zip(whole.model.named_parameters(),
                                 resumed.model.named_parameters()):
        assert torch.equal(a, b), name
    state_whole = whole.optimizer.state_dict()["state"]
    state_resumed = resumed.optimizer.state_dict()["state"]
    for index, buffers in state_whole.items():
        for key, value in buffers.items():
            assert torch.equal(value, state_resumed[index][key]), (index, key)


def test_adamw_weight_decay_in_the_arguments_is_refused_with_the_right_call(hf, tmp_path):
    model = hf.tiny_llama()
    args = hf.training_arguments(str(tmp_path), weight_decay=0.1)
    with pytest.raises(ValueError) as refused:
        optimizer_cls_and_kwargs(model, args, "adana")
    message = str(refused.value)
    assert "TrainingArguments(weight_decay=0.1) is AdamW's decay" in message
    assert "optimizer_cls_and_kwargs(model, args, 'adana', omega=4.0)" in message
    with pytest.raises(ValueError, match="AdamW's decay"):
        DanastarTrainer(model, args, train_dataset=hf.CountingSequences())


def test_an_unknown_run_length_or_optimizer_is_refused(hf, tmp_path):
    model = hf.tiny_llama()
    epochs = hf.training_arguments(str(tmp_path), max_steps=-1, num_train_epochs=1)
    with pytest.raises(ValueError, match=r"TrainingArguments\(max_steps=T\)"):
        optimizer_cls_and_kwargs(model, epochs, "adana")
    with pytest.raises(ValueError, match="'adamw' is not one of danastar's optimizers"):
        optimizer_cls_and_kwargs(model, hf.training_arguments(str(tmp_path)), "adamw")


def test_a_run_too_short_for_the_papers_decay_is_warned_of_in_the_trainers_words(hf, tmp_path):
    """A 4-step run took weight_decay 4.0 over wd_ts 1, whose first factors were 1 - 4/2 = -1:
    the factor is clamped now, and the helper says the run is too short, naming the fix."""
    model = hf.tiny_llama()
    args = hf.training_arguments(str(tmp_path), steps=4)
    with pytest.warns(ShortRunWeightDecayWarning) as caught:
        cls, kwargs = optimizer_cls_and_kwargs(model, args, "adana")
    assert len(caught) == 1 and caught[0].filename == __file__
    message = str(caught[0].message)
    assert "omega 4 over wd_ts = 1 step: weight_decay 4" in message
    assert "TrainingArguments max_steps" in message and "omega=0 (no decay)" in message
    # no word where the run is long enough, or where the decay is off
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShortRunWeightDecayWarning)
        optimizer_cls_and_kwargs(model, hf.training_arguments(str(tmp_path), steps=1000),
                                 "adana")
        optimizer_cls_and_kwargs(model, args, "adana", omega=0.0)
    # DanastarTrainer says it once, when it builds the optimizer
    trainer = DanastarTrainer(model, args, train_dataset=hf.CountingSequences(count=32))
    with pytest.warns(ShortRunWeightDecayWarning) as caught:
        trainer.create_optimizer_and_scheduler(4)
    assert len(caught) == 1 and "TrainingArguments max_steps" in str(caught[0].message)


def test_no_optimizer_name_can_be_registered_so_the_trainer_takes_a_class_or_an_optimizer(
        hf, tmp_path):
    """TrainingArguments(optim=...) knows transformers' own names only (an enum, read when the
    arguments are made), as docs/porting.md says; the routes it names work: the class and its
    keywords (the example above), or an optimizer built from them, `optimizers=(opt, None)`."""
    with pytest.raises(ValueError, match="adana is not a valid OptimizerNames"):
        hf.training_arguments(str(tmp_path), optim="adana")
    model = hf.tiny_llama()
    args = hf.training_arguments(str(tmp_path), steps=3)
    cls, kwargs = optimizer_cls_and_kwargs(model, args, "adana", omega=0.0)
    trainer = transformers.Trainer(model, args, train_dataset=hf.CountingSequences(count=24),
                                   optimizers=(cls(**kwargs), None))
    with StepRecorder() as recorded:
        trainer.train()
    assert type(trainer.optimizer.optimizer) is ADana and trainer.state.global_step == 3
    assert len(recorded.steps) == 3 and recorded.steps[0]["factor"] < 1  # the Trainer's warm-up


def test_a_finished_run_extended_with_extend_run_has_no_jump_and_resumes_bit_for_bit(hf, tmp_path):
    """A run of 8 steps (saved at its end) continued to 16 by ExtendRun: the LR re-warms from
    the floor where cosine_with_min_lr left it, the decay is re-anchored without a jump, and,
    resumed at step 12 by the same callback, the run ends as the one that was never stopped."""
    planned, longer = 8, 16

    def run(output_dir, steps, resume=None, extend=None):
        args = hf.training_arguments(str(output_dir), steps=steps, save_strategy="steps",
                                     save_steps=4, logging_steps=1, warmup_steps=2)
        trainer = DanastarTrainer(hf.tiny_llama(), args, train_dataset=hf.CountingSequences(),
                                  optimizer_name="adana", callbacks=[extend] if extend else [])
        with StepRecorder() as recorded, warnings.catch_warnings():
            warnings.simplefilter("ignore", ShortRunWeightDecayWarning)  # a short test run
            trainer.train(resume_from_checkpoint=resume)
        return trainer, recorded.steps

    def extend():
        return ExtendRun(planned, planned, lr_rule="rewarm", decay_rule="reanchor",
                         rewarm_steps=2)

    first, before = run(tmp_path / "first", planned)
    group = first.optimizer.optimizer.param_groups[0]
    at_join = first.optimizer.optimizer.scalars_for(group, planned + 1)["decay"]
    whole, after = run(tmp_path / "first", longer, f"{tmp_path}/first/checkpoint-{planned}",
                       extend())
    optimizer = whole.optimizer.optimizer
    assert optimizer.param_groups[0]["wd_ts"] == longer // 10
    assert abs(optimizer.scalars_for(optimizer.param_groups[0], planned + 1)["decay"]
               - at_join) < 1e-15
    # the join's step has the LR the planned run would have had there, then up to the peak
    assert after[0]["factor"] == pytest.approx(0.1, rel=1e-12)
    assert before[-1]["factor"] > 0.1
    assert after[1]["factor"] == pytest.approx(0.55) and after[2]["factor"] == pytest.approx(1)
    resumed, _ = run(tmp_path / "resumed", longer, f"{tmp_path}/first/checkpoint-12", extend())
    for (name, a), (_, b) in zip(whole.model.named_parameters(),
                                 resumed.model.named_parameters()):
        assert torch.equal(a, b), name


def test_extend_run_gives_the_trainers_adamw_the_planned_runs_coupled_decay_once(hf, tmp_path):
    """The Trainer's own AdamW, its λ planned for 8 steps, continued to 16 with decay_rule
    'planned': λ·8/16 from the join, and a resume after the join (the same callback again)
    holds it rather than halving it twice."""
    planned, longer = 8, 16

    def run(steps, resume=None, extend=None):
        args = hf.training_arguments(str(tmp_path), steps=steps, save_strategy="steps",
                                     save_steps=4, warmup_steps=2, weight_decay=0.4)
        trainer = transformers.Trainer(hf.tiny_llama(), args,
                                       train_dataset=hf.CountingSequences(),
                                       callbacks=[extend] if extend else [])
        trainer.train(resume_from_checkpoint=resume)
        return [group["weight_decay"] for group in trainer.optimizer.optimizer.param_groups]

    def extend():
        return ExtendRun(planned, planned, lr_rule="rewarm", decay_rule="planned")

    assert max(run(planned)) == 0.4
    assert max(run(longer, f"{tmp_path}/checkpoint-{planned}", extend())) == 0.4 * 8 / 16
    assert max(run(longer, f"{tmp_path}/checkpoint-12", extend())) == 0.4 * 8 / 16
