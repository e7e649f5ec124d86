"""The optax optimizers as optax users use them: built from their pieces, under jit, in
optax.chain, with masks and multi_transform for the parameters that do not decay, under
optax.inject_hyperparams, on trees of mixed dtypes, and resumed from a saved state."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")
torch = pytest.importorskip("torch")

from danastar.optax import (  # noqa: E402
    OPTIMIZERS,
    adana,
    dana_mk4,
    dana_star_mk4,
    log_time_weight_decay,
    paper_weight_decay,
    scale_by_dana_star,
)
from danastar.optax.weight_decay import largest_constant_weight_decay  # noqa: E402
from danastar.optim import ADana, build_optimizer  # noqa: E402
from danastar.optim import weight_decay as torch_weight_decay  # noqa: E402

from optax_cases import float64, run  # noqa: E402

STEPS = 60


def tree_gradients(params, steps=STEPS, seed=0):
    """A gradient tree like ``params`` per step (float64 NumPy leaves)."""
    rng = np.random.default_rng(seed)
    return [jax.tree.map(lambda p: rng.normal(0.1, 1.0, size=p.shape), params)
            for _ in range(steps)]


def assert_trees_equal(got, want, atol=0.0):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                   rtol=0, atol=atol)


def model_params(dtype=jnp.float64):
    rng = np.random.default_rng(1)
    return {"dense": {"kernel": jnp.asarray(rng.normal(size=(4, 3)), dtype),
                      "bias": jnp.asarray(rng.normal(size=(3,)), dtype)},
            "norm": {"scale": jnp.asarray(1 + rng.normal(size=(3,)) / 10, dtype)}}


def decays(params):
    """The rule of danastar.optim.param_groups: matrices decay; biases and norms do not."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def test_the_alias_is_the_chain_of_its_pieces():
    schedule = optax.linear_schedule(0.1, 1.0, 20)
    with float64():
        params = model_params()
        grads = tree_gradients(params)
        alias = dana_star_mk4(3e-3, schedule, weight_decay=0.5, wd_ts=10)
        assert isinstance(alias, optax.GradientTransformationExtraArgs)
        pieces = optax.chain(scale_by_dana_star(clipsnr=2.0),
                             optax.scale_by_learning_rate(
                                 lambda count: jnp.float64(3e-3) * schedule(count)),
                             log_time_weight_decay(0.5, 10, schedule=schedule))
        assert_trees_equal(run(alias, params, grads)[0], run(pieces, params, grads)[0])


def test_chained_after_gradient_clipping_it_sees_the_clipped_gradients():
    with float64():
        params = model_params()
        grads = tree_gradients(params)
        clipped = []
        for step_grads in grads:
            norm = np.sqrt(sum(np.sum(g ** 2) for g in jax.tree.leaves(step_grads)))
            clipped.append(jax.tree.map(lambda g, n=norm: g * min(1.0, 1.0 / n), step_grads))
        chained = optax.chain(optax.clip_by_global_norm(1.0), adana(1e-2))
        assert_trees_equal(run(chained, params, grads)[0], run(adana(1e-2), params, clipped)[0],
                           atol=1e-15)


def torch_run_with_groups(params, grads, decaying, **hparams):
    """danastar.optim's ADana with a decaying and a non-decaying group, as param_groups
    builds them."""
    leaves, treedef = jax.tree.flatten(params)
    tensors = [torch.tensor(np.asarray(p)).requires_grad_() for p in leaves]
    flags = jax.tree.leaves(decaying)
    optimizer = ADana([{"params": [t for t, d in zip(tensors, flags) if d]},
                       {"params": [t for t, d in zip(tensors, flags) if not d],
                        "weight_decay": 0.0}], **hparams)
    for step_grads in grads:
        for tensor, g in zip(tensors, jax.tree.leaves(step_grads)):
            tensor.grad = torch.tensor(g)
        optimizer.step()
    return jax.tree.unflatten(treedef, [t.detach().numpy() for t in tensors])


def test_a_mask_or_multi_transform_keeps_the_decay_off_biases_and_norms():
    hparams = dict(lr=1e-2, weight_decay=0.5, wd_ts=10)
    with float64():
        params = model_params()
        grads = tree_gradients(params)
        want = torch_run_with_groups(params, grads, decays(params), **hparams)
        masked = adana(1e-2, weight_decay=0.5, wd_ts=10, mask=decays)
        labels = jax.tree.map(lambda d: "decay" if d else "no_decay", decays(params))
        partitioned = optax.multi_transform(
            {"decay": adana(1e-2, weight_decay=0.5, wd_ts=10), "no_decay": adana(1e-2)}, labels)
        for optimizer in (masked, partitioned):
            assert_trees_equal(run(optimizer, params, grads)[0], want, atol=1e-14)
        # and the decay did act on the kernel
        free = run(adana(1e-2), params, grads)[0]
        assert np.abs(free["dense"]["kernel"] - want["dense"]["kernel"]).max() > 1e-3


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_inject_hyperparams_gives_the_same_steps_and_lets_the_lr_change(name):
    schedule = optax.warmup_cosine_decay_schedule(0.01, 1.0, 10, STEPS)
    with float64():
        params = model_params()
        grads = tree_gradients(params)
        # inject_hyperparams keeps a schedule's value as the schedule gives it on its int32
        # count: float32 here; the plain optimizer gets the same rounded s_t
        plain = OPTIMIZERS[name](3e-3, lambda count: schedule(count).astype(jnp.float32),
                                 weight_decay=0.5, wd_ts=10)
        injected = optax.inject_hyperparams(OPTIMIZERS[name])(
            learning_rate=3e-3, schedule=schedule, weight_decay=0.5, wd_ts=10)
        want, _ = run(plain, params, grads)
        got, state = run(injected, params, grads)
        assert_trees_equal(got, want, atol=1e-15)
        # learning rate 0: only the weight decay moves the parameters, by its multiplier
        state.hyperparams["learning_rate"] = jnp.asarray(0.0)
        updates, state = injected.update(jax.tree.map(jnp.ones_like, got), state, got)
        moved = optax.apply_updates(got, updates)
        k, factor = STEPS + 1, float(schedule(STEPS))
        multiplier = 1 - 0.5 * factor / (1 + k / 10)
        assert_trees_equal(moved, jax.tree.map(lambda p: p * multiplier, got), atol=1e-15)


def test_inject_hyperparams_takes_the_papers_weight_decay():
    """omega and total_steps become arrays in the injected state; the decay is the same."""
    with float64():
        params = model_params()
        grads = tree_gradients(params, steps=20)
        injected = optax.inject_hyperparams(dana_star_mk4)(learning_rate=1e-2, omega=4.0,
                                                          total_steps=30)
        want, _ = run(dana_star_mk4(1e-2, omega=4.0, total_steps=30), params, grads)
        got, state = run(injected, params, grads)
        assert set(state.hyperparams) >= {"omega", "total_steps"}
        assert_trees_equal(got, want, atol=1e-15)


def test_inject_hyperparams_takes_a_mask_function_as_a_static_argument():
    with float64():
        params = model_params()
        grads = tree_gradients(params, steps=10)
        injected = optax.inject_hyperparams(dana_mk4, static_args=("mask",))(
            learning_rate=1e-2, weight_decay=0.5, wd_ts=10, mask=decays)
        assert isinstance(injected, optax.GradientTransformationExtraArgs)
        want, _ = run(dana_mk4(1e-2, weight_decay=0.5, wd_ts=10, mask=decays), params, grads)
        assert_trees_equal(run(injected, params, grads)[0], want, atol=1e-15)


def test_mixed_dtypes_keep_their_dtype_with_float32_state_and_match_torch():
    rng = np.random.default_rng(2)
    start = {"kernel": rng.normal(size=(6, 5)), "bias": rng.normal(size=(5,))}
    dtypes = {"kernel": (jnp.bfloat16, torch.bfloat16), "bias": (jnp.float32, torch.float32)}
    params = {key: jnp.asarray(value, dtypes[key][0]) for key, value in start.items()}
    grads = tree_gradients(params)
    got, state = run(dana_mk4(1e-2, weight_decay=0.5, wd_ts=10), params, grads)
    assert {key: value.dtype for key, value in got.items()} == \
        {key: value[0] for key, value in dtypes.items()}
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(state[0].mu))
    tensors = {key: torch.tensor(value).to(dtypes[key][1]).requires_grad_()
               for key, value in start.items()}
    optimizer = build_optimizer("dana-mk4", list(tensors.values()), lr=1e-2, weight_decay=0.5,
                                wd_ts=10)
    for step_grads in grads:
        for key, tensor in tensors.items():
            tensor.grad = torch.tensor(step_grads[key]).to(tensor.dtype)
        optimizer.step()
    # bf16: at most one unit apart (a float32 difference can move a rounding across a tie)
    np.testing.assert_allclose(np.asarray(got["kernel"], np.float64),
                               tensors["kernel"].detach().double().numpy(), rtol=2 ** -8)
    # float32: STEPS steps of a few roundings, as in test_optax_matches_torch
    np.testing.assert_allclose(np.asarray(got["bias"], np.float64),
                               tensors["bias"].detach().double().numpy(), rtol=0,
                               atol=STEPS * 4 * float(np.spacing(np.float32(4))))


def test_state_survives_a_save_and_load(tmp_path):
    """The state is a tree of arrays: saved as its leaves (numpy's savez), loaded into the tree
    structure of a fresh init; the resumed run equals the uninterrupted one exactly."""
    schedule = optax.linear_schedule(0.1, 1.0, 20)
    optimizer = dana_star_mk4(3e-3, schedule, omega=4.0, total_steps=STEPS)
    params = model_params(jnp.float32)
    grads = tree_gradients(params)
    whole, _ = run(optimizer, params, grads)
    half = STEPS // 2
    middle, state = run(optimizer, params, grads[:half])
    np.savez(tmp_path / "state.npz", *jax.tree.leaves(state))
    with np.load(tmp_path / "state.npz") as saved:
        leaves = [jnp.asarray(saved[f"arr_{i}"]) for i in range(len(saved.files))]
    restored = jax.tree.unflatten(jax.tree.structure(optimizer.init(params)), leaves)
    assert int(restored[0].count) == half

    @jax.jit
    def step(params, state, grads):
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for step_grads in grads[half:]:
        middle, restored = step(middle, restored,
                                jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), step_grads))
    assert_trees_equal(middle, whole)


def test_the_defaults_are_danastar_optims():
    """danastar.optax imports nothing of torch, so it holds its own copy of these facts."""
    from danastar.optax import transforms
    from danastar.optax import weight_decay as optax_weight_decay
    from danastar.optim import dana_family

    for name in ("DEFAULT_DELTA", "DEFAULT_KAPPA", "DEFAULT_CLIPSNR"):
        assert getattr(transforms, name) == getattr(dana_family, name)
    for name in ("WD_TS_DIVISOR", "MAX_EARLY_DECAY", "EARLY_STEPS"):
        assert getattr(optax_weight_decay, name) == getattr(torch_weight_decay, name)


def test_the_paper_weight_decay_and_the_refusal_match_danastar_optim():
    for total_steps in (1, 9, 10, 1000, 12345):
        assert paper_weight_decay(4.0, total_steps) == \
            torch_weight_decay.log_time_weight_decay(4.0, total_steps)
    assert largest_constant_weight_decay() == pytest.approx(
        torch_weight_decay.largest_constant_weight_decay(), rel=1e-9)


@pytest.mark.parametrize("build, message", [
    (lambda: adana(kappa=0.0), "kappa must be in"),
    (lambda: adana(delta=-1.0), "delta must be > 0"),
    (lambda: dana_mk4(clipsnr=0.0), "clipsnr must be None or > 0"),
    (lambda: adana(convention="pytorch"), "convention must be one of"),
    (lambda: adana(weight_decay=0.1), "would remove more than 5%"),
    (lambda: adana(omega=4.0), "omega needs total_steps as well"),
    (lambda: adana(weight_decay=1e-4, omega=4.0, total_steps=100), "not both"),
    (lambda: adana(optax.cosine_decay_schedule(1e-3, 100), weight_decay=1e-4),
     "needs the schedule factor"),
    (lambda: adana(optax.cosine_decay_schedule(1e-3, 100), optax.linear_schedule(0, 1, 10)),
     "give learning_rate as the peak"),
])
def test_mistakes_are_refused_with_the_fix(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_a_learning_rate_schedule_alone_works_without_weight_decay():
    """Plain optax habit: learning_rate=schedule, no decay, so no schedule factor is needed."""
    schedule = optax.cosine_decay_schedule(1e-2, STEPS)
    params = model_params(jnp.float32)
    grads = tree_gradients(params, steps=5)
    with_lr_schedule, _ = run(adana(schedule), params, grads)
    with_factor, _ = run(adana(1e-2, lambda count: schedule(count) / 1e-2), params, grads)
    assert_trees_equal(with_lr_schedule, with_factor, atol=1e-7)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_argument_of_an_alias_is_documented(name):
    import inspect

    alias = OPTIMIZERS[name]
    documented = inspect.getdoc(alias).split("Args:", 1)[1].split("Returns:", 1)[0]
    for parameter in inspect.signature(alias).parameters:
        assert f"\n  {parameter}: " in documented, f"{name}: {parameter} has no Args: entry"


def test_total_steps_alone_takes_the_papers_omega():
    """As the torch constructors: ω defaults to the paper's 4, T has no default."""
    from danastar.optax.weight_decay import resolve_weight_decay

    assert resolve_weight_decay(0.0, None, None, 1000) == \
        resolve_weight_decay(0.0, None, 4.0, 1000) == (0.04, 100)
