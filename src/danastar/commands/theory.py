"""`danastar theory compare|scaling|exponents|kappa`: figures of the PLRF model (PNG + JSON).

    danastar theory compare                      # SGD vs momentum vs DANA vs AdEMAMix, < 1 min
    danastar theory scaling --ds 100,200,400,800 # risk vs compute, lower envelope per method
    danastar theory exponents --d 1000           # measured decade slopes vs predicted exponents
    danastar theory kappa                        # Adam-like log-time momentum over kappa

Each writes <out>/<figure>.png and <out>/<figure>.json (the data behind the plot).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from danastar import durable
from danastar.errors import UserError
from danastar.progress import Stages

FIGURES = ("compare", "scaling", "exponents", "kappa")


def _common(parser: argparse.ArgumentParser, *, alpha: float, d: str, T: str,
            with_v: bool = True) -> None:
    parser.add_argument("--alpha", type=float, default=alpha,
                        help=f"data spectrum exponent α (default {alpha:g})")
    parser.add_argument("--beta", type=float, default=0.3,
                        help="target exponent β; below 1/2 the exponents are clean (default 0.3)")
    if with_v:
        parser.add_argument("--d", type=int, default=None, help=f"model dimension (default {d})")
        parser.add_argument("--v", type=int, default=None,
                            help="hidden dimension, >= d (default 5d)")
    parser.add_argument("--batch", "-B", type=int, default=1, help="batch size B (default 1)")
    parser.add_argument("--T", type=float, default=None,
                        help=f"horizon in steps, e.g. 1e6 (default {T})")
    parser.add_argument("--dtau", type=float, default=1e-3,
                        help="ODE step in log-time ln(1 + t) (default 1e-3)")
    parser.add_argument("--out", type=Path, default=Path("theory_figures"),
                        help="output folder for <figure>.png and <figure>.json "
                             "(default ./theory_figures)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="danastar theory",
        description="Figures of the power-law random-features model (docs/theory.md).")
    sub = parser.add_subparsers(dest="figure", metavar="{" + ",".join(FIGURES) + "}")
    compare = sub.add_parser(
        "compare", help="risk vs t: SGD, SGD + momentum, DANA-constant, DANA-decaying, "
                        "AdEMAMix (ODE lines, stochastic points)")
    _common(compare, alpha=1.5, d="500", T="d^(2α)")
    compare.add_argument("--sim-steps", type=float, default=None,
                         help="steps of the stochastic runs, 0 for none (default min(T, 1e5))")
    compare.add_argument("--seeds", type=int, default=5,
                         help="stochastic runs per method (default 5)")
    compare.add_argument("--seed", type=int, default=0, help="seed of W and the data (default 0)")
    compare.add_argument("--optim", action="append", default=[], metavar="NAME:lr=X[,key=Y]",
                         help="also run a danastar.optim optimizer on the same data, e.g. "
                              "adana:lr=1e-3,kappa=0.67 (repeatable; points only)")
    compare.add_argument("--framework", choices=("torch", "jax"), default="torch",
                         help="run the --optim optimizers with danastar.optim (torch, default) "
                              "or with their optax versions, danastar.optax (jax: adana, "
                              "dana-mk4, dana-star, dana-star-mk4; needs the 'jax' extra)")
    scaling = sub.add_parser("scaling", help="risk vs compute d·t over d = 100·2^i with the "
                                             "lower envelope per method")
    _common(scaling, alpha=1.0, d="", T="T-factor · d^(2α)", with_v=False)
    scaling.add_argument("--ds", default="100,200,400,800",
                         help="model sizes, comma-separated (default 100,200,400,800)")
    scaling.add_argument("--v-ratio", type=float, default=5.0, help="v / d (default 5)")
    scaling.add_argument("--T-factor", type=float, default=1.0,
                         help="each run lasts T-factor · d^(2α) steps (default 1)")
    exponents = sub.add_parser("exponents",
                               help="measured decade slopes against the predicted exponents")
    _common(exponents, alpha=1.0, d="1000", T="d^(2α)")
    kappa = sub.add_parser("kappa", help="risk-normalised log-time momentum: risk at several "
                                         "horizons against the damping exponent κ")
    _common(kappa, alpha=1.0, d="1000", T="1e5")
    kappa.add_argument("--kappas", default=None,
                       help="κ values, comma-separated (default 20 values in [0, 1))")
    return parser


# The longest horizon: step counts past 2^53 (about 9e15) are not whole numbers in float64.
MAX_STEPS = 10**15
DEFAULT_D = {"compare": 500, "exponents": 1000, "kappa": 1000}


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise UserError(message)


def _integer_steps(value: float | None, flag: str) -> int | None:
    if value is None:
        return None
    _check(math.isfinite(value) and 1 <= value <= MAX_STEPS,
           f"{flag} must be a number of steps from 1 to {MAX_STEPS:.0e}, got {value:g}.")
    return int(round(value))


def _validate(args) -> None:
    for flag, value in (("--alpha", args.alpha), ("--beta", args.beta)):
        _check(math.isfinite(value) and value > 0,
               f"{flag} must be a finite number > 0, got {value:g}.")
    _check(args.batch >= 1, f"--batch must be >= 1, got {args.batch}.")
    _check(0 < args.dtau <= 0.1, f"--dtau must be in (0, 0.1], got {args.dtau:g}.")
    if getattr(args, "d", None) is not None:
        _check(args.d >= 2, f"--d must be >= 2, got {args.d}.")
    if getattr(args, "v", None) is not None:
        d = args.d if args.d is not None else DEFAULT_D[args.figure]
        _check(args.v >= d, f"--v must be >= d = {d}, got {args.v}; pass a larger --v.")
    if args.figure == "compare":
        _draw_fits_in_memory(args.d or DEFAULT_D["compare"], args.v)


def _draw_fits_in_memory(d: int, v: int | None) -> None:
    """compare's simulation draws a v × d random-feature matrix and takes its SVD: refuse a
    draw that would not fit in the memory available now, before it starts."""
    from danastar.machine import available_memory
    from danastar.theory.model import PLRF

    need, free = PLRF.peak_bytes(d, v), available_memory()
    _check(free is None or need <= free,
           f"--d {d} with v = {v or 5 * d} draws a v × d random-feature matrix and takes its "
           f"SVD, about {need / 2**30:,.1f} GiB, more than the "
           f"{free / 2**30:,.1f} GiB this machine has available; give a smaller --d (or --v).")


def _horizon_fits(d: int, alpha: float, factor: float, what: str, fix: str) -> None:
    """The horizon factor·d^(2α) (computed in logs: it can overflow a float) must stay within
    MAX_STEPS."""
    log_steps = math.log(factor) + 2 * alpha * math.log(d)
    _check(log_steps <= math.log(MAX_STEPS),
           f"{what} is about 10^{log_steps / math.log(10):.0f} steps (d = {d}, α = {alpha:g}), "
           f"more than {MAX_STEPS:.0e}; {fix}.")


def parse_optimizer(text: str, framework: str = "torch"):
    """`name:lr=1e-3,key=value,...` -> TorchOptimizer (numbers parsed as floats), checked by
    building the optimizer once on a small tensor (UserError naming --optim otherwise); with
    framework "jax", the optax optimizer of that name."""
    from danastar.theory.simulate import TorchOptimizer

    name, _, rest = text.partition(":")
    name = name.strip()
    hparams: dict = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        key = key.strip()
        _check(bool(sep) and bool(key), f"--optim {text!r}: write options as key=value, e.g. "
                                        "adana:lr=1e-3.")
        _check(key not in hparams, f"--optim {text!r} sets {key} twice; give it once.")
        try:
            hparams[key] = float(value)
        except ValueError:
            hparams[key] = value.strip()
    _check("lr" in hparams, f"--optim {text!r} needs a learning rate: e.g. {name}:lr=1e-3.")
    build = _jax_builder(text, name) if framework == "jax" else _torch_builder(text, name)
    lr = hparams.pop("lr")
    _check(isinstance(lr, float) and math.isfinite(lr) and lr > 0,
           f"--optim {text!r}: lr must be a number > 0, e.g. {name}:lr=1e-3.")
    try:
        build(lr, hparams)
    except (ValueError, TypeError) as error:
        raise UserError(f"--optim {text!r}: {error}.") from None
    return TorchOptimizer(name, float(lr), hparams)


def _torch_builder(text: str, name: str):
    """A function that builds the danastar.optim optimizer ``name`` on a small tensor."""
    import torch

    from danastar.optim import build_optimizer
    from danastar.optim.registry import resolve

    try:
        resolve(name)
    except ValueError as error:
        raise UserError(f"--optim {text!r}: {error}.") from None
    return lambda lr, hparams: build_optimizer(
        name, [torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))], lr=lr, **hparams)


def _jax_builder(text: str, name: str):
    """A function that builds the danastar.optax optimizer ``name``."""
    import importlib.util

    from danastar.extras import needs_extra
    from danastar.theory.simulate import JAX_OPTIMIZERS

    _check(all(importlib.util.find_spec(module) for module in ("jax", "optax")),
           f"{needs_extra('danastar theory --framework jax', 'jax')}.")
    _check(name in JAX_OPTIMIZERS,
           f"--optim {text!r}: --framework jax has {', '.join(JAX_OPTIMIZERS)} "
           f"(danastar.optax); run {name} with --framework torch.")
    from danastar.optax import OPTIMIZERS

    return lambda lr, hparams: OPTIMIZERS[name](lr, **hparams)


def _parse_list(text: str, flag: str, cast, example: str):
    """Comma-separated numbers, at least one, none twice; UserError naming ``flag``."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    kind = "whole numbers" if cast is int else "numbers"
    _check(bool(items), f"{flag} is empty; give comma-separated {kind}, e.g. {flag} {example}.")
    values = []
    for item in items:
        try:
            value = cast(item) if cast is int else float(item)
        except ValueError:
            raise UserError(f"{flag} must be comma-separated {kind} (e.g. {flag} {example}), "
                            f"got {item!r} in {text!r}.") from None
        _check(math.isfinite(value), f"{flag} must hold finite numbers, got {item!r}.")
        _check(value not in values, f"{flag} lists {item} twice; give each value once.")
        values.append(value)
    return values


def _inputs(args) -> dict:
    """Every input of the figure, parsed and range-checked before any work."""
    T = _integer_steps(args.T, "--T")
    d = getattr(args, "d", None) or DEFAULT_D.get(args.figure)
    if T is None and args.figure in ("compare", "exponents"):
        _horizon_fits(d, args.alpha, 1.0, "the default horizon T = d^(2α)",
                      "give --T, or a smaller --d or --alpha")
    inputs: dict = {"T": T}
    if args.figure == "compare":
        inputs["optimizers"] = [parse_optimizer(text, args.framework) for text in args.optim]
        inputs["sim_steps"] = (0 if args.sim_steps == 0
                               else _integer_steps(args.sim_steps, "--sim-steps"))
        _check(args.seeds >= 1, f"--seeds must be >= 1, got {args.seeds}.")
        _check(args.seed >= 0, f"--seed must be >= 0, got {args.seed}.")
    elif args.figure == "scaling":
        ds = _parse_list(args.ds, "--ds", int, "100,200,400,800")
        _check(len(ds) >= 2 and min(ds) >= 2, f"--ds needs two or more sizes >= 2, got {args.ds}.")
        _check(math.isfinite(args.v_ratio) and args.v_ratio >= 1,
               f"--v-ratio must be >= 1, got {args.v_ratio:g}.")
        _check(T is None, "scaling sets each run's length with --T-factor, not --T.")
        _check(math.isfinite(args.T_factor) and args.T_factor > 0,
               f"--T-factor must be > 0, got {args.T_factor:g}.")
        _horizon_fits(max(ds), args.alpha, args.T_factor,
                      "the largest size's horizon T-factor·d^(2α)",
                      "give a smaller --T-factor, --ds or --alpha")
        inputs["ds"] = ds
    elif args.figure == "kappa":
        kappas = None
        if args.kappas is not None:
            kappas = _parse_list(args.kappas, "--kappas", float, "0,0.25,0.5,0.75")
            outside = [k for k in kappas if not 0 <= k < 1]
            _check(not outside, f"--kappas must lie in [0, 1) (the damping exponent; ADana's κ "
                                f"is 1 − it), got {', '.join(f'{k:g}' for k in outside)}.")
        inputs["kappas"] = kappas
    return inputs


def _write(out: Path, name: str, data: dict, figure) -> list[Path]:
    png, data_file = out / f"{name}.png", out / f"{name}.json"
    try:
        out.mkdir(parents=True, exist_ok=True)
        figure.savefig(png, dpi=120)
        durable.write_atomic(data_file, json.dumps(data, indent=1) + "\n")
    except OSError as error:
        raise UserError(f"--out {out} could not be written ({error.strerror or error}); free "
                        "space or give --out a writable folder.") from None
    return [png, data_file]


SLOW_SECONDS = 60  # past this estimate, compare --optim says so before it starts


def _warn_if_slow(args, inputs: dict, figures) -> None:
    """One line on standard error when the --optim runs will take more than about a minute:
    they step in Python, one step at a time."""
    d = args.d or DEFAULT_D["compare"]
    _, steps = figures.compare_steps(args.alpha, d, inputs["T"], inputs["sim_steps"])
    count = len(inputs["optimizers"])
    seconds = figures.optimizer_seconds(d, args.seeds, steps, count)
    if seconds <= SLOW_SECONDS:
        return
    took = f"{seconds / 60:.0f} minutes" if seconds >= 90 else f"{seconds:.0f} s"
    print(f"danastar theory: the {count} --optim run(s) will take about {took} ({steps:,} "
          f"steps x {args.seeds} seeds at d = {d}, each step in Python); for a quick look give "
          "--sim-steps 1e4, fewer --seeds or a smaller --d.", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.figure is None:
        parser.print_help()
        return 2
    _validate(args)
    inputs = _inputs(args)
    durable.check_output(args.out, "--out", folder=True)
    from danastar.theory import figures

    T = inputs["T"]
    started = time.perf_counter()
    # each stage said on standard error as it starts, its steps counted on a terminal
    common = dict(alpha=args.alpha, beta=args.beta, batch=args.batch, dtau=args.dtau,
                  stages=Stages("danastar theory"))
    if args.figure == "compare" and inputs["optimizers"]:
        _warn_if_slow(args, inputs, figures)
    if args.figure == "compare":
        data = figures.compare_data(d=args.d or 500, v=args.v, T=T,
                                    sim_steps=inputs["sim_steps"], seeds=args.seeds,
                                    seed=args.seed, optimizers=inputs["optimizers"],
                                    framework=args.framework, **common)
        figure = figures.plot_compare(data)
    elif args.figure == "scaling":
        data = figures.scaling_data(ds=inputs["ds"], v_ratio=args.v_ratio,
                                    T_factor=args.T_factor, **common)
        figure = figures.plot_scaling(data)
        for key, envelope in data["envelopes"].items():
            print(f"{data['names'][key]:>16}: risk ~ compute^-{envelope['compute_exponent']:.3f}")
    elif args.figure == "exponents":
        data = figures.exponents_data(d=args.d or 1000, v=args.v, T=T, **common)
        figure = figures.plot_exponents(data)
        print(figures.exponents_table(data))
    else:
        data = figures.kappa_data(d=args.d or 1000, v=args.v, T=T or 100_000,
                                  kappas=inputs["kappas"], **common)
        figure = figures.plot_kappa(data)
        for horizon, best in data["best_kappa"].items():
            print(f"t = {float(horizon):.0e}: best κ = {best:.2f} (ADana κ = {1 - best:.2f})")
    written = _write(args.out, args.figure, data, figure)
    elapsed = time.perf_counter() - started
    print(f"wrote {', '.join(str(p) for p in written)} in {elapsed:.1f} s")
    return 0
