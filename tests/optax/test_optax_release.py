"""The differences from the original release's JAX functions (mlexpos/adana, jax/optimizers.py:
adana_optimizer, dana_mk4_optimizer, dana_star_mk4_optimizer), each shown here, and
``convention="release"``, which reproduces them.

The release's JAX functions, written out below from their formulas in float64, at the 0-based
update count t, with the release's gradient and momentum coefficients g2 and g3 and its weight
decay wd:

    a = delta / (delta + t);  v <- (1 - a) v + a g^2;  m <- (1 - a) m + a g;  D = sqrt(v) + eps
    Dana-Star: tau <- (1 - a) tau + a |g| / (|g| + D)
    ADana:     A = max(t, 1)^(1 - kappa) |m| / D;    u = g2 g / D + g3 sign(m) (A + |m| / D)
    Dana-Star: tau_r = max(p_hat, 1 / (1 + t));  N = sqrt(tau_r) / D
               A = max(tau t, 1)^(1 - kappa) |m| N / tau_r
               u = g2 g N + g3 sign(m) (tau_r A + |m| N)
    (A = min(A, clipsnr) in the mk4 variants)
    p <- p - lr_t (u + wd p)
"""

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")

from danastar.optax import OPTIMIZERS, adana, dana_mk4  # noqa: E402

from optax_cases import float64, gradients, starting_point  # noqa: E402


def release_step(p, g, state, t, lr, *, star, g2, g3, wd, delta=8.0, kappa=1.0, clipsnr=None,
                 eps=1e-8):
    a = delta / (delta + t)
    v = (1 - a) * state["v"] + a * g * g
    m = (1 - a) * state["m"] + a * g
    D = np.sqrt(v) + eps
    if not star:
        A = max(t, 1) ** (1 - kappa) * np.abs(m) / D
        if clipsnr is not None:
            A = np.minimum(A, clipsnr)
        u = g2 * g / D + g3 * np.sign(m) * (A + np.abs(m) / D)
    else:
        tau = (1 - a) * state["tau"] + a * np.abs(g) / (np.abs(g) + D)
        tau_hat = np.minimum(tau, 0.5)
        tau_r = np.maximum(tau_hat / (1 - tau_hat), 1 / (1 + t))
        N = np.sqrt(tau_r) / D
        A = np.maximum(tau * t, 1) ** (1 - kappa) * np.abs(m) * N / tau_r
        if clipsnr is not None:
            A = np.minimum(A, clipsnr)
        u = g2 * g * N + g3 * np.sign(m) * (tau_r * A + np.abs(m) * N)
        state["tau"] = tau
    state.update(m=m, v=v)
    return p - lr * (u + wd * p)


RELEASE = {"adana": dict(star=False), "dana-mk4": dict(star=False, clipsnr=2.0),
           "dana-star": dict(star=True), "dana-star-mk4": dict(star=True, clipsnr=2.0)}


@pytest.mark.parametrize("kappa", [1.0, 0.85], ids=["release-default-kappa", "kappa-0.85"])
@pytest.mark.parametrize("name", list(RELEASE))
def test_release_convention_reproduces_the_release(name, kappa):
    """The release's coefficients map onto the alias as learning_rate = g2 lr_t, momentum_scale
    = g3 / g2 and weight_decay = wd / g2 (the release adds wd p before its learning rate)."""
    steps, g2, g3, wd = 100, 1.5, 0.6, 0.01
    grads, start = gradients(steps=steps), starting_point()
    lr = optax.cosine_decay_schedule(3e-3, steps, alpha=0.1)
    expected = [p.copy() for p in start]
    states = [{"m": 0 * p, "v": 0 * p, "tau": 0 * p} for p in start]
    with float64():
        for t, step_grads in enumerate(grads):
            for i, g in enumerate(step_grads):
                expected[i] = release_step(expected[i], g, states[i], t, float(lr(t)), g2=g2,
                                           g3=g3, wd=wd, kappa=kappa, **RELEASE[name])
        optimizer = OPTIMIZERS[name](lambda count: g2 * lr(count), kappa=kappa,
                                     momentum_scale=g3 / g2, weight_decay=wd / g2,
                                     convention="release")
        params = [jnp.asarray(p) for p in start]
        state = optimizer.init(params)
        update = jax.jit(optimizer.update)
        for step_grads in grads:
            updates, state = update([jnp.asarray(g) for g in step_grads], state, params)
            params = optax.apply_updates(params, updates)
    for got, want in zip(params, expected):
        # 100 steps of a few float64 roundings each (see test_optax_matches_torch.tolerance)
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-13)


def first_step(optimizer, grad=1.0, param=0.0):
    with float64():
        params = jnp.full((3,), param)
        updates, _ = optimizer.update(jnp.full((3,), grad), optimizer.init(params), params)
        return float(optax.apply_updates(params, updates)[0])


def test_the_step_count_starts_at_one_here_and_at_zero_in_the_release():
    """First step, g = 1, eps = 0. Here k = 1: a = 8/9 and alpha = 2^0.15, the step is
    -(1 + (1 + 2^0.15) 8/9) / sqrt(8/9) lr = -3.0496 lr (docs/optimizers.md's check by hand, and
    danastar.optim's). The release's count is 0: a = 1 (m = g, v = g^2) and max(0, 1)^0.15 = 1,
    the step is -(1 + 1 + 1) lr."""
    lr = 1e-3
    ours = first_step(adana(lr, eps=0.0))
    release = first_step(adana(lr, eps=0.0, convention="release"))
    assert ours == pytest.approx(-(1 + (1 + 2 ** 0.15) * 8 / 9) / math.sqrt(8 / 9) * lr,
                                 rel=1e-14)
    assert ours / lr == pytest.approx(-3.0496, abs=1e-4)
    assert release == pytest.approx(-3 * lr, rel=1e-14)


def test_the_nesterov_factor_follows_each_convention():
    """Two steps of g = 1, eps = 0. Here the second is k = 2: a = 8/10, m = v = 8/9 + 8/10 *
    1/9 and alpha = 3^0.15, the step is -(1 + (1 + alpha) m) / sqrt(m) lr. In the release the
    second is t = 1: a = 8/9 leaves m = v = 1 (the first step set them to g), and alpha =
    max(1, 1)^0.15 = 1, so it is -3 lr."""
    lr = 1e-3
    m = 8 / 9 + 8 / 10 * (1 - 8 / 9)
    expected = {"danastar": -(1 + (1 + 3 ** 0.15) * m) / math.sqrt(m) * lr, "release": -3 * lr}
    for convention, want in expected.items():
        optimizer = adana(lr, eps=0.0, convention=convention)
        with float64():
            params = jnp.zeros(2)
            state = optimizer.init(params)
            for _ in range(2):
                updates, state = optimizer.update(jnp.ones(2), state, params)
        assert float(updates[0]) == pytest.approx(want, rel=1e-14)


def test_weight_decay_is_independent_here_and_coupled_to_the_lr_in_the_release():
    """A zero gradient moves nothing but the decay. Here the parameter is multiplied by
    1 - lambda s_t / (1 + k / wd_ts), not by the learning rate; the release adds wd p to the
    direction, so it is multiplied by 1 - lr wd."""
    lr, factor = 1e-2, 0.5
    ours = first_step(dana_mk4(lr, schedule=factor, weight_decay=0.5, wd_ts=10), grad=0.0,
                      param=2.0)
    release = first_step(dana_mk4(lr, weight_decay=0.5, convention="release"), grad=0.0,
                         param=2.0)
    assert ours == pytest.approx(2.0 * (1 - 0.5 * factor / (1 + 1 / 10)), rel=1e-14)
    assert release == pytest.approx(2.0 * (1 - lr * 0.5), rel=1e-14)


def test_state_is_float32_for_bfloat16_parameters_unless_asked():
    """The release keeps the state in each parameter's dtype (bf16 moments for bf16 weights);
    here it is at least float32, as in danastar.optim; ``state_dtype`` gives the release's."""
    params = {"w": jnp.ones((2, 2), jnp.bfloat16)}
    ours = adana().init(params)
    release = adana(state_dtype=jnp.bfloat16, convention="release").init(params)
    assert ours[0].mu["w"].dtype == jnp.float32
    assert release[0].mu["w"].dtype == jnp.bfloat16


def test_release_convention_has_no_log_time_decay():
    with pytest.raises(ValueError, match="coupled weight decay"):
        adana(1e-3, omega=4.0, total_steps=1000, convention="release")
