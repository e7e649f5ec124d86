"""The stochastic simulator: generalised momentum SGD and danastar's optimizers on one W.

Every run steps on the same data: at step t each seed draws one batch of B samples, and every
schedule and every optimizer takes its gradient on that batch (common random numbers, so the
differences between methods are not sampling noise). Seeds differ in their data stream only.

Samples are drawn in the eigenbasis of K (see `PLRF`): O(B d) per step for the momentum
schedules, which are rotation-invariant. The optimizers act coordinate-wise, so they step in
the original coordinates theta = V theta_tilde (one d x d product per step), in float64: those of
danastar.optim (torch, the default) or their optax versions from danastar.optax
(``framework="jax"``), which step alike to rounding.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np

from danastar.progress import SILENT, Stages

from .model import PLRF
from .ode import evaluation_times
from .schedules import Schedule


@dataclass(frozen=True)
class TorchOptimizer:
    """An optimizer from the danastar.optim registry, run on the model with a fixed LR.

    `name` is a registry name (`adana`, `dana-star-mk4`, `adamw`, `torch:NAdam`, ...);
    `hparams` are its keyword arguments. Only element-wise optimizers make sense here (each
    seed's parameters are one row of a single (seeds, d) tensor). With ``framework="jax"``
    `simulate` runs the optax optimizer of the same name instead (`JAX_OPTIMIZERS`).
    """

    name: str
    lr: float
    hparams: dict = field(default_factory=dict)
    label: str | None = None

    @property
    def display_name(self) -> str:
        return self.label or self.name


@dataclass
class SimulationResult:
    """`risks[i, s, k]`: run i (schedules first, then optimizers), seed s, at `times[k]`."""

    names: list[str]
    times: np.ndarray
    risks: np.ndarray
    risk_infinity: float

    @property
    def mean(self) -> np.ndarray:
        return self.risks.mean(axis=1)

    @property
    def std(self) -> np.ndarray:
        return self.risks.std(axis=1)


FRAMEWORKS = ("torch", "jax")
# The optimizers danastar.optax has (its aliases of these danastar.optim registry names).
JAX_OPTIMIZERS = ("adana", "dana-mk4", "dana-star", "dana-star-mk4")


class TorchRunner:
    """The optimizers of danastar.optim, each on a float64 (seeds, d) parameter.

    torch is imported by the runner's methods: it takes seconds to import, and the ODE and the
    momentum schedules' simulations (every `danastar theory` figure without --optim) run on NumPy
    alone."""

    def __init__(self, optimizers: Sequence[TorchOptimizer], start: np.ndarray):
        import torch  # noqa: PLC0415 (see the class)

        from danastar.optim import build_optimizer  # noqa: PLC0415 (imports torch)

        self.params, self.built = [], []
        for spec in optimizers:
            param = torch.nn.Parameter(torch.tensor(start, dtype=torch.float64))
            self.built.append(build_optimizer(spec.name, [param], lr=spec.lr, **spec.hparams))
            self.params.append(param)
        # NumPy views of the parameters: the basis changes run in NumPy (one BLAS pool; torch's
        # threads would fight it for the cores), only the optimizers' steps run in torch.
        self.views = [param.detach().numpy() for param in self.params]

    @contextmanager
    def running(self) -> Iterator[None]:
        import torch  # noqa: PLC0415 (see the class)

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def values(self) -> list[np.ndarray]:
        return self.views

    def step(self, grads: list[np.ndarray]) -> None:
        import torch  # noqa: PLC0415 (see the class)

        for param, optimizer, grad in zip(self.params, self.built, grads, strict=True):
            param.grad = torch.from_numpy(grad)
            optimizer.step()


class JaxRunner:
    """The same optimizers from danastar.optax, each step one jitted update, in float64 (jax's
    x64 mode, switched on while the run lasts)."""

    def __init__(self, optimizers: Sequence[TorchOptimizer], start: np.ndarray):
        self.optimizers, self.start = list(optimizers), start

    @contextmanager
    def running(self) -> Iterator[None]:
        # jax and optax: the jax extra, imported when a run asks for framework="jax"
        import jax  # noqa: PLC0415
        import jax.numpy as jnp  # noqa: PLC0415
        import optax  # noqa: PLC0415

        from danastar.optax import OPTIMIZERS  # noqa: PLC0415 (imports jax and optax)

        previous = jax.config.jax_enable_x64
        jax.config.update("jax_enable_x64", True)
        try:
            self.params, self.states, self.steps = [], [], []
            for spec in self.optimizers:
                optimizer = OPTIMIZERS[spec.name](spec.lr, **spec.hparams)
                params = jnp.asarray(self.start, dtype=jnp.float64)

                def step(params, state, grad, optimizer=optimizer):
                    updates, state = optimizer.update(grad, state, params)
                    return optax.apply_updates(params, updates), state

                self.params.append(params)
                self.states.append(optimizer.init(params))
                self.steps.append(jax.jit(step))
            yield
        finally:
            jax.config.update("jax_enable_x64", previous)

    def values(self) -> list[np.ndarray]:
        return [np.asarray(params) for params in self.params]

    def step(self, grads: list[np.ndarray]) -> None:
        for i, grad in enumerate(grads):
            self.params[i], self.states[i] = self.steps[i](self.params[i], self.states[i], grad)


def simulate(model: PLRF, schedules: Sequence[Schedule] = (), batch: int = 1,
             steps: int = 1000, seeds: int = 4, seed: int = 0,
             optimizers: Sequence[TorchOptimizer] = (), times: np.ndarray | None = None,
             chunk: int = 2048, framework: str = "torch",
             stages: Stages = SILENT) -> SimulationResult:
    """Run every schedule and optimizer for `steps` steps from theta = 0, `seeds` data streams.

    The exact population risk is recorded at `times` (default `evaluation_times(steps)`).
    `framework`: the optimizers of danastar.optim (``"torch"``) or of danastar.optax
    (``"jax"``, the four DANA optimizers of `JAX_OPTIMIZERS`). `stages` counts the steps (a
    command's progress bar).
    """
    schedules, optimizers = list(schedules), list(optimizers)
    _check_arguments(framework, schedules, optimizers)
    times = evaluation_times(steps) if times is None else np.asarray(times, dtype=np.int64)
    d, n_sched, n_opt = model.d, len(schedules), len(optimizers)
    s = model.singular_values
    target = model.target_coefficients / s  # theta* in the eigenbasis
    noise_scale = model.residual_norm
    rng = np.random.default_rng(seed)

    # error e = theta_tilde - theta*, momentum y; shapes (schedules, seeds, d)
    error = np.repeat(-target[None, None, :], n_sched, 0).repeat(seeds, 1)
    momentum = np.zeros_like(error)
    normalised = np.array([sch.risk_normalised for sch in schedules], dtype=bool)
    runner_class = TorchRunner if framework == "torch" else JaxRunner
    runner = runner_class(optimizers, np.zeros((seeds, d))) if optimizers else None
    basis = model.V  # columns: eigenvectors of K

    risks = np.empty((n_sched + n_opt, seeds, len(times)))
    record = {int(t): k for k, t in enumerate(times)}

    def optimizer_errors():  # per optimizer, (seeds, d) in the eigenbasis
        return [view @ basis - target for view in runner.values()] if runner else []

    def save(k):
        if n_sched:
            risks[:n_sched, :, k] = _risk(model, error)
        for i, e in enumerate(optimizer_errors()):
            risks[n_sched + i, :, k] = _risk(model, e)

    def run_steps():
        nonlocal error, momentum
        stream = _stream(rng, schedules, steps, chunk, seeds, batch, d)
        for t, xi, eta, coefficients in stages.counted(stream, steps, "step"):
            if t in record:
                save(record[t])
            noise = noise_scale * eta
            if n_sched:
                error, momentum = _schedules_step(model, error, momentum, coefficients,
                                                  normalised, xi, noise)
            if n_opt:
                runner.step([_sample_gradient(s, e, xi, noise) @ basis.T
                             for e in optimizer_errors()])

    with runner.running() if runner is not None else nullcontext():
        run_steps()
        if steps in record:
            save(record[steps])
    names = [sch.name for sch in schedules] + [o.display_name for o in optimizers]
    return SimulationResult(names, times.astype(np.float64), risks, model.risk_infinity)


def _check_arguments(framework: str, schedules: list[Schedule],
                     optimizers: list[TorchOptimizer]) -> None:
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    if framework == "jax":
        unknown = [spec.name for spec in optimizers if spec.name not in JAX_OPTIMIZERS]
        if unknown:
            raise ValueError(f"danastar.optax has no {', '.join(unknown)}; it has "
                             f"{', '.join(JAX_OPTIMIZERS)}")
    if not schedules and not optimizers:
        raise ValueError("simulate needs at least one schedule or optimizer")


def _stream(rng: np.random.Generator, schedules: list[Schedule], steps: int, chunk: int,
            seeds: int, batch: int, d: int) -> Iterator[tuple]:
    """Per step t: (t, xi (seeds, B, d), eta (seeds, B), the schedules' (g1, g2, g3, Delta) at
    t (schedules, 4), or None without schedules), drawn `chunk` steps at a time."""
    for start in range(0, steps, chunk):
        stop = min(start + chunk, steps)
        xi_chunk = rng.standard_normal((stop - start, seeds, batch, d))
        eta_chunk = rng.standard_normal((stop - start, seeds, batch))
        t = np.arange(start, stop, dtype=np.float64)
        coefficients = (np.stack([np.stack(sch.values(t), axis=-1) for sch in schedules])
                        if schedules else None)
        for offset in range(stop - start):
            yield (start + offset, xi_chunk[offset], eta_chunk[offset],
                   None if coefficients is None else coefficients[:, offset])


def _risk(model: PLRF, error: np.ndarray) -> np.ndarray:
    """The population risk of errors (..., d) in the eigenbasis: ||S e||^2 / 2 + R_inf."""
    return 0.5 * np.sum((model.singular_values * error) ** 2, axis=-1) + model.risk_infinity


def _sample_gradient(s: np.ndarray, error: np.ndarray, xi: np.ndarray,
                     noise: np.ndarray) -> np.ndarray:
    """The minibatch gradient in the eigenbasis, for errors of shape (..., seeds, d): the
    residual of each sample is xi^T S e - ||r|| eta, the gradient S xi residual / B."""
    residual = np.einsum("...sd,sbd->...sb", s * error, xi) - noise
    return s * np.einsum("...sb,sbd->...sd", residual, xi) / xi.shape[1]


def _schedules_step(model: PLRF, error: np.ndarray, momentum: np.ndarray,
                    coefficients: np.ndarray, normalised: np.ndarray, xi: np.ndarray,
                    noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One step of every schedule (axis 0 of `error` and `momentum`, (schedules, seeds, d)),
    with this step's (g1, g2, g3, Delta) per schedule in `coefficients` (schedules, 4)."""
    s = model.singular_values
    grad = _sample_gradient(s, error, xi, noise)
    g1, g2, g3, D = (coefficients[:, i][:, None, None] for i in range(4))
    if normalised.any():
        twice = np.sum((s * error) ** 2, axis=-1) + 2 * model.risk_infinity
        scale = np.where(normalised[:, None], 1 / np.sqrt(twice), 1.0)[..., None]
        g2, g3 = g2 * scale, g3 * scale
    momentum = (1 - D) * momentum + g1 * grad
    return error - g2 * grad - g3 * momentum, momentum
