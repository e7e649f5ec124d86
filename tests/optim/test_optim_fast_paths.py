"""The compiled path against the reference path."""

import pytest
import torch
from torch._dynamo.utils import counters

from danastar.optim import ADana, AdEMAMix, DanaStar

SHAPES = [(16, 8), (8,), (3, 5, 2), (1,)]
DANA_VARIANTS = {
    "adana": (ADana, {}),
    "dana-mk4": (ADana, {"clipsnr": 2.0}),
    "dana-star": (DanaStar, {}),
    "dana-star-mk4": (DanaStar, {"clipsnr": 2.0}),
}
HPARAMS = {"weight_decay": 0.3, "wd_ts": 5}


def make_params(dtypes):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator, dtype=dtype).requires_grad_()
            for shape, dtype in zip(SHAPES, dtypes)]


def train(cls, params, impl, steps, on_step=None, **hparams):
    """Steps with gradients that vary and a LambdaLR schedule that changes the LR every step."""
    optimizer = cls(params, lr=1e-2, impl=impl, **hparams)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + 0.1 * step))
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        for i, param in enumerate(params):
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float64)
            param.grad = (noise + 0.3).to(param.dtype)
            if i == 3 and step % 4 == 2:
                param.grad = None  # this tensor's step count falls behind the others
        optimizer.step()
        scheduler.step()
        if on_step is not None:
            on_step(step)
    return [p.detach() for p in params]


def assert_paths_agree(result, reference, dtype):
    tolerance = {"rtol": 1e-12, "atol": 1e-14} if dtype == torch.float64 else \
        {"rtol": 1e-5, "atol": 1e-6}
    for got, want in zip(result, reference):
        torch.testing.assert_close(got, want, **tolerance)


@pytest.mark.parametrize("cls, hparams", [
    (ADana, {"clipsnr": 2.0}),
    (DanaStar, {"clipsnr": 2.0}),
    pytest.param(AdEMAMix, {"alpha_warmup": 10, "beta3_warmup": 10}, marks=pytest.mark.slow),
], ids=["dana-mk4", "dana-star-mk4", "ademamix"])
@pytest.mark.process  # the compiled path builds its kernel with a C++ compiler
def test_compiled_matches_reference_without_recompiling(cls, hparams):
    """A group mixing a float64 and a float32 tensor (one compiled graph covers both), 20 steps
    with the LR changing every step: the graph is built on the first step and never again."""
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    dtypes = [torch.float64, torch.float32]
    graphs = []

    def count_graphs(step):
        graphs.append(counters["stats"]["unique_graphs"] - before)

    compiled = train(cls, make_params(dtypes), "compiled", 20, count_graphs, **hparams,
                     **HPARAMS)
    reference = train(cls, make_params(dtypes), "reference", 20, **hparams, **HPARAMS)
    for got, want, dtype in zip(compiled, reference, dtypes):
        assert_paths_agree([got], [want], dtype)
    assert graphs == [1] * 20


def test_automatic_choice_and_compile_fallback(monkeypatch):
    """Small CPU groups use the reference loop; large ones compile; a failed compile falls back
    (with a warning) when the path was chosen automatically, and raises when it was asked for."""
    from danastar.optim import base
    from danastar.optim.runners import compiled

    small = [torch.zeros(10, requires_grad=True)]
    assert ADana(small, lr=1e-3).resolve_impl(small) == "reference"
    assert AdEMAMix(small, lr=1e-3).resolve_impl(small) == "reference"
    monkeypatch.setattr(base, "CPU_COMPILE_MIN_ELEMENTS", 0)
    assert ADana(small, lr=1e-3).resolve_impl(small) == "compiled"

    def broken_compiler(loop):
        def fail(*args):
            raise RuntimeError("no C++ compiler")
        return fail

    monkeypatch.setattr(compiled, "compile_copy", broken_compiler)
    automatic, reference = make_params([torch.float32] * 4), make_params([torch.float32] * 4)
    with pytest.warns(UserWarning, match="no C\\+\\+ compiler"):
        train(ADana, automatic, None, 3)
    train(ADana, reference, "reference", 3)
    for a, b in zip(automatic, reference):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        train(ADana, make_params([torch.float32] * 4), "compiled", 1)
