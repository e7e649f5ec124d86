"""The runners table: each group's path is picked once from (impl, capturable, flat), a missing
row is the refusal, and a new path is one runner class and one row."""

import pytest
import torch

from danastar.optim import ADana, AdEMAMix
from danastar.optim import runners as runners_module
from danastar.optim.runners import MISSING, RUNNERS, ReferenceRunner
from danastar.optim.runners.capturable import CapturableRunner
from danastar.optim.runners.flat import FlatRunner


def make_params():
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator).requires_grad_() for shape in
            [(4, 3), (3,)]]


def run(optimizer, params, steps=3):
    for step in range(steps):
        for param in params:
            param.grad = torch.full_like(param, 0.1 * (step + 1))
        optimizer.step()


def test_every_combination_has_a_row_or_a_refusal():
    for impl in runners_module.IMPLS:
        for capturable in (False, True):
            for flat in (False, True):
                assert ((impl, capturable, flat) in RUNNERS) != ((capturable, flat) in MISSING)


@pytest.mark.parametrize("options, runner", [
    ({}, ReferenceRunner), ({"flat": True}, FlatRunner),
    ({"capturable": True}, CapturableRunner),
])
def test_a_group_keeps_the_runner_its_settings_pick(options, runner):
    params = make_params()
    optimizer = ADana(params, lr=1e-2, impl="reference", **options)
    run(optimizer, params, 1)
    first = optimizer.runner(0)
    run(optimizer, params, 2)
    assert type(first) is runner
    assert optimizer.runner(0) is first


def test_a_missing_row_is_refused_with_its_sentence():
    with pytest.raises(ValueError, match="ADana: capturable=True keeps one step count per "
                                         "tensor on the device, which flat buffers cannot"):
        ADana(make_params(), capturable=True, flat=True)
    optimizer = ADana(make_params(), lr=1e-2)
    with pytest.raises(ValueError, match="drop flat=True or capturable=True"):
        optimizer.add_param_group({"params": [torch.zeros(2, requires_grad=True)],
                                   "capturable": True, "flat": True})
    assert len(optimizer.param_groups) == 1  # the refused group is not kept


def test_a_new_path_is_one_runner_and_one_row(monkeypatch):
    """A runner that counts its steps, put in the table's reference row, runs every step of
    every optimizer built after it, with the reference path's numbers."""
    class CountingRunner(ReferenceRunner):
        steps = 0

        def step(self):
            CountingRunner.steps += 1
            super().step()

    monkeypatch.setitem(RUNNERS, ("reference", False, False), CountingRunner)
    counted, plain = make_params(), make_params()
    run(AdEMAMix(counted, lr=1e-2, impl="reference"), counted)
    monkeypatch.undo()
    run(AdEMAMix(plain, lr=1e-2, impl="reference"), plain)
    assert CountingRunner.steps == 3
    assert all(torch.equal(a, b) for a, b in zip(counted, plain))


def test_a_loaded_state_dict_gives_the_new_groups_their_runners():
    params = make_params()
    optimizer = ADana(params, lr=1e-2, flat=True)
    run(optimizer, params, 2)
    before = optimizer.runner(0)
    optimizer.load_state_dict(optimizer.state_dict())
    after = optimizer.runner(0)
    assert after is not before and after.group is optimizer.param_groups[0]
    run(optimizer, params, 1)
