"""danastar.theory: the power-law random-features model, a stochastic simulator, the ODE.

    from danastar.theory import PLRF, preset, simulate, solve_ode, theory_inputs
    model = PLRF(alpha=1.0, beta=0.3, d=200)
    schedules = [preset(name, 1.0, 200, 1000, batch=1) for name in ("sgd", "dana-decaying")]
    ode = solve_ode(model.spectral_inputs(), schedules, batch=1, t_max=10_000)
    runs = simulate(model, schedules, batch=1, steps=10_000, seeds=8)

See docs/theory.md for the math, the figures and how to try a schedule of one's own.
"""

from .exponents import (
                        DecadeSlope,
                        dana_decaying_exponent,
                        decade_slopes,
                        exponent_between,
                        predicted_exponents,
                        sgd_exponent,
)
from .model import (
                        PLRF,
                        ODEInputs,
                        base_learning_rate,
                        kappa_fixed_point,
                        limit_risk,
                        solve_scale_directly,
                        tau_fixed_point,
                        theory_inputs,
                        trace_k,
)
from .ode import ODEResult, evaluation_times, solve_ode
from .schedules import (
                        PRESETS,
                        Schedule,
                        adam_like,
                        ademamix,
                        classical_momentum,
                        dana_constant,
                        dana_decaying,
                        log_time_delta,
                        preset,
                        sgd,
)
from .simulate import SimulationResult, TorchOptimizer, simulate

__all__ = [
    "PLRF", "ODEInputs", "trace_k", "base_learning_rate", "kappa_fixed_point", "tau_fixed_point",
    "limit_risk", "solve_scale_directly", "theory_inputs",
    "Schedule", "PRESETS", "preset", "sgd", "classical_momentum", "dana_constant",
    "dana_decaying", "ademamix", "adam_like", "log_time_delta",
    "ODEResult", "evaluation_times", "solve_ode",
    "SimulationResult", "TorchOptimizer", "simulate",
    "DecadeSlope", "decade_slopes", "exponent_between", "sgd_exponent",
    "dana_decaying_exponent", "predicted_exponents",
]
