"""The optimizer registry: every optimizer the framework can train with, by name, and what each
takes from a training run (its weight-decay style and its hyperparameters)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .adamw import AdamW, AdamWDecayingWD
from .adana import ADana
from .ademamix import AdEMAMix
from .base import check_lr, resolve_state_dtype
from .dana_family import DEFAULT_CLIPSNR
from .dana_star import DanaStar
from .muon import MuonWithAdamW


@dataclass(frozen=True)
class RunSettings:
    """What a training run decides that an optimizer may take (the scaling plan fills it in)."""

    iterations: int
    kappa: float
    delta: float
    clipsnr: float | None
    weight_decay: float
    wd_ts: int | None  # the decaying weight decay's time scale; None for coupled styles
    weight_decay_given: bool  # the user set weight_decay explicitly


def dana_hparams(run: RunSettings) -> dict[str, Any]:
    hparams = dict(delta=run.delta, kappa=run.kappa, weight_decay=run.weight_decay,
                   wd_ts=run.wd_ts)
    if run.clipsnr is not None:
        hparams["clipsnr"] = run.clipsnr
    return hparams


def log_time_ademamix_hparams(run: RunSettings) -> dict[str, Any]:
    """The paper's log-time AdEMAMix: slow EMA horizon and mixing weight grow with the run."""
    return dict(betas=(0.9, 0.999, 1.0 - run.delta / run.iterations),
                alpha=run.iterations ** (1.0 - run.kappa), alpha_warmup=run.iterations,
                beta3_warmup=run.iterations, weight_decay=run.weight_decay)


def decaying_ademamix_hparams(run: RunSettings) -> dict[str, Any]:
    return {**log_time_ademamix_hparams(run), "wd_ts": run.wd_ts, "decaying_wd": True}


def decaying_wd_hparams(run: RunSettings) -> dict[str, Any]:
    return dict(weight_decay=run.weight_decay, wd_ts=run.wd_ts)


def coupled_wd_hparams(run: RunSettings) -> dict[str, Any]:
    return dict(weight_decay=run.weight_decay)


def explicit_wd_hparams(run: RunSettings) -> dict[str, Any]:
    """Optimizers without a weight-decay rule take one only when the user gives it."""
    return dict(weight_decay=run.weight_decay) if run.weight_decay_given else {}


@dataclass(frozen=True)
class Registered:
    """A registry entry. ``weight_decay`` says how a run derives it from omega: "independent"
    (wd_ts = T/10, weight_decay = omega / wd_ts), "coupled" (omega / (peak LR · T)) or "none"."""

    constructor: Callable[..., torch.optim.Optimizer]
    variant: dict[str, Any]  # the constructor defaults that make the named variant
    weight_decay: str
    hparams: Callable[[RunSettings], dict[str, Any]]  # the run's keyword arguments


OPTIMIZERS: dict[str, Registered] = {
    "adana": Registered(ADana, {}, "independent", dana_hparams),
    "dana-mk4": Registered(ADana, {"clipsnr": DEFAULT_CLIPSNR}, "independent", dana_hparams),
    "dana-star": Registered(DanaStar, {}, "independent", dana_hparams),
    "dana-star-mk4": Registered(DanaStar, {"clipsnr": DEFAULT_CLIPSNR}, "independent",
                                dana_hparams),
    "adamw": Registered(torch.optim.AdamW, {"betas": (0.9, 0.999)}, "coupled",
                        coupled_wd_hparams),
    "adamw-decaying-wd": Registered(AdamWDecayingWD, {}, "independent", decaying_wd_hparams),
    "ademamix": Registered(AdEMAMix, {}, "coupled", log_time_ademamix_hparams),
    "ademamix-decaying-wd": Registered(AdEMAMix, {"decaying_wd": True}, "independent",
                                       decaying_ademamix_hparams),
    "muon": Registered(MuonWithAdamW, {}, "coupled", coupled_wd_hparams),
    "sgd": Registered(torch.optim.SGD, {}, "none", explicit_wd_hparams),
}
# Pass-throughs to any torch.optim class or pytorch-optimizer optimizer: no rule, no LR law.
PREFIXES = ("torch:", "pytorch_optimizer:")


def is_prefixed(name: str) -> bool:
    """A well-formed pass-through name such as ``torch:NAdam``."""
    return name.startswith(PREFIXES) and bool(name.split(":", 1)[1])


def weight_decay_style(name: str) -> str:
    """How ``name`` takes its weight decay from omega ("none" for pass-throughs)."""
    return OPTIMIZERS[name].weight_decay if name in OPTIMIZERS else "none"


def snr_clipped(name: str) -> bool:
    """Whether ``name`` is a variant that clips the signal-to-noise ratio (the ``*-mk4`` ones)."""
    return name in OPTIMIZERS and "clipsnr" in OPTIMIZERS[name].variant


def takes_state_dtype(name: str) -> bool:
    """Whether ``name`` can keep its state in another dtype (``state_dtype``): danastar's own
    optimizers."""
    return name == "adamw" or name in OPTIMIZERS and "state_dtype" in inspect.signature(
        OPTIMIZERS[name].constructor).parameters


def state_dtype_optimizers() -> list[str]:
    return [name for name in OPTIMIZERS if takes_state_dtype(name)]


def run_hparams(name: str, run: RunSettings) -> dict[str, Any]:
    """The keyword arguments ``build_optimizer(name, ...)`` takes from a run."""
    if name in OPTIMIZERS:
        return OPTIMIZERS[name].hparams(run)
    return explicit_wd_hparams(run)


def normalize_params(params) -> list:
    """Tensors or param-group dicts as torch expects; ``(name, tensor)`` pairs (from
    ``named_parameters()``, alone or inside groups) become groups with a ``"names"`` list."""
    items = list(params)
    if not items:
        raise ValueError("build_optimizer got no parameters")
    if not isinstance(items[0], dict):
        items = [{"params": items}]
    groups = []
    for group in items:
        group = dict(group)  # never modify the caller's dicts
        entries = list(group["params"]) if not torch.is_tensor(group["params"]) else [
            group["params"]]
        if entries and isinstance(entries[0], tuple):
            group["names"] = [name for name, _ in entries]
            entries = [param for _, param in entries]
        group["params"] = entries
        groups.append(group)
    return groups


def resolve(name: str) -> tuple[Callable[..., torch.optim.Optimizer], dict]:
    """The constructor and variant defaults for a registry name."""
    if name in OPTIMIZERS:
        return OPTIMIZERS[name].constructor, OPTIMIZERS[name].variant
    if name.startswith("torch:"):
        cls = getattr(torch.optim, name.removeprefix("torch:"), None)
        if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer):
            return cls, {}
        valid = sorted(n for n, c in vars(torch.optim).items()
                       if isinstance(c, type) and issubclass(c, torch.optim.Optimizer)
                       and c is not torch.optim.Optimizer)
        raise ValueError(f"unknown optimizer {name!r}; torch.optim has: {', '.join(valid)}")
    if name.startswith("pytorch_optimizer:"):
        try:
            import pytorch_optimizer  # noqa: PLC0415  an optional extra (baselines)
        except ImportError:
            raise ValueError(f"optimizer {name!r} needs the pytorch-optimizer package: "
                             "pip install 'danastar[baselines]'") from None
        short = name.removeprefix("pytorch_optimizer:")
        try:
            return pytorch_optimizer.load_optimizer(short), {}
        except NotImplementedError:
            valid = ", ".join(pytorch_optimizer.get_supported_optimizers())
            raise ValueError(f"unknown optimizer {name!r}; pytorch_optimizer has: "
                             f"{valid}") from None
    raise ValueError(f"unknown optimizer {name!r}; valid names: {', '.join(OPTIMIZERS)}, "
                     f"or torch:<Name> for any torch.optim class, or "
                     f"pytorch_optimizer:<name> (pytorch-optimizer package)")


def build_optimizer(name: str, params, lr: float, **hparams) -> torch.optim.Optimizer:
    """Build the optimizer registered as ``name`` over ``params`` with peak LR ``lr``.

    ``params``: tensors, ``(name, tensor)`` pairs, or param-group dicts (optionally with a
    ``"names"`` list). Hyperparameters use the constructors' keyword names (``delta``, ``kappa``,
    ``clipsnr``, ``weight_decay``, ``wd_ts``, ``betas``, ...). Every group gets ``initial_lr``.
    """
    constructor, variant = resolve(name)
    state_dtype = resolve_state_dtype(hparams.get("state_dtype", torch.float32))
    if constructor is torch.optim.AdamW and (state_dtype != torch.float32
                                             or hparams.get("stochastic_rounding")):
        constructor = AdamW  # torch's update, with the state options torch's AdamW lacks
    check_lr(lr)  # the one rule (hparams.check_lr), before a constructor of torch's own
    accepted = inspect.signature(constructor).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    unknown = sorted(set(hparams) - set(accepted)) if not takes_any else []
    if unknown:
        valid = [n for n, p in accepted.items() if n not in ("self", "params", "lr")
                 and p.kind is not p.VAR_KEYWORD]
        raise ValueError(f"unknown hyperparameter(s) {', '.join(unknown)} for optimizer "
                         f"{name!r}; valid: {', '.join(valid)}")
    groups = normalize_params(params)
    optimizer = constructor(groups, lr=lr, **{**variant, **hparams})
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    return optimizer
