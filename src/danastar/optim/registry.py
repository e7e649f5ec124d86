"""The optimizer registry: every optimizer the framework can train with, by name."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from .adamw import AdamWDecayingWD
from .adana import ADana
from .ademamix import AdEMAMix
from .dana_star import DanaStar
from .muon import MuonWithAdamW

# name -> (constructor, defaults that make the named variant)
OPTIMIZERS: dict[str, tuple[Callable[..., torch.optim.Optimizer], dict]] = {
    "adana": (ADana, {}),
    "dana-mk4": (ADana, {"clipsnr": 2.0}),
    "dana-star": (DanaStar, {}),
    "dana-star-mk4": (DanaStar, {"clipsnr": 2.0}),
    "adamw": (torch.optim.AdamW, {"betas": (0.9, 0.999)}),
    "adamw-decaying-wd": (AdamWDecayingWD, {}),
    "ademamix": (AdEMAMix, {}),
    "ademamix-decaying-wd": (AdEMAMix, {"decaying_wd": True}),
    "muon": (MuonWithAdamW, {}),
    "sgd": (torch.optim.SGD, {}),
}
PREFIXES = ("torch:", "pytorch_optimizer:")


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
        return OPTIMIZERS[name]
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
            import pytorch_optimizer
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
    if lr < 0:
        raise ValueError(f"lr must be >= 0, got {lr}")
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
