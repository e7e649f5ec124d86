"""The loop's pieces on their own: one optimizer step, and when to checkpoint."""

import contextlib

import pytest
import torch

from danastar.config import CheckpointSection
from danastar.models import ModelConfig, build_model
from danastar.optim import build_optimizer
from danastar.train.checkpoint import checkpoint_kind
from danastar.train.parallel import Distributed
from danastar.train.step import train_step


class FixedBatches:
    """The one method `train_step` asks of the run's data: a batch per (step, micro-step)."""

    def __init__(self, vocab: int, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)
        self.vocab = vocab

    def train_batch(self, step: int, micro_step: int):
        tokens = torch.randint(0, self.vocab, (2, 9), generator=self.generator)
        return tokens[:, :-1], tokens[:, 1:]


def tiny():
    torch.manual_seed(0)
    config = ModelConfig(arch="enoki", n_layer=1, n_head=2, n_embd=32, head_dim=16,
                         mlp_hidden=64, vocab_size=64, max_seq_len=16)
    model = build_model(config)
    optimizer = build_optimizer("adana", model.param_groups(0.0), lr=1e-2)
    return model, optimizer


SINGLE = Distributed("single", 0, 0, 1, torch.device("cpu"), 0, 1)


def test_train_step_accumulates_clips_and_steps():
    model, optimizer = tiny()
    before = [p.detach().clone() for p in model.parameters()]
    result = train_step(model, optimizer, FixedBatches(64), 0, acc_steps=2, grad_clip=0.5,
                        autocast=contextlib.nullcontext(), env=SINGLE)
    assert result.finite and not result.stop_requested
    assert result.objective > result.cross_entropy > 0  # the objective adds the z-loss
    assert result.grad_norm > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())  # ready for the next step


def test_train_step_skips_a_non_finite_step():
    model, optimizer = tiny()
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    before = [p.detach().clone() for p in model.parameters()]
    result = train_step(model, optimizer, FixedBatches(64), 0, acc_steps=1, grad_clip=0.5,
                        autocast=contextlib.nullcontext(), env=SINGLE, stop_requested_here=True)
    assert not result.finite and result.stop_requested
    for a, b in zip(before, model.parameters()):
        torch.testing.assert_close(a, b.detach(), equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("step, stopping, expected", [
    (3, False, "latest"), (4, False, None), (10, False, "permanent"), (7, False, None),
    (7, True, "latest"), (12, False, "latest"),
])
def test_checkpoint_kind(step, stopping, expected):
    settings = CheckpointSection(latest_every=3, permanent_every=10)
    assert checkpoint_kind(step, 12, settings, stopping) == expected
