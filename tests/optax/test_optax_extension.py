"""Continuing a run past its planned T with danastar.optax: the schedules continued by the rules
of danastar.optim's `extended_schedule` (the same values in float64), under jit, and a run
across the join equal to the torch optimizer extended with `extend_to`."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")
torch = pytest.importorskip("torch")

from danastar.optax import (  # noqa: E402
    adana,
    extended_weight_decay,
    reanchor_schedule,
    rewarm_schedule,
    stretch_schedule,
)
from danastar.optim import ADana, apply_schedule, extended_schedule, get_schedule  # noqa: E402

from optax_cases import PEAK_LR, float64, gradients, run, starting_point  # noqa: E402

W, T1, T2, JOIN = 10, 100, 400, 60
STEPS = [0, 30, JOIN, JOIN + 1, 150, 333, T2 - 1, T2]


def optax_extension(name: str, rule: str):
    """The optax wrapper of ``rule`` around danastar's own schedule functions."""
    old = get_schedule(name, W, T1)
    if rule == "stretch":
        return stretch_schedule(old, T1, T2, JOIN, warmup_steps=W)
    if rule == "reanchor":
        return reanchor_schedule(old, get_schedule(name, W, T2), T2, JOIN, warmup_steps=W)
    return rewarm_schedule(old, get_schedule(name, 20, T2 - JOIN), JOIN, 20, peak=0.5)


@pytest.mark.parametrize("rule", ["stretch", "reanchor", "rewarm"])
@pytest.mark.parametrize("name", ["cos_inf", "cos", "wsd"])
def test_the_optax_rules_give_the_torch_schedules_values_in_float64(name, rule):
    options = {"rewarm_steps": 20, "peak": 0.5} if rule == "rewarm" else {}
    torch_schedule = extended_schedule(name, W, T1, T2, JOIN, rule, **options)
    with float64():
        optax_schedule = optax_extension(name, rule)
        got = [float(optax_schedule(step)) for step in STEPS]
    assert got == [torch_schedule(step) for step in STEPS]


def test_an_optax_schedule_continued_under_jit():
    with float64():
        old = optax.warmup_cosine_decay_schedule(0.01, 1.0, W, T1, end_value=0.1)
        planned = optax.warmup_cosine_decay_schedule(0.01, 1.0, W, T2, end_value=0.1)
        restarted = optax.warmup_cosine_decay_schedule(0.0, 1.0, 20, T2 - T1, end_value=0.1)
        steps = jnp.arange(T2 + 1)
        before = np.asarray(jax.jit(jax.vmap(old))(steps))
        for longer in (stretch_schedule(old, T1, T2, JOIN, warmup_steps=W),
                       reanchor_schedule(old, planned, T2, JOIN, warmup_steps=W),
                       rewarm_schedule(old, restarted, T1, 20)):
            values = np.asarray(jax.jit(jax.vmap(longer))(steps))
            assert np.array_equal(values[:JOIN + 1], before[:JOIN + 1])
            assert np.max(np.abs(np.diff(values))) < 0.1  # no jump
            assert values[-1] == pytest.approx(0.1, rel=1e-12)


def test_impossible_extensions_are_refused_as_in_torch():
    old = optax.cosine_decay_schedule(1.0, T1)
    with pytest.raises(ValueError, match=r"new_total_steps must be a whole number of optimizer "
                                         r"steps greater than total_steps \(100\)"):
        stretch_schedule(old, T1, T1, JOIN)
    with pytest.raises(ValueError, match="from_step must be a whole number"):
        rewarm_schedule(old, old, -1, 20)
    with pytest.raises(ValueError, match="rewarm_steps must be a whole number of steps >= 1"):
        rewarm_schedule(old, old, JOIN, 0)


@pytest.mark.filterwarnings("ignore::danastar.hparams.ShortRunWeightDecayWarning")
def test_a_run_continued_past_its_total_steps_as_the_torch_optimizer_does():
    planned, longer = 60, 100  # short: the decay's warning is expected
    grads = gradients(steps=longer, shapes=[(6, 5), (11,)])
    start = starting_point(shapes=[(6, 5), (11,)])
    old = get_schedule("cos_inf", 6, planned)
    new = extended_schedule("cos_inf", 6, planned, longer, planned, "rewarm", rewarm_steps=10)
    weight_decay, wd_ts = extended_weight_decay(4.0 / 6, 6, longer, planned, "reanchor")

    params = [torch.tensor(p).requires_grad_() for p in start]
    optimizer = ADana(params, lr=PEAK_LR, omega=4.0, total_steps=planned)
    for step, step_grads in enumerate(grads):
        if step == planned:
            optimizer.extend_to(longer, decay_rule="reanchor")
        apply_schedule(optimizer, (old if step < planned else new)(step))
        for param, g in zip(params, step_grads):
            param.grad = torch.tensor(g)
        optimizer.step()
    assert optimizer.param_groups[0]["weight_decay"] == weight_decay

    with float64():  # the schedules as tables: jit cannot run danastar's Python schedules
        old_table = jnp.asarray([old(step) for step in range(longer)])
        new_table = jnp.asarray([new(step) for step in range(longer)])
        first = adana(PEAK_LR, lambda count: old_table[count], omega=4.0, total_steps=planned)
        values, state = run(first, [jnp.asarray(p) for p in start], grads[:planned])
        then = adana(PEAK_LR, lambda count: new_table[count], weight_decay=weight_decay,
                     wd_ts=wd_ts)
        values, _ = continued(then, values, state, grads[planned:])
    for got, param in zip(values, params):
        np.testing.assert_allclose(np.asarray(got), param.detach().numpy(), rtol=0, atol=1e-13)


def continued(optimizer, params, state, grads):
    """``optimizer`` over ``grads`` from ``state`` (another optimizer's, of the same chain)."""
    assert jax.tree.structure(state) == jax.tree.structure(optimizer.init(params))

    @jax.jit
    def step(params, state, grads):
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for step_grads in grads:
        params, state = step(params, state, [jnp.asarray(g) for g in step_grads])
    return params, state
