"""The data and the figures of `danastar theory compare|scaling|exponents|kappa`.

Each figure has a `<name>_data(...)` function returning a JSON-ready dict (everything the plot
shows) and a `plot_<name>(data)` function returning a matplotlib Figure. matplotlib is imported
only by the plotting functions (it is in the `plots` extra). A data function given a command's
`Stages` says each stage as it starts (the SVD, each ODE, the simulation) and counts its steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from danastar.errors import UserError
from danastar.progress import SILENT, Stages

from .exponents import decade_slopes, exponent_between, predicted_exponents, sgd_exponent
from .model import PLRF, base_learning_rate, limit_risk, theory_inputs, trace_k
from .ode import evaluation_times, solve_ode
from .schedules import adam_like, preset
from .simulate import TorchOptimizer, simulate

COMPARE_METHODS = ("sgd", "momentum", "dana-constant", "dana-decaying", "ademamix")
COLORS = {"sgd": "tab:blue", "momentum": "tab:cyan", "dana-constant": "tab:orange",
          "dana-decaying": "tab:red", "ademamix": "tab:green"}
OPTIMIZER_COLORS = ("tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:gray")


def _figure(ncols: int = 1, width: float = 7.0, height: float = 5.0):
    try:  # matplotlib, of the theory extra: only the plotting functions import it
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError:
        raise UserError("the theory figures need matplotlib: pip install 'danastar[theory]' "
                        "(or pip install matplotlib).") from None
    figure = Figure(figsize=(width * ncols, height), layout="constrained")
    axes = figure.subplots(1, ncols, squeeze=False)[0]
    return figure, axes


def _header(alpha, beta, d, v, batch) -> str:
    return f"α = {alpha:g}, β = {beta:g}, d = {d}, v = {v}, B = {batch}"


# ---------------------------------------------------------------------------------------------
# compare: risk against t for the presets, ODE lines and stochastic points


# Seconds per step of one --optim optimizer in the stochastic runs: a torch step (Python
# overhead) plus two (seeds, d) x (d, d) changes of basis. Measured on a 2-core CPU at d = 40,
# 200 and 500 with 5 seeds (0.3 ms, 0.5 ms and 5 to 13 ms a step); a little above the fastest.
OPTIMIZER_STEP_SECONDS = 3e-4
OPTIMIZER_STEP_SECONDS_PER_ENTRY = 4e-9  # times seeds · d²


def compare_steps(alpha: float, d: int, T: int | None,
                  sim_steps: int | None) -> tuple[int, int]:
    """The horizon T and the stochastic runs' steps of `compare_data` (defaults filled in)."""
    T = int(round(d ** (2 * alpha))) if T is None else int(T)
    return T, min(T, 100_000) if sim_steps is None else min(int(sim_steps), T)


def optimizer_seconds(d: int, seeds: int, sim_steps: int, optimizers: int) -> float:
    """About how long the stochastic runs of `optimizers` danastar.optim optimizers take."""
    per_step = OPTIMIZER_STEP_SECONDS + OPTIMIZER_STEP_SECONDS_PER_ENTRY * seeds * d * d
    return optimizers * sim_steps * per_step


def optimizer_label(entry: dict) -> str:
    """The legend label of one --optim curve: its name, LR and every option given (κ, ...)."""
    options = [f"lr {entry['lr']:g}"]
    for key, value in entry.get("hparams", {}).items():
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        options.append(f"{'κ' if key == 'kappa' else key}={shown}")
    library = "danastar.optax" if entry.get("framework") == "jax" else "danastar.optim"
    return f"{entry['name']} ({library}, {', '.join(options)})"


def compare_data(alpha: float = 1.5, beta: float = 0.3, d: int = 500, v: int | None = None,
                 batch: int = 1, T: int | None = None, sim_steps: int | None = None,
                 seeds: int = 5, seed: int = 0,
                 optimizers: Sequence[TorchOptimizer] = (), dtau: float = 1e-3,
                 framework: str = "torch", stages: Stages = SILENT) -> dict:
    """The ODE on the exact inputs of one W up to T, and `seeds` stochastic runs on that W up to
    sim_steps (default min(T, 10^5)), for every preset and any danastar.optim optimizers (or,
    with ``framework="jax"``, their danastar.optax versions)."""
    v = 5 * d if v is None else v
    T, sim_steps = compare_steps(alpha, d, T, sim_steps)
    stages.start(f"drawing W, a {v:,} × {d:,} random-feature matrix, and its SVD")
    model = PLRF(alpha, beta, d, v, seed=seed)
    schedules = [preset(name, alpha, d, v, batch) for name in COMPARE_METHODS]
    stages.start(_solving(len(schedules), "methods", d, T))
    ode = solve_ode(model.spectral_inputs(), schedules, batch, T, dtau=dtau, stages=stages)
    runs = None
    if sim_steps > 0:
        count = len(schedules) + len(optimizers)
        stages.start(f"simulating {seeds} run{'s' * (seeds > 1)} of each of {count} methods "
                     f"for {sim_steps:,} steps")
        runs = simulate(model, schedules, batch, sim_steps, seeds=seeds, seed=seed + 1,
                        optimizers=optimizers, framework=framework, stages=stages)
    methods = []
    for i, (key, schedule) in enumerate(zip(COMPARE_METHODS, schedules, strict=True)):
        entry = {"key": key, "name": schedule.name, "ode_risk": ode.risks[i].tolist()}
        if runs is not None:
            entry["sim_mean"] = runs.mean[i].tolist()
            entry["sim_std"] = runs.std[i].tolist()
        methods.append(entry)
    extra = []
    for j, spec in enumerate(optimizers):
        i = len(schedules) + j
        extra.append({"name": spec.display_name, "optimizer": spec.name, "lr": spec.lr,
                      "hparams": spec.hparams, "framework": framework,
                      "sim_mean": runs.mean[i].tolist(),
                      "sim_std": runs.std[i].tolist()})
    return {
        "figure": "compare", "alpha": alpha, "beta": beta, "d": d, "v": v, "batch": batch,
        "T": T, "sim_steps": sim_steps, "seeds": seeds, "seed": seed, "dtau": dtau,
        "trace_k": trace_k(alpha, v), "lr0": base_learning_rate(alpha, v, batch),
        "risk_infinity": model.risk_infinity,
        "risk_infinity_theory": limit_risk(alpha, beta, d, v),
        "ode_times": ode.times.tolist(),
        "sim_times": runs.times.tolist() if runs is not None else [],
        "methods": methods, "optimizers": extra,
    }


def _solving(count: int, what: str, d: int, T: int) -> str:
    """What a stage that solves the ODE says: `solving the ODE of 5 methods at d = 500 ...`."""
    return f"solving the ODE of {count} {what} at d = {d:,}, up to t = {T:,}"


def _mean_and_error(entry: dict, seeds: int, shown: np.ndarray):
    """Mean over seeds and its standard error (the lower bar kept above zero for log axes)."""
    mean = np.asarray(entry["sim_mean"])[shown]
    error = np.asarray(entry["sim_std"])[shown] / np.sqrt(seeds)
    return mean, np.stack([np.minimum(error, 0.9 * mean), error])


def plot_compare(data: dict):
    figure, (ax,) = _figure()
    sim_times = np.asarray(data["sim_times"])
    shown = sim_times >= 1
    # thin the points to about 8 per decade so the error bars stay readable
    if shown.any():
        keep = np.unique(np.round(np.log10(np.maximum(sim_times, 1)) * 8))
        picks = [int(np.argmin(np.abs(np.log10(np.maximum(sim_times, 1)) * 8 - k)))
                 for k in keep]
        shown = np.zeros_like(shown)
        shown[picks] = True
        shown &= sim_times >= 1
    ode_times = np.asarray(data["ode_times"])
    for method in data["methods"]:
        color = COLORS.get(method["key"], None)
        line_style = "--" if method["key"] == "momentum" else "-"
        ax.plot(ode_times[1:], method["ode_risk"][1:], line_style, color=color, lw=2,
                label=method["name"])
        if "sim_mean" in method:
            mean, error = _mean_and_error(method, data["seeds"], shown)
            ax.errorbar(sim_times[shown], mean, yerr=error, fmt="o", ms=3.5,
                        color=color, capsize=2, alpha=0.8, lw=1)
    for j, entry in enumerate(data["optimizers"]):
        mean, error = _mean_and_error(entry, data["seeds"], shown)
        ax.errorbar(sim_times[shown], mean, yerr=error, fmt="s", ms=3.5,
                    color=OPTIMIZER_COLORS[j % len(OPTIMIZER_COLORS)], capsize=2, lw=1,
                    label=optimizer_label(entry))
    ax.axhline(data["risk_infinity"], color="black", ls="--", lw=1.2, label="R∞ (this W)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("step t")
    ax.set_ylabel("population risk R(θ_t)")
    ax.set_title(f"{_header(data['alpha'], data['beta'], data['d'], data['v'], data['batch'])}\n"
                 f"lines: ODE on this W; points: mean ± s.e. of {data['seeds']} runs",
                 fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    # beside the axes: inside, it covers R∞'s line and the early points
    figure.set_size_inches(9.5 if data["optimizers"] else 8.5, 5.0)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return figure


# ---------------------------------------------------------------------------------------------
# scaling: risk against compute d t over model sizes, with the lower envelope per method


SCALING_METHODS = ("sgd", "dana-constant", "dana-decaying")


def scaling_data(alpha: float = 1.0, beta: float = 0.3, ds: Sequence[int] = (100, 200, 400, 800),
                 v_ratio: float = 5.0, batch: int = 1, T_factor: float = 1.0,
                 methods: Sequence[str] = SCALING_METHODS, dtau: float = 1e-3,
                 stages: Stages = SILENT) -> dict:
    """The ODE (theory inputs) for every d up to T = T_factor d^(2 alpha); compute = d t.

    The envelope is, at each compute, the lowest risk over the model sizes; its slope against
    compute over the middle of its range is the method's compute exponent.
    """
    ds = [int(d) for d in ds]
    curves = {key: [] for key in methods}
    for index, d in enumerate(ds):
        v = int(round(v_ratio * d))
        T = max(int(round(T_factor * d ** (2 * alpha))), 10)
        schedules = [preset(key, alpha, d, v, batch) for key in methods]
        stages.start(f"size {index + 1} of {len(ds)}: "
                     + _solving(len(schedules), "methods", d, T))
        ode = solve_ode(theory_inputs(alpha, beta, d, v), schedules, batch, T, dtau=dtau,
                        stages=stages)
        for i, key in enumerate(methods):
            curves[key].append({"d": d, "v": v, "T": T, "times": ode.times.tolist(),
                                "risk": ode.risks[i].tolist()})
    low = min(ds) * 10.0
    high = max(d * c["times"][-1] for d, c in zip(ds, curves[methods[0]], strict=True))
    compute = np.logspace(np.log10(low), np.log10(high), 200)
    envelopes = {}
    for key in methods:
        stacked = []
        for d, curve in zip(ds, curves[key], strict=True):
            flops = d * np.asarray(curve["times"])
            risk = np.asarray(curve["risk"])
            inside = (compute >= d * 1.0) & (compute <= flops[-1])
            values = np.full_like(compute, np.inf)
            values[inside] = np.exp(np.interp(np.log(compute[inside]), np.log(flops[1:]),
                                              np.log(risk[1:])))
            stacked.append(values)
        stacked = np.asarray(stacked)
        envelope = np.min(stacked, axis=0)
        # fit the compute exponent where the envelope is a frontier: from where the second
        # size first wins to where the largest size first wins (past it, no larger model
        # exists and the envelope is only the largest model's own curve)
        finite = np.isfinite(envelope)
        best = np.where(finite, np.argmin(stacked, axis=0), -1)
        start = compute[np.argmax(best >= 1)]
        stop = compute[np.argmax(best == len(ds) - 1)]
        try:
            slope = exponent_between(compute[finite], envelope[finite], 0.0, start, stop)
        except ValueError:
            slope = float("nan")
        envelopes[key] = {"risk": np.where(finite, envelope, np.nan).tolist(),
                          "compute_exponent": slope, "fit_range": [start, stop]}
    names = {key: preset(key, alpha, ds[0], int(v_ratio * ds[0]), batch).name for key in methods}
    return {"figure": "scaling", "alpha": alpha, "beta": beta, "ds": ds, "v_ratio": v_ratio,
            "batch": batch, "T_factor": T_factor, "dtau": dtau, "compute": compute.tolist(),
            "names": names, "curves": curves, "envelopes": envelopes}


def plot_scaling(data: dict):
    figure, (ax,) = _figure()
    compute = np.asarray(data["compute"])
    for key, runs in data["curves"].items():
        color = COLORS.get(key)
        for run in runs:
            times = np.asarray(run["times"])[1:]
            ax.plot(run["d"] * times, run["risk"][1:], color=color, lw=0.8, alpha=0.35)
        envelope = data["envelopes"][key]
        ax.plot(compute, envelope["risk"], color=color, lw=2.5,
                label=f"{data['names'][key]} envelope (fitted slope "
                      f"−{envelope['compute_exponent']:.2f})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("compute d · t")
    ax.set_ylabel("risk (ODE, deterministic limit)")
    sizes = ", ".join(str(d) for d in data["ds"])
    ax.set_title(f"α = {data['alpha']:g}, β = {data['beta']:g}, B = {data['batch']}, "
                 f"v = {data['v_ratio']:g}d; thin lines: d = {sizes}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=9, loc="lower left")
    return figure


# ---------------------------------------------------------------------------------------------
# exponents: measured decade slopes against the predicted exponents


EXPONENT_METHODS = ("sgd", "momentum", "dana-constant", "dana-decaying")


def exponents_data(alpha: float = 1.0, beta: float = 0.3, d: int = 1000, v: int | None = None,
                   batch: int = 1, T: int | None = None,
                   methods: Sequence[str] = EXPONENT_METHODS, dtau: float = 1e-3,
                   stages: Stages = SILENT) -> dict:
    """Decade slopes of the ODE risk (theory inputs) for each method, and the predictions."""
    v = 5 * d if v is None else v
    T = int(round(d ** (2 * alpha))) if T is None else int(T)
    schedules = [preset(key, alpha, d, v, batch) for key in methods]
    stages.start(_solving(len(schedules), "methods", d, T))
    ode = solve_ode(theory_inputs(alpha, beta, d, v), schedules, batch, T, dtau=dtau,
                    stages=stages)
    predicted = predicted_exponents(alpha, beta)
    rows = []
    for i, key in enumerate(methods):
        slopes = decade_slopes(ode.times, ode.risks[i], ode.risk_infinity)
        rows.append({"key": key, "name": schedules[i].name, "predicted": predicted.get(key),
                     "decades": [{"start": s.start, "stop": s.stop, "exponent": s.exponent}
                                 for s in slopes]})
    return {"figure": "exponents", "alpha": alpha, "beta": beta, "d": d, "v": v,
            "batch": batch, "T": T, "dtau": dtau, "sgd_exponent": sgd_exponent(alpha, beta),
            "risk_infinity": ode.risk_infinity, "methods": rows}


def exponents_table(data: dict) -> str:
    """A Markdown table: one row per method, one column per decade, then the prediction."""
    decades = sorted({(s["start"], s["stop"]) for row in data["methods"]
                      for s in row["decades"]})
    header = ["method"] + [f"[1e{int(np.log10(a))}, 1e{int(np.log10(b))}]" for a, b in decades]
    header.append("predicted")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in data["methods"]:
        by_decade = {(s["start"], s["stop"]): s["exponent"] for s in row["decades"]}
        cells = [row["name"]] + [f"{by_decade[k]:.3f}" if k in by_decade else ""
                                 for k in decades]
        cells.append("" if row["predicted"] is None else f"{row['predicted']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_exponents(data: dict):
    figure, (ax,) = _figure()
    for row in data["methods"]:
        color = COLORS.get(row["key"])
        middles = [np.sqrt(s["start"] * s["stop"]) for s in row["decades"]]
        values = [s["exponent"] for s in row["decades"]]
        style = "s--" if row["key"] == "momentum" else "o-"
        ax.plot(middles, values, style, color=color, lw=1.8, ms=6, label=f"{row['name']}")
    predicted_seen = set()
    for row in data["methods"]:
        value = row["predicted"]
        if value is None or round(value, 6) in predicted_seen:
            continue
        predicted_seen.add(round(value, 6))
        label = ("predicted SGD (2α+2β−1)/(2α)" if row["key"] in ("sgd", "momentum",
                                                                  "dana-constant")
                 else f"predicted {row['name']}")
        ax.axhline(value, color=COLORS.get(row["key"]), ls=":", lw=1.5,
                   label=f"{label} = {value:.3f}")
    ax.axvline(data["d"], color="gray", lw=0.8, ls="-.", label="t = d")
    ax.set_xscale("log")
    ax.set_xlabel("decade of t (geometric middle)")
    ax.set_ylabel("exponent: −slope of log(R − R∞) vs log t")
    ax.set_title(f"{_header(data['alpha'], data['beta'], data['d'], data['v'], data['batch'])}"
                 "\nODE, deterministic-limit inputs", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8.5, loc="lower center")
    return figure


# ---------------------------------------------------------------------------------------------
# kappa: the risk-normalised (Adam-like) log-time momentum over its damping exponent


def kappa_data(alpha: float = 1.0, beta: float = 0.3, d: int = 1000, v: int | None = None,
               batch: int = 1, T: int = 100_000, kappas: Sequence[float] | None = None,
               dtau: float = 1e-3, stages: Stages = SILENT) -> dict:
    """The ODE (theory inputs) of `adam_like` for each kappa, and its risk at the horizons
    10^k <= T."""
    v = 5 * d if v is None else v
    kappas = np.linspace(0.0, 1.0, 20, endpoint=False) if kappas is None else np.asarray(kappas)
    schedules = [adam_like(alpha, d, v, batch, float(kappa)) for kappa in kappas]
    horizons = [10.0 ** k for k in range(1, int(np.floor(np.log10(T))) + 1)]
    times = np.unique(np.concatenate([evaluation_times(T), horizons]))
    stages.start(_solving(len(schedules), "values of κ", d, T))
    ode = solve_ode(theory_inputs(alpha, beta, d, v), schedules, batch, T, dtau=dtau,
                    times=times, stages=stages)
    at = [int(np.argmin(np.abs(ode.times - h))) for h in horizons]
    risk_at = {f"{h:g}": ode.risks[:, k].tolist() for h, k in zip(horizons, at, strict=True)}
    return {"figure": "kappa", "alpha": alpha, "beta": beta, "d": d, "v": v, "batch": batch,
            "T": T, "dtau": dtau, "kappas": kappas.tolist(), "horizons": horizons,
            "risk_at": risk_at, "risk_infinity": ode.risk_infinity,
            "initial_excess_risk": float(ode.risks[0, 0] - ode.risk_infinity),
            "best_kappa": {key: float(kappas[int(np.nanargmin(values))])
                           for key, values in risk_at.items()}}


def plot_kappa(data: dict):
    figure, (ax,) = _figure()
    kappas = np.asarray(data["kappas"])
    try:
        from matplotlib import colormaps  # noqa: PLC0415 (the theory extra)
        cmap = colormaps["viridis"]
    except ImportError:  # pragma: no cover - very old matplotlib
        cmap = None
    n = len(data["horizons"])
    for i, horizon in enumerate(data["horizons"]):
        values = np.asarray(data["risk_at"][f"{horizon:g}"]) - data["risk_infinity"]
        color = cmap(i / max(n - 1, 1)) if cmap else None
        ax.plot(kappas, values, "o-", ms=3.5, color=color, label=f"t = {horizon:.0e}")
        best = int(np.nanargmin(values))
        ax.plot(kappas[best], values[best], "*", ms=13, color=color, mec="black", mew=0.6)
    ax.set_yscale("log")
    # diverging runs (large kappa) would squash the rest: show up to the initial excess risk
    ax.set_ylim(top=2 * data["initial_excess_risk"])
    ax.set_xlabel("κ: momentum coefficient g3 = g2 (1 + t)^κ  (ADana's κ is 1 − κ)")
    ax.set_ylabel("excess risk R − R∞ at horizon t (ODE)")
    secondary = ax.secondary_xaxis("top", functions=(lambda k: 1 - k, lambda k: 1 - k))
    secondary.set_xlabel("ADana κ")
    ax.set_title(f"{_header(data['alpha'], data['beta'], data['d'], data['v'], data['batch'])}\n"
                 "risk-normalised log-time momentum; ★ best κ per horizon", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=9, loc="best")
    return figure
