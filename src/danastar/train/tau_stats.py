"""τ statistics of the Dana-Star optimizers (`--collect_tau_stats`): how the per-coordinate
estimate τ of how often a coordinate's gradient is "on" is distributed, tensor by tensor, as the
run goes.

At the evaluations numbered 10, 20, 40, 80, ... (evaluation 0 is the one at step 0; evaluation
n is at step n · eval_interval), for every parameter with a τ buffer, τ is sorted and the order
statistics at indices I_k = ⌊1.1^k⌋ − 1 (k = 0 … ⌈ln n / ln 1.1⌉, unique, clipped to n − 1) are
kept from both ends: enough to redraw the whole CDF on a logit scale from a few hundred numbers
per tensor. The evaluation number is a function of the step, so a resumed run keeps the schedule.

Files (never pickle), under `<run_dir>/tau_stats/`:

    step-<step>.npz    per parameter `<name>`: `<name>::smallest` (τ at I_k, ascending),
                       `<name>::largest` (τ at n − 1 − I_k, descending), `<name>::indices` (I_k),
                       `<name>::shape`; n is the product of the shape. A routed expert
                       parameter of a mixture of experts (stacked, one slice per expert) also
                       has one entry per slice, named `<name>[<e>]` (expert e), in the same
                       format
    metadata.json      optimizer, arch, heads, settings, eval_interval, the schedule, and the
                       collections so far (step, evaluation, file)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from danastar.durable import write_atomic
from danastar.models.moe import MoE


def order_indices(n: int) -> np.ndarray:
    """I_k = ⌊1.1^k⌋ − 1 for k = 0 … ⌈ln n / ln 1.1⌉, unique and clipped to [0, n − 1]."""
    if n <= 1:
        return np.zeros(1, dtype=np.int64)
    top = math.ceil(math.log(n) / math.log(1.1))
    raw = np.floor(1.1 ** np.arange(top + 1)).astype(np.int64) - 1
    return np.unique(np.clip(raw, 0, n - 1))


def is_collection(evaluation: int) -> bool:
    """Evaluations 10, 20, 40, 80, ...: 10 · 2^j."""
    if evaluation < 10 or evaluation % 10:
        return False
    quotient = evaluation // 10
    return quotient & (quotient - 1) == 0


def collection_due(step: int, eval_interval: int) -> bool:
    """Whether the periodic evaluation at `step` is one of the collected ones."""
    return step % eval_interval == 0 and is_collection(step // eval_interval)


def order_statistics(tau: torch.Tensor) -> dict[str, np.ndarray]:
    values = np.sort(tau.detach().float().cpu().numpy().reshape(-1))
    indices = order_indices(values.size)
    return {"smallest": values[indices], "largest": values[values.size - 1 - indices],
            "indices": indices, "shape": np.array(tau.shape, dtype=np.int64)}


def collect(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    """The order statistics of every parameter's τ. Every rank must call it: a sharded τ
    (DTensor) is gathered whole."""
    # routed experts only: shared experts see every token, a whole tensor says all about them
    stacked = {id(p) for m in model.modules() if isinstance(m, MoE)
               for p in m.experts.parameters()}
    arrays = {}
    for name, param in model.named_parameters():
        tau = optimizer.state.get(param, {}).get("tau")
        if tau is None:
            continue
        if hasattr(tau, "full_tensor"):
            tau = tau.full_tensor()
        slices = [(f"{name}[{e}]", tau[e]) for e in range(tau.shape[0])] \
            if id(param) in stacked else []
        for tensor_name, values in [(name, tau), *slices]:
            for key, value in order_statistics(values).items():
                arrays[f"{tensor_name}::{key}"] = value
    return arrays


def write(run_dir: Path, step: int, eval_interval: int, arrays: dict[str, np.ndarray],
          plan) -> Path:
    """One collection as `step-<step>.npz`, and the metadata updated."""
    directory = Path(run_dir) / "tau_stats"
    directory.mkdir(exist_ok=True)
    path = directory / f"step-{step:08d}.npz"
    temporary = path.with_suffix(".tmp.npz")
    np.savez(temporary, **arrays)
    temporary.replace(path)
    meta_path = directory / "metadata.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        meta = {}
    meta.update({
        "optimizer": plan.opt, "arch": plan.model.arch, "heads": plan.heads,
        "settings": {"kappa": plan.kappa, "delta": plan.delta, "clipsnr": plan.clipsnr,
                     "omega": plan.omega, "weight_decay": plan.weight_decay, "lr": plan.lr},
        "eval_interval": eval_interval,
        "schedule": "evaluations 10, 20, 40, 80, ... (evaluation n at step n * eval_interval)",
        "indices": "I_k = floor(1.1^k) - 1, k = 0 .. ceil(ln n / ln 1.1), unique, clipped",
    })
    collections = [c for c in meta.get("collections", []) if c["step"] != step]
    collections.append({"step": step, "evaluation": step // eval_interval, "file": path.name})
    meta["collections"] = sorted(collections, key=lambda c: c["step"])
    write_atomic(meta_path, json.dumps(meta, indent=1) + "\n")
    return path
