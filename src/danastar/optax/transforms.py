"""The DANA family's update directions as optax transformations: log-time moments and the damped
Nesterov direction, one elementwise function per leaf.

``scale_by_adana`` (ADana, Dana-MK4) and ``scale_by_dana_star`` (Dana-Star, Dana-Star-MK4) turn
gradients into the direction ``u`` that the learning rate then scales (``p <- p - lr * u``);
they do not negate it, as optax's ``scale_by_adam`` does not. For one leaf at step k
(a = delta / (delta + k), no bias correction):

    m <- m + a (g - m);  v <- (1 - a) v + a g^2;  D = sqrt(v) + eps
    ADana:      u = (g + m + clip(alpha(k) m, +-clipsnr D)) / D,   alpha(k) = (1 + k)^(1 - kappa)
    Dana-Star:  tau <- tau + a (|g| / (|g| + D) - tau)
                tau_r = max(p_hat, 1 / (1 + k)),  p_hat = min(tau, 1/2) / (1 - min(tau, 1/2))
                N = sqrt(tau_r) / D;  T_eff = max(tau k, 1)
                u = N (g + m) + clip(T_eff^(1 - kappa) N m, +-clipsnr tau_r)

These are the formulas of docs/optimizers.md, arranged as danastar.optim's kernels arrange them
(sign(m) A = alpha(k) m / D), so the two frameworks round alike. The state keeps one step count
for the whole tree (optax's habit); ``count`` is the number of updates done, so the step is
k = count + 1.

``convention="release"`` follows the original release's JAX functions instead: the step is the
0-based count itself (a = 1 at the first update) and the Nesterov factor is max(count, 1)^(1 -
kappa); docs/optimizers.md lists every difference.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from danastar.hparams import (
    DEFAULT_CLIPSNR,
    DEFAULT_DELTA,
    DEFAULT_KAPPA,
    check,
    check_dana,
    check_parameter_dtype,
    is_array,
    is_number,
    state_dtype_name,
)

CONVENTIONS = ("danastar", "release")

__all__ = ["CONVENTIONS", "DEFAULT_CLIPSNR", "DEFAULT_DELTA", "DEFAULT_KAPPA",
           "ScaleByAdanaState", "ScaleByDanaStarState", "check", "is_python_number",
           "scale_by_adana", "scale_by_dana_star", "wide"]


class ScaleByAdanaState(NamedTuple):
    """State of `scale_by_adana`: the updates done so far, the first and second moments."""

    count: jax.Array  # int32, the number of updates done
    mu: optax.Updates
    nu: optax.Updates


class ScaleByDanaStarState(NamedTuple):
    """State of `scale_by_dana_star`: `ScaleByAdanaState`'s, and tau, the estimate of how often
    each coordinate receives gradient."""

    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates
    tau: optax.Updates


def is_python_number(value) -> bool:
    """A value fixed when the transformation is built (not an array `inject_hyperparams` made)."""
    return is_number(value) and not is_array(value)


def check_hyperparameters(delta, kappa, clipsnr, eps, convention) -> None:
    """The checks of danastar.optim (module danastar.hparams, the same sentences), on the
    values known when the transformation is built (an array from `optax.inject_hyperparams` is
    taken as it is)."""
    check(convention in CONVENTIONS,
          f"convention must be one of {CONVENTIONS}, got {convention!r}")
    check_dana(delta, kappa, clipsnr, eps)


def resolve_state_dtype(state_dtype):
    """``state_dtype`` as danastar.optim takes it: None or float32 (each parameter's dtype, at
    least float32), or bfloat16; a dtype or its name. Anything else is refused as torch refuses
    it."""
    if state_dtype is None:
        return None
    name = state_dtype if isinstance(state_dtype, str) else None
    if name is None:
        try:
            name = jnp.dtype(state_dtype).name
        except (TypeError, ValueError):  # not a dtype at all
            name = None
    return None if state_dtype_name(name, state_dtype) == "float32" else jnp.bfloat16


def leaf_kind(leaf) -> str:
    """"floating", "complex" or "other" (integer, boolean), as danastar.hparams checks it."""
    if jnp.issubdtype(leaf.dtype, jnp.complexfloating):
        return "complex"
    return "floating" if jnp.issubdtype(leaf.dtype, jnp.floating) else "other"


def check_leaves(params) -> None:
    """Refuse a parameter tree whose leaves the update would get wrong: one that is not an
    array, a complex one, an integer or boolean one (the sentences of danastar.optim)."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        if not is_array(leaf):
            raise ValueError(
                f"the parameter leaf at {jax.tree_util.keystr(path) or 'the root'} is a "
                f"{type(leaf).__name__}, not an array: danastar.optax updates arrays only; "
                "convert it with jnp.asarray, or keep it out of the tree the optimizer sees")
        kind = leaf_kind(leaf)
        if kind != "floating":
            check_parameter_dtype(jnp.dtype(leaf.dtype).name, leaf.shape, kind)


def wide(value) -> jax.Array:
    """``value`` in the widest float jax has here (float64 when x64 is on, else float32): the
    per-step scalars are computed in it once, then rounded to each leaf's dtype, as torch
    computes them in float64 on the host."""
    return jnp.asarray(value, dtype=jnp.result_type(float))


def step_time(count, convention: str) -> jax.Array:
    """The step the formulas call k: count + 1 here (the first update is k = 1, as in
    danastar.optim), the 0-based count itself in the release's JAX convention."""
    return wide(count + 1 if convention == "danastar" else count)


def nesterov_factor(time, kappa, convention: str) -> jax.Array:
    """alpha(k) = (1 + k)^(1 - kappa); the release's JAX functions use max(count, 1)^(1 - kappa)."""
    base = time + 1 if convention == "danastar" else jnp.maximum(time, 1)
    return base ** (1 - wide(kappa))


def in_dtype(value, dtype) -> jax.Array:
    """A hyperparameter in a leaf's dtype: `optax.inject_hyperparams` passes arrays of its own
    dtype, which must not promote the leaf's arithmetic."""
    return jnp.asarray(value, dtype=dtype)


def state_dtypes(params, state_dtype):
    """Each leaf's state dtype: bfloat16 if ``state_dtype`` (resolved: `resolve_state_dtype`)
    asks for it, else the leaf's dtype promoted to at least float32 (bfloat16 parameters get
    float32 moments, float64 ones float64, as in danastar.optim)."""
    if state_dtype is not None:
        return jax.tree.map(lambda _: jnp.dtype(state_dtype), params)  # bfloat16
    return jax.tree.map(lambda p: jnp.promote_types(p.dtype, jnp.float32), params)


def zeros_like(params, state_dtype):
    """Zero state like ``params`` (zeros_like keeps each leaf's sharding under jit), once the
    leaves are checked (`check_leaves`)."""
    check_leaves(params)
    return jax.tree.map(lambda p, dtype: jnp.zeros_like(p, dtype=dtype), params,
                        state_dtypes(params, state_dtype))


def log_time_moments(grad, mu, nu, a, one_minus_a, eps):
    """m <- m + a (g - m), v <- (1 - a) v + a g^2 in the state's dtype; returns g in that dtype,
    the new m and v, and D = sqrt(v) + eps."""
    grad = grad.astype(mu.dtype)
    mu = mu + a * (grad - mu)
    nu = nu * one_minus_a + grad * grad * a
    return grad, mu, nu, jnp.sqrt(nu) + eps


def clip_symmetric(value, bound):
    return jnp.minimum(jnp.maximum(value, -bound), bound)


def scale_by_adana(delta: float = DEFAULT_DELTA, kappa: float = DEFAULT_KAPPA,
                   clipsnr: float | None = None, eps: float = 1e-8, *, state_dtype=None,
                   momentum_scale: float = 1.0,
                   convention: str = "danastar") -> optax.GradientTransformation:
    """ADana's direction (Dana-MK4's with ``clipsnr``): log-time moments, damped Nesterov.

    Args:
      delta: delta > 0 of the EMA coefficient a_k = delta / (delta + k) of both moments.
      kappa: kappa in (0, 1] of the Nesterov factor alpha(k) = (1 + k)^(1 - kappa).
      clipsnr: Dana-MK4's clip of the damping A = alpha(k) |m| / D at this value; None: no clip.
      eps: added to sqrt(v) in the denominator D.
      state_dtype: None or float32: m and v in each parameter's dtype, at least float32;
        bfloat16: in bfloat16 (a dtype or its name; others are refused, as in danastar.optim).
      momentum_scale: the momentum terms' weight relative to the gradient term (the release's
        ``g3 / g2``); 1 in danastar.optim and the paper's language-model runs.
      convention: ``"danastar"`` (the step of the torch optimizers) or ``"release"`` (the
        0-based count of the original release's JAX functions).

    Returns:
      A :class:`optax.GradientTransformation` whose state is a `ScaleByAdanaState`.
    """
    check_hyperparameters(delta, kappa, clipsnr, eps, convention)
    state_dtype = resolve_state_dtype(state_dtype)

    def init_fn(params):
        zeros = zeros_like(params, state_dtype)
        return ScaleByAdanaState(jnp.zeros([], jnp.int32), zeros, zeros)

    def update_fn(updates, state, params=None):
        del params
        time = step_time(state.count, convention)
        a = wide(delta) / (wide(delta) + time)
        boost = nesterov_factor(time, kappa, convention)

        def leaf(grad, mu, nu):
            dtype = mu.dtype
            grad, mu, nu, denom = log_time_moments(grad, mu, nu, a.astype(dtype),
                                                   (1 - a).astype(dtype), in_dtype(eps, dtype))
            momentum = boost.astype(dtype) * mu
            if clipsnr is not None:
                momentum = clip_symmetric(momentum, in_dtype(clipsnr, dtype) * denom)
            scale = in_dtype(momentum_scale, dtype)
            direction = (grad + scale * mu + scale * momentum) / denom
            return direction, mu, nu

        out = jax.tree.map(leaf, updates, state.mu, state.nu)
        treedef = jax.tree.structure(updates)
        direction, mu, nu = jax.tree.transpose(treedef, jax.tree.structure((0, 0, 0)), out)
        return direction, ScaleByAdanaState(optax.safe_int32_increment(state.count), mu, nu)

    return optax.GradientTransformation(init_fn, update_fn)


def scale_by_dana_star(delta: float = DEFAULT_DELTA, kappa: float = DEFAULT_KAPPA,
                       clipsnr: float | None = None, eps: float = 1e-8, *, state_dtype=None,
                       momentum_scale: float = 1.0,
                       convention: str = "danastar") -> optax.GradientTransformation:
    """Dana-Star's direction (Dana-Star-MK4's with ``clipsnr``): ADana's, rescaled per
    coordinate by tau, the estimate of how often that coordinate receives gradient (rare
    tokens, experts).

    Args:
      delta: delta > 0 of the EMA coefficient a_k = delta / (delta + k) of m, v and tau.
      kappa: kappa in (0, 1] of the effective-time factor T_eff^(1 - kappa), T_eff =
        max(tau k, 1).
      clipsnr: Dana-Star-MK4's clip of the damping A at this value; None: no clip.
      eps: added to sqrt(v) in the denominator D.
      state_dtype: None or float32: m, v and tau in each parameter's dtype, at least float32;
        bfloat16: in bfloat16 (a dtype or its name; others are refused, as in danastar.optim).
      momentum_scale: the momentum terms' weight relative to the gradient term (the release's
        ``g3 / g2``); 1 in danastar.optim and the paper's language-model runs.
      convention: ``"danastar"`` (the step of the torch optimizers) or ``"release"`` (the
        0-based count of the original release's JAX functions).

    Returns:
      A :class:`optax.GradientTransformation` whose state is a `ScaleByDanaStarState`.
    """
    check_hyperparameters(delta, kappa, clipsnr, eps, convention)
    state_dtype = resolve_state_dtype(state_dtype)

    def init_fn(params):
        zeros = zeros_like(params, state_dtype)
        return ScaleByDanaStarState(jnp.zeros([], jnp.int32), zeros, zeros, zeros)

    def update_fn(updates, state, params=None):
        del params
        time = step_time(state.count, convention)
        a = wide(delta) / (wide(delta) + time)
        tau_floor = 1 / (1 + time)
        exponent = 1 - wide(kappa)

        def leaf(grad, mu, nu, tau):
            dtype = mu.dtype
            grad, mu, nu, denom = log_time_moments(grad, mu, nu, a.astype(dtype),
                                                   (1 - a).astype(dtype), in_dtype(eps, dtype))
            grad_size = jnp.abs(grad)
            tau = tau + a.astype(dtype) * (grad_size / (grad_size + denom) - tau)
            tau_hat = jnp.minimum(tau, 0.5)
            tau_reg = jnp.maximum(tau_hat / (1 - tau_hat), tau_floor.astype(dtype))
            norm = jnp.sqrt(tau_reg) / denom
            # T_eff^(1 - kappa) as exp((1 - kappa) log T_eff), as danastar.optim computes it
            effective_time = jnp.maximum(tau * time.astype(dtype), 1)
            boost = jnp.exp(exponent.astype(dtype) * jnp.log(effective_time))
            momentum = mu * (norm * boost)
            if clipsnr is not None:
                momentum = clip_symmetric(momentum, in_dtype(clipsnr, dtype) * tau_reg)
            scale = in_dtype(momentum_scale, dtype)
            direction = norm * (grad + scale * mu) + scale * momentum
            return direction, mu, nu, tau

        out = jax.tree.map(leaf, updates, state.mu, state.nu, state.tau)
        treedef = jax.tree.structure(updates)
        direction, mu, nu, tau = jax.tree.transpose(treedef, jax.tree.structure((0,) * 4), out)
        return direction, ScaleByDanaStarState(optax.safe_int32_increment(state.count), mu, nu,
                                                tau)

    return optax.GradientTransformation(init_fn, update_fn)
