import subprocess
import sys

import numpy as np
import pytest

from danastar.theory import (
    PLRF,
    kappa_fixed_point,
    limit_risk,
    solve_scale_directly,
    tau_fixed_point,
    theory_inputs,
    trace_k,
)


@pytest.fixture(scope="module")
def model():
    return PLRF(alpha=1.0, beta=0.3, d=60, v=300, seed=3)


def test_risk_is_the_population_risk_of_the_samples(model):
    theta = np.random.default_rng(0).standard_normal(model.d) * 0.3
    x, y = model.sample(50_000, np.random.default_rng(1))
    monte_carlo = 0.5 * np.mean((x @ theta - y) ** 2)
    assert monte_carlo == pytest.approx(model.risk(theta), rel=0.04)


def test_empirical_limit_risk_is_the_least_squares_residual(model):
    solution, residual, *_ = np.linalg.lstsq(model.W_hat, model.b_hat, rcond=None)
    assert model.risk_infinity == pytest.approx(0.5 * residual[0], rel=1e-10)
    assert model.risk(model.optimum) == pytest.approx(model.risk_infinity, rel=1e-10)
    np.testing.assert_allclose(model.optimum, solution, rtol=1e-8, atol=1e-12)


def test_spectral_inputs_reproduce_the_initial_risk(model):
    inputs = model.spectral_inputs()
    np.testing.assert_allclose(inputs.eigenvalues,
                               np.linalg.eigvalsh(model.W_hat.T @ model.W_hat)[::-1], rtol=1e-9)
    assert inputs.initial_risk == pytest.approx(model.risk(np.zeros(model.d)), rel=1e-10)


def test_trace_k():
    assert trace_k(1.0, 4) == pytest.approx(1 + 1 / 4 + 1 / 9 + 1 / 16)


@pytest.mark.parametrize("alpha", [0.75, 1.0, 1.5])
def test_kappa_fixed_point_against_a_root_finder_and_the_discrete_sum(alpha):
    d, v = 200, 1000
    kappa = kappa_fixed_point(alpha, d, v, rtol=1e-8)
    from scipy import integrate
    integral, _ = integrate.quad(lambda x: 1 / (kappa + x ** (2 * alpha)), 0, v / d)
    assert kappa * integral == pytest.approx(1.0, rel=1e-6)
    # the continuum scale kappa d^(2 alpha) against the discrete fixed point, solved directly
    direct = solve_scale_directly(alpha, d, v)
    assert tau_fixed_point(alpha, d, v, rtol=1e-9) == pytest.approx(direct, rel=1e-6)
    assert kappa * d ** (2 * alpha) == pytest.approx(direct, rel=0.02)
    assert limit_risk(alpha, 0.3, d, v, "kappa") == pytest.approx(
        limit_risk(alpha, 0.3, d, v, "tau"), rel=0.02)


@pytest.mark.parametrize("alpha,beta", [(1.0, 0.3), (0.4, 0.3)])
def test_limit_risk_matches_sampled_models(alpha, beta):
    d, v = 120, 600
    sampled = np.mean([PLRF(alpha, beta, d, v, seed=s).risk_infinity for s in range(6)])
    assert limit_risk(alpha, beta, d, v) == pytest.approx(sampled, rel=0.15)


def test_theory_inputs():
    inputs = theory_inputs(1.0, 0.3, 50)
    np.testing.assert_allclose(inputs.eigenvalues * inputs.rho,
                               np.arange(1, 51.0) ** (-2.6), rtol=1e-12)
    shifted = theory_inputs(1.0, 0.7, 50)
    c_beta = np.sum(np.arange(1, 51.0) ** -1.4)
    assert shifted.rho[-1] == pytest.approx(50.0 ** -1.4 + c_beta / 50)


def test_a_draw_takes_no_more_memory_than_it_says():
    """`PLRF.peak_bytes` (what `theory compare` checks against the memory available) bounds the
    peak a draw adds, measured in a fresh process (VmHWM: getrusage's maximum would carry the
    parent's over exec)."""
    script = ("from danastar.theory import PLRF\n"
              "def peak():\n"
              "    status = open('/proc/self/status').read()\n"
              "    return int(status.split('VmHWM:')[1].split()[0]) * 1024\n"
              "before = peak()\n"
              "PLRF(1.0, 0.5, 500, 2500)\n"
              "print(peak() - before)\n")
    added = int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                               check=True).stdout)
    matrix = 8 * 500 * 2500
    assert 3 * matrix < added <= PLRF.peak_bytes(500, 2500), added / matrix
