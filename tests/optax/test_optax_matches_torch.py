"""The optax optimizers against the torch ones and the float64 spec oracle: the same gradient
sequence (200 steps, four shapes: dense, sparse and sometimes all-zero gradients), the same
schedule factor, the same hyperparameters, equal parameters to rounding."""

import numpy as np
import pytest

jnp = pytest.importorskip("jax.numpy")
pytest.importorskip("optax")
torch = pytest.importorskip("torch")

from optax_cases import (  # noqa: E402 (after the skips)
    ORACLE,
    STEPS,
    float64,
    gradients,
    run_optax,
    run_oracle,
    run_torch,
    schedule_factors,
    starting_point,
)

# A constant decay must stay small (a larger one is refused); wd_ts decays a large one.
WEIGHT_DECAYS = [{}, {"weight_decay": 4e-4}, {"weight_decay": 0.5, "wd_ts": 10}]
LARGEST_PARAM = 4.0  # every parameter stays below this in magnitude (checked)


def tolerance(dtype) -> float:
    """Four units in the last place of the largest parameter per step. Each framework rounds
    every step's arithmetic in its own order (XLA fuses and reorders it; torch multiplies by a
    decay multiplier rounded to the dtype, optax adds the decay's small part separately), a
    few half-ulp roundings per step that add up at most linearly over the steps. A real
    difference in the method (a step count off by one, eps in the wrong place, the decay
    scaled by the learning rate) moves the parameters by 1e-6 or more, far above the float64
    bound (7e-13)."""
    return STEPS * 4 * float(np.spacing(np.asarray(LARGEST_PARAM, dtype=dtype)))


def assert_close(got, want, dtype):
    for g, w in zip(got, want):
        assert np.abs(w).max() < LARGEST_PARAM
        np.testing.assert_allclose(g, w, rtol=0, atol=tolerance(dtype))


CASES = [pytest.param(name, wd, id=f"{name}-{label}") for name in ORACLE
         for wd, label in zip(WEIGHT_DECAYS, ["no-wd", "wd", "wd-decaying"])]
# A clip of 0.3 binds on most coordinates (the default 2 rarely does on these gradients).
CASES += [pytest.param(name, {"clipsnr": 0.3}, id=f"{name}-clip-binding")
          for name in ("dana-mk4", "dana-star-mk4")]


@pytest.mark.parametrize("name, hparams", CASES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_optax_equals_torch_and_the_spec(name, hparams, dtype):
    grads, start, factors = gradients(), starting_point(), schedule_factors()
    torch_dtype = getattr(torch, dtype)
    if dtype == "float64":
        with float64():
            got = run_optax(name, start, grads, factors, jnp.float64, **hparams)
    else:
        got = run_optax(name, start, grads, factors, jnp.float32, **hparams)
    assert_close(got, run_torch(name, start, grads, factors, torch_dtype, **hparams), dtype)
    assert_close(got, run_oracle(name, start, grads, factors, torch_dtype, **hparams), dtype)


@pytest.mark.parametrize("name", ["dana-mk4", "dana-star-mk4"])
def test_bfloat16_parameters_match_torch_to_one_unit(name):
    """bf16 parameters, float32 state in both frameworks: each step computes in float32 and
    rounds the parameter to bf16 once; a float32 difference can only move that rounding across
    a tie, one bf16 unit."""
    grads, start, factors = gradients(), starting_point(), schedule_factors()
    hparams = {"weight_decay": 0.5, "wd_ts": 10}
    got = run_optax(name, start, grads, factors, jnp.bfloat16, **hparams)
    want = run_torch(name, start, grads, factors, torch.bfloat16, **hparams)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2 ** -8, atol=0)


def test_the_two_frameworks_differ_where_the_method_does():
    """The comparison above can fail: Dana-MK4 and ADana, or a shifted schedule, are told
    apart by far more than the tolerance."""
    grads, start, factors = gradients(steps=STEPS), starting_point(), schedule_factors()
    with float64():
        mk4 = run_optax("dana-mk4", start, grads, factors, jnp.float64, clipsnr=0.3)
        shifted = run_optax("adana", start, grads, np.roll(factors, 1), jnp.float64)
    adana = run_torch("adana", start, grads, factors, torch.float64)
    for other in (mk4, shifted):
        assert max(np.abs(a - b).max() for a, b in zip(other, adana)) > 1e3 * tolerance(
            "float64")
