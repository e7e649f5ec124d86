"""danastar.optax at the torch optimizers' edges: it refuses what they refuse, in the same
sentences (one module, danastar.hparams, says them for both), clamps the weight-decay factor to
[0, 1] as they do, and warns of a run too short for its decay."""

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")
torch = pytest.importorskip("torch")

from danastar.optax import (  # noqa: E402
    OPTIMIZERS,
    ShortRunWeightDecayWarning,
    adana,
    dana_star,
    log_time_weight_decay,
)
from danastar.optim import ADana, DanaStar, build_optimizer  # noqa: E402

from optax_cases import float64, run  # noqa: E402


def refusal(build) -> str:
    with pytest.raises(ValueError) as error:
        build()
    message = str(error.value)
    assert "\n" not in message
    return message


def torch_param(dtype=torch.float32):
    return [torch.zeros(3, dtype=dtype, requires_grad=dtype.is_floating_point)]


# The same bad input to both frameworks: (torch, optax), each a call that must be refused.
SAME_INPUT = {
    "negative-lr": (lambda: ADana(torch_param(), lr=-1e-3), lambda: adana(-1e-3)),
    "string-lr": (lambda: ADana(torch_param(), lr="1e-3"), lambda: adana("1e-3")),
    "no-lr": (lambda: DanaStar(torch_param(), lr=None), lambda: dana_star(None)),
    "bad-delta": (lambda: ADana(torch_param(), delta=0.0), lambda: adana(delta=0.0)),
    "string-kappa": (lambda: ADana(torch_param(), kappa="0.8"), lambda: adana(kappa="0.8")),
    "negative-eps": (lambda: ADana(torch_param(), eps=-1.0), lambda: adana(eps=-1.0)),
    "bogus-state-dtype": (lambda: ADana(torch_param(), state_dtype="bogus"),
                          lambda: adana(state_dtype="bogus")),
    "float16-state": (lambda: ADana(torch_param(), state_dtype="float16"),
                      lambda: adana(state_dtype="float16")),
    "negative-omega": (lambda: ADana(torch_param(), omega=-1.0, total_steps=100),
                       lambda: adana(omega=-1.0, total_steps=100)),
    "fractional-steps": (lambda: ADana(torch_param(), omega=4.0, total_steps=10.5),
                         lambda: adana(omega=4.0, total_steps=10.5)),
    "integer-parameter": (lambda: ADana([torch.zeros(3, dtype=torch.int32)]),
                          lambda: adana().init({"w": jnp.zeros(3, jnp.int32)})),
    "complex-parameter": (
        lambda: ADana([torch.ones(3, dtype=torch.complex64, requires_grad=True)]),
        lambda: adana().init({"w": jnp.ones(3, jnp.complex64)})),
    "boolean-parameter": (lambda: DanaStar([torch.zeros(3, dtype=torch.bool)]),
                          lambda: dana_star().init([jnp.zeros(3, bool)])),
}


@pytest.mark.parametrize("case", list(SAME_INPUT))
def test_torch_and_optax_refuse_the_same_input_in_the_same_sentence(case):
    build_torch, build_optax = SAME_INPUT[case]
    assert refusal(build_torch) == refusal(build_optax)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_each_alias_refuses_what_it_would_compute_wrongly(name):
    alias = OPTIMIZERS[name]
    assert "lr must be >= 0, got -0.001" == refusal(lambda: alias(-1e-3))
    assert "state_dtype must be one of float32, bfloat16" in refusal(
        lambda: alias(state_dtype=jnp.float16))
    # a leaf that is not an array, whose update jax would fail on or mangle
    message = refusal(lambda: alias().init({"w": jnp.zeros(2), "name": "embedding"}))
    assert message.startswith("the parameter leaf at ['name'] is a str, not an array")
    # integer and complex leaves: the update would be truncated, or mix the parts
    assert "int32" in refusal(lambda: alias().init({"w": jnp.zeros(2, jnp.int32)}))
    assert "complex64" in refusal(lambda: alias().init({"w": jnp.zeros(2, jnp.complex64)}))
    # what stays accepted: float32 state by name, bfloat16 state, float leaves under jit
    for state_dtype in ("float32", jnp.float32, "bfloat16", jnp.bfloat16):
        jax.jit(alias(state_dtype=state_dtype).init)({"w": jnp.zeros(2, jnp.bfloat16)})


def test_float32_state_keeps_float64_leaves_wide_as_torch_does():
    with float64():
        state = adana(state_dtype="float32").init({"w": jnp.zeros(2, jnp.float64)})
        assert state[0].mu["w"].dtype == jnp.float64
    state = adana(state_dtype="bfloat16").init({"w": jnp.zeros(2, jnp.float32)})
    assert state[0].mu["w"].dtype == jnp.bfloat16


def quiet(build, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShortRunWeightDecayWarning)
        return build(*args, **kwargs)


def test_a_short_run_zeroes_a_weight_instead_of_flipping_it():
    """adana(1e-9, omega=4, total_steps=10) with zero gradients took a weight 1 -> -1 -> 0.33 ->
    0 (the factors 1 - 4/(1 + k)); the factor is now clamped to 0, then 0.2 at step 4."""
    optimizer = quiet(adana, 1e-9, omega=4.0, total_steps=10)
    params = {"w": jnp.ones(3)}
    state = optimizer.init(params)
    trace = []
    for _ in range(4):
        updates, state = optimizer.update(jax.tree.map(jnp.zeros_like, params), state, params)
        params = optax.apply_updates(params, updates)
        trace.append(float(params["w"][0]))
    assert trace == [0.0, 0.0, 0.0, 0.0]
    # where the factor is in [0, 1] it is the paper's: omega 4 over wd_ts 4 (T = 40)
    decay = quiet(log_time_weight_decay, 1.0, 4)
    params = {"w": jnp.ones(2)}
    state = decay.init(params)
    for expected in (0.2, 1 / 3, 3 / 7, 1 / 2):  # 1 - 4/(4 + k) for k = 1 .. 4
        updates, state = decay.update(jax.tree.map(jnp.zeros_like, params), state, params)
        new = optax.apply_updates(params, updates)
        np.testing.assert_allclose(new["w"] / params["w"], expected, rtol=1e-6)
        params = new


@pytest.mark.parametrize("name", ["adana", "dana-star-mk4"])
def test_a_short_run_steps_as_torch_does_where_the_factor_is_clamped(name):
    """T = 30 (omega 4 over wd_ts 3: the first factor 1 - 4/4 = 0 at the schedule's peak) with
    gradients: optax and torch give the same weights, step for step."""
    rng = np.random.default_rng(0)
    start = [rng.normal(size=(4, 3)), rng.normal(size=(5,))]
    grads = [[rng.normal(size=p.shape) for p in start] for _ in range(8)]
    with float64():
        params = [jnp.asarray(p) for p in start]
        optimizer = quiet(OPTIMIZERS[name], 1e-2, omega=4.0, total_steps=30)
        got, _ = run(optimizer, params, [[jnp.asarray(g) for g in step] for step in grads])
    tensors = [torch.tensor(p, requires_grad=True) for p in start]
    torch_optimizer = quiet(build_optimizer, name, tensors, lr=1e-2, omega=4.0, total_steps=30)
    for step in grads:
        for tensor, g in zip(tensors, step):
            tensor.grad = torch.tensor(g)
        torch_optimizer.step()
    for g, t in zip(jax.tree.leaves(got), tensors):
        np.testing.assert_allclose(np.asarray(g), t.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_a_short_run_is_warned_of_once_naming_the_fix():
    with pytest.warns(ShortRunWeightDecayWarning) as caught:
        adana(1e-3, omega=4.0, total_steps=20)
    assert len(caught) == 1 and caught[0].filename == __file__
    message = str(caught[0].message)
    with pytest.warns(ShortRunWeightDecayWarning) as torch_caught:
        ADana(torch_param(), lr=1e-3, omega=4.0, total_steps=20)
    assert message == str(torch_caught[0].message)  # the same sentence in both frameworks
    assert "a longer total_steps, a smaller omega, or omega=0" in message
    with pytest.warns(ShortRunWeightDecayWarning, match="weight_decay=0 for a smoke test"):
        log_time_weight_decay(4.0, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShortRunWeightDecayWarning)
        adana(1e-3, omega=4.0, total_steps=1000)
        adana(1e-3)
