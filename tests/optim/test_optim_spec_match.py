"""Each optimizer against an independent float64 transcription of the specification."""

import math
from functools import partial

import numpy as np
import pytest
import torch

from danastar.optim import ADana, apply_schedule, build_optimizer, get_schedule

import optim_spec_reference as spec

SHAPES = [(6, 5), (11,), (2, 3, 4), (1,)]
STEPS = 35
PEAK_LR = 3e-3
# A constant decay (no wd_ts) must stay small: a larger one is refused (see weight_decay.py).
WEIGHT_DECAYS = [{}, {"weight_decay": 4e-4}, {"weight_decay": 0.5, "wd_ts": 10}]


def gradient(rng, step, index, shape):
    """Dense, all-zero, sparse and missing gradients, varying over the steps."""
    if index == 0 and step % 7 == 3:
        return np.zeros(shape)  # a zero gradient (not None): the tensor still takes a step
    if index == 3 and step % 5 == 0:
        return None  # no gradient: skipped, its step count does not advance
    g = rng.normal(0.2, 1.0, size=shape)
    if index == 1:
        g = g * (rng.random(shape) < 0.2)  # sparse: most coordinates get nothing
    return g


def run_against_spec(name, spec_step, hparams, device="cpu", dtype=torch.float64, **options):
    """35 steps of ``name`` against the float64 spec. Parameters of a narrower ``dtype`` are
    compared with a spec whose parameters (and gradients) are rounded to that dtype after every
    step, as the optimizer stores them; the tolerance allows for the optimizer's float32
    arithmetic (and, for bf16, one unit in the last place where a value lies near a tie)."""
    rng = np.random.default_rng(0)
    start = [rng.normal(size=shape) for shape in SHAPES]
    params = [torch.tensor(p, device=device).to(dtype).requires_grad_() for p in start]
    optimizer = build_optimizer(name, params, lr=PEAK_LR, **hparams, **options)
    schedule = get_schedule("cos_inf", warmup_steps=5, total_steps=STEPS)
    expected = [as_stored(p, dtype) for p in start]
    states = [spec.initial_state(shape) for shape in SHAPES]
    counts = [0] * len(SHAPES)
    for step in range(STEPS):
        factor = schedule(step)
        apply_schedule(optimizer, factor)
        for i, (param, shape) in enumerate(zip(params, SHAPES)):
            g = gradient(rng, step, i, shape)
            param.grad = None if g is None else torch.tensor(g, device=device).to(dtype)
            if g is not None:
                counts[i] += 1
                expected[i] = as_stored(spec_step(expected[i], as_stored(g, dtype), states[i],
                                                  counts[i], PEAK_LR * factor, factor,
                                                  **hparams), dtype)
        optimizer.step()
    tolerance = {torch.float64: dict(rtol=1e-12, atol=1e-15),
                 torch.float32: dict(rtol=2e-6, atol=1e-6),
                 torch.bfloat16: dict(rtol=2**-7, atol=1e-6)}[dtype]
    for param, want in zip(params, expected):
        np.testing.assert_allclose(param.detach().double().cpu().numpy(), want, **tolerance)


def as_stored(values, dtype):
    """``values`` (float64) rounded to ``dtype``, as a tensor of that dtype holds them."""
    return torch.tensor(values, dtype=torch.float64).to(dtype).double().numpy()


DANA = {
    "adana": partial(spec.dana_step, star=False),
    "dana-mk4": partial(spec.dana_step, star=False, clipsnr=2.0),
    "dana-star": partial(spec.dana_step, star=True),
    "dana-star-mk4": partial(spec.dana_step, star=True, clipsnr=2.0),
}


@pytest.mark.parametrize("impl", ["reference"])
@pytest.mark.parametrize("weight_decay", WEIGHT_DECAYS, ids=["no-wd", "wd", "wd-decaying"])
@pytest.mark.parametrize("name", list(DANA))
def test_dana_family_matches_spec(name, weight_decay, impl):
    run_against_spec(name, DANA[name], weight_decay, impl=impl)


def test_a_small_clipsnr_binds_in_the_spec():
    """The clipping test below is only meaningful if min(A, clipsnr) changes the update."""
    g = np.array([1.0, -0.5, 2.0])
    for star in (False, True):
        clipped = spec.dana_step(np.zeros(3), g, spec.initial_state((3,)), 1, 1e-3, 1.0,
                                 star=star, clipsnr=0.3)
        free = spec.dana_step(np.zeros(3), g, spec.initial_state((3,)), 1, 1e-3, 1.0, star=star)
        assert np.all(np.abs(clipped) < np.abs(free))


# The compiled path builds its kernel with a C++ compiler: a `process` test.
@pytest.mark.parametrize("impl", ["reference",
                                  pytest.param("compiled", marks=pytest.mark.process)])
@pytest.mark.parametrize("name, star", [("dana-mk4", False), ("dana-star-mk4", True)])
def test_snr_clipping_matches_spec_when_it_binds(name, star, impl):
    run_against_spec(name, partial(spec.dana_step, star=star), {"clipsnr": 0.3}, impl=impl)


@pytest.mark.parametrize("weight_decay", WEIGHT_DECAYS, ids=["no-wd", "wd", "wd-decaying"])
def test_adamw_decaying_wd_matches_spec(weight_decay):
    run_against_spec("adamw-decaying-wd", spec.adamw_decaying_wd_step, weight_decay)


@pytest.mark.parametrize("hparams", [
    {},
    {"weight_decay": 0.1, "alpha_warmup": 20, "beta3_warmup": 20, "betas": (0.9, 0.999, 0.99)},
    {"weight_decay": 0.5, "wd_ts": 10, "decaying_wd": True, "alpha_warmup": 20,
     "beta3_warmup": 50, "alpha": 8.0},
], ids=["plain", "warmups-coupled-wd", "warmups-decaying-wd"])
def test_ademamix_matches_spec(hparams):
    run_against_spec("ademamix", spec.ademamix_step, hparams)


def test_first_step_closed_form():
    """delta 8, kappa 0.85, g = 1: a = 8/9, m = v = 8/9, so the step is
    -(1/sqrt(8/9) + (1 + 2^0.15) sqrt(8/9)) lr, about -3.0496 lr."""
    lr = 1e-3
    param = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    optimizer = ADana([param], lr=lr, eps=0.0)
    param.grad = torch.ones(3, dtype=torch.float64)
    optimizer.step()
    exact = -(1 / math.sqrt(8 / 9) + (1 + 2 ** 0.15) * math.sqrt(8 / 9)) * lr
    torch.testing.assert_close(param.detach(), torch.full((3,), exact, dtype=torch.float64),
                               rtol=1e-14, atol=0)
    assert abs(exact / lr + 3.0496) < 1e-4
