"""What the JAX tests share: float64 in jax, one gradient sequence fed to both frameworks, and
the torch, optax and spec-oracle runs of a DANA optimizer over it."""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch

from danastar.optax import OPTIMIZERS
from danastar.optim import apply_schedule, build_optimizer, get_schedule

import optim_spec_reference as spec

SHAPES = [(6, 5), (11,), (2, 3, 4), (1,)]
STEPS = 200
PEAK_LR = 3e-3
WARMUP = 20
ORACLE = {
    "adana": partial(spec.dana_step, star=False),
    "dana-mk4": partial(spec.dana_step, star=False, clipsnr=2.0),
    "dana-star": partial(spec.dana_step, star=True),
    "dana-star-mk4": partial(spec.dana_step, star=True, clipsnr=2.0),
}


@contextmanager
def float64():
    """jax with float64 arrays inside the block (jax's default is float32 only)."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


def gradients(seed: int = 0, steps: int = STEPS, shapes=SHAPES) -> list[list[np.ndarray]]:
    """Per step, one float64 gradient per shape: dense, sparse (most coordinates get nothing,
    as rare tokens do: what tau is for), and now and then all zero."""
    rng = np.random.default_rng(seed)
    sequence = []
    for step in range(steps):
        grads = []
        for index, shape in enumerate(shapes):
            g = rng.normal(0.2, 1.0, size=shape)
            if index == 1:
                g = g * (rng.random(shape) < 0.2)
            if index == 0 and step % 7 == 3:
                g = np.zeros(shape)
            grads.append(g)
        sequence.append(grads)
    return sequence


def schedule_factors(steps: int = STEPS) -> np.ndarray:
    """s_t of danastar's default schedule (warm-up, then cosine to 0.1), steps 0 .. steps-1."""
    factor = get_schedule("cos_inf", warmup_steps=WARMUP, total_steps=steps)
    return np.array([factor(step) for step in range(steps)])


def starting_point(seed: int = 1, shapes=SHAPES) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape) for shape in shapes]


def run_torch(name, start, grads, factors, dtype, **hparams) -> list[np.ndarray]:
    params = [torch.tensor(p).to(dtype).requires_grad_() for p in start]
    optimizer = build_optimizer(name, params, lr=PEAK_LR, **hparams)
    for step_grads, factor in zip(grads, factors):
        apply_schedule(optimizer, float(factor))
        for param, g in zip(params, step_grads):
            param.grad = torch.tensor(g).to(dtype)
        optimizer.step()
    return [param.detach().double().numpy() for param in params]


def run_optax(name, start, grads, factors, dtype, **hparams) -> list[np.ndarray]:
    """The optax alias of ``name``, its update under jit, the schedule factor from a table."""
    table = jnp.asarray(factors)
    optimizer = OPTIMIZERS[name](PEAK_LR, schedule=lambda count: table[count], **hparams)
    return run_transformation(optimizer, start, grads, dtype)


def run_transformation(optimizer, start, grads, dtype) -> list[np.ndarray]:
    params, _ = run(optimizer, [jnp.asarray(p, dtype=dtype) for p in start], grads)
    return [np.asarray(param).astype(np.float64) for param in params]


def run(optimizer, params, grads):
    """``optimizer`` under jit over ``grads`` (cast to each parameter's dtype); the last
    parameters and state."""
    state = optimizer.init(params)

    @jax.jit
    def step(params, state, grads):
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for step_grads in grads:
        step_grads = jax.tree.map(lambda g, p: jnp.asarray(g, p.dtype), step_grads, params)
        params, state = step(params, state, step_grads)
    return params, state


def as_stored(values, dtype: torch.dtype) -> np.ndarray:
    """float64 ``values`` rounded to ``dtype``, as a tensor of that dtype holds them."""
    return torch.tensor(values, dtype=torch.float64).to(dtype).double().numpy()


def run_oracle(name, start, grads, factors, dtype, **hparams) -> list[np.ndarray]:
    """The float64 spec oracle; parameters and gradients rounded to ``dtype`` after every step,
    as an optimizer of that dtype stores them."""
    expected = [as_stored(p, dtype) for p in start]
    states = [spec.initial_state(p.shape) for p in start]
    for k, (step_grads, factor) in enumerate(zip(grads, factors), start=1):
        for i, g in enumerate(step_grads):
            expected[i] = as_stored(ORACLE[name](expected[i], as_stored(g, dtype), states[i], k,
                                                 PEAK_LR * factor, factor, **hparams), dtype)
    return expected
