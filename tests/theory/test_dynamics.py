import numpy as np
import pytest

from danastar.theory import (
    PLRF,
    PRESETS,
    Schedule,
    TorchOptimizer,
    decade_slopes,
    evaluation_times,
    exponent_between,
    log_time_delta,
    preset,
    sgd_exponent,
    simulate,
    solve_ode,
    theory_inputs,
)

ALPHA, BETA = 1.0, 0.3


def test_evaluation_grid():
    times = evaluation_times(100)
    assert times[0] == 0 and times[-1] == 100 and np.all(np.diff(times) > 0)
    assert {1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 13, 17}.issubset(set(times.tolist()))


def test_ode_predicts_the_mean_of_stochastic_runs_on_one_w():
    d, v, batch, steps = 200, 1000, 1, 2000
    model = PLRF(ALPHA, BETA, d, v, seed=0)
    schedules = [preset(name, ALPHA, d, v, batch) for name in PRESETS]
    runs = simulate(model, schedules, batch, steps, seeds=64, seed=1)
    ode = solve_ode(model.spectral_inputs(), schedules, batch, steps)
    np.testing.assert_array_equal(runs.times, ode.times)
    ratio = runs.mean / ode.risks
    for name, row in zip(ode.names, ratio, strict=True):
        assert np.all(np.abs(row - 1) < 0.15), (name, row.min(), row.max())


def test_simulator_sampling_matches_the_model_definition():
    # the eigenbasis sampler against plain SGD on samples x = W_hat^T z, y = <z, b_hat>
    d, v, steps, lr = 20, 100, 300, 0.1
    model = PLRF(ALPHA, BETA, d, v, seed=1)
    rng = np.random.default_rng(5)
    finals = []
    for _ in range(200):
        theta = np.zeros(d)
        x, y = model.sample(steps, rng)
        for t in range(steps):
            theta -= lr * (x[t] @ theta - y[t]) * x[t]
        finals.append(model.risk(theta))
    sgd = Schedule("sgd", lambda t: 0 * t, lambda t: lr + 0 * t, lambda t: 0 * t,
                   lambda t: 1 + 0 * t)
    runs = simulate(model, [sgd], 1, steps, seeds=200, seed=2)
    assert runs.mean[0, -1] == pytest.approx(np.mean(finals), rel=0.1)


def test_danastar_optimizers_step_on_the_same_data():
    d, v = 30, 150
    model = PLRF(ALPHA, BETA, d, v, seed=0)
    lr = 0.25 * min(1.0, 1 / model.trace_k)
    runs = simulate(model, [preset("sgd", ALPHA, d, v, 1)], 1, 200, seeds=3, seed=4,
                    optimizers=[TorchOptimizer("sgd", lr), TorchOptimizer("adana", 1e-3)])
    assert runs.names[1:] == ["sgd", "adana"]
    # torch.optim.SGD on the same stream is the SGD preset, step for step
    np.testing.assert_allclose(runs.risks[1], runs.risks[0], rtol=1e-9)
    assert runs.mean[2, -1] < runs.mean[2, 0]


@pytest.fixture(scope="module")
def exponent_runs():
    d = 300
    v = 5 * d
    names = ["sgd", "momentum", "dana-constant", "dana-decaying"]
    schedules = [preset(name, ALPHA, d, v, 1) for name in names]
    ode = solve_ode(theory_inputs(ALPHA, BETA, d, v), schedules, 1, 10_000)
    return dict(zip(names, ode.risks, strict=True)), ode


def test_sgd_exponent(exponent_runs):
    risks, ode = exponent_runs
    measured = exponent_between(ode.times, risks["sgd"], ode.risk_infinity, 1e3, 1e4)
    assert sgd_exponent(ALPHA, BETA) == pytest.approx(0.8)
    assert measured == pytest.approx(0.8, abs=0.02)


def test_dana_decaying_is_steeper_and_classical_momentum_is_not(exponent_runs):
    risks, ode = exponent_runs
    slope = {name: exponent_between(ode.times, risk, ode.risk_infinity, 1e3, 1e4)
             for name, risk in risks.items()}
    assert slope["dana-decaying"] >= slope["sgd"] + 0.1
    assert slope["momentum"] == pytest.approx(slope["sgd"], abs=0.05)


def test_decade_slopes_of_a_power_law():
    times = evaluation_times(10 ** 4).astype(float)
    risks = 0.5 + 3.0 * np.maximum(times, 1) ** -0.7
    slopes = decade_slopes(times, risks, 0.5)
    assert [s.start for s in slopes] == [1, 10, 100, 1000]
    assert all(s.exponent == pytest.approx(0.7, abs=1e-9) for s in slopes)


def test_custom_schedule_runs_in_both():
    d, v = 40, 200
    model = PLRF(ALPHA, BETA, d, v, seed=0)
    mine = Schedule("mine", g1=lambda t: 1.0 + 0 * t, g2=lambda t: 0.1 + 0 * t,
                    g3=lambda t: 0.05 * (1 + t) ** -0.5, delta=log_time_delta(4.0))
    ode = solve_ode(model.spectral_inputs(), [mine], 1, 500)
    runs = simulate(model, [mine], 1, 500, seeds=4)
    assert ode.risks[0, -1] < ode.risks[0, 0] and runs.mean[0, -1] < runs.mean[0, 0]
