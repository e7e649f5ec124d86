"""Run directories written from synthetic numbers, in the format `danastar train` writes them
(plan.json with the real plan, config.yaml, metrics.jsonl), for the analysis tests and the
synthetic figures of docs/analysis.md.

Loss model: L(C) = 2 + b·C^(−0.3) + ζ·ln²(lr / lr*(P)), with b smaller for a better optimizer
and lr*(P) the scaling table's law."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import yaml

from danastar import scaling
from danastar.analysis import compute

QUALITY = {"adamw": 1.0, "dana-star-mk4": 0.9, "adana": 0.95}  # b: lower is better
SENSITIVITY = {"adamw": 0.08, "dana-star-mk4": 0.04, "adana": 0.05}  # ζ


def synthetic_loss(opt: str, lr_ratio: float, pfh: float) -> float:
    return (2.0 + 0.3 * QUALITY.get(opt, 1.0) * pfh ** -0.1
            + SENSITIVITY.get(opt, 0.06) * math.log(lr_ratio) ** 2)


def write_run(root: Path, opt: str, heads: int, *, lr_ratio: float = 1.0, seed: int = 0,
              iterations: int | None = None, evals: int = 5, stop_at: int | None = None,
              noise: float = 0.0, optimum_spread: float = 0.0, dataset: str | None = None,
              fingerprint: str | None = None, kappa: float | None = None) -> Path:
    """One run directory under ``root``; ``stop_at`` leaves it partial at that step;
    ``optimum_spread`` moves this size's optimum off the law by a log-normal factor (the same
    for every LR and seed of the size); ``dataset`` (and ``fingerprint``) are recorded as
    `train` records them (config.yaml, run.json's identity)."""
    overrides = {} if iterations is None else {"iterations": iterations}
    if kappa is not None:
        overrides["kappa"] = kappa
    plan = scaling.make_plan("enoki", opt, heads, batch_size=32, seq_len=2048,
                             **overrides).to_dict()
    iterations = plan["iterations"]  # Chinchilla unless given
    plan["lr"] = plan["lr"] * lr_ratio
    layout = {"world_size": 1, "global_batch": 32, "acc_steps": 1, "sequence_length": 2048,
              "tokens_per_step": plan["tokens_per_step"]}
    run_dir = root / f"{opt}_h{heads}_lr{plan['lr']:.3e}_s{seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(json.dumps({"plan": plan, "batch_layout": layout}))
    config = {"model": {"arch": "enoki", "heads": heads}, "optim": {"name": opt, "omega": 4.0},
              "train": {"iterations": iterations, "seed": seed}}
    if dataset is not None:
        config["data"] = {"dataset": dataset}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    if fingerprint is not None:
        identity = {"opt": opt, "lr": plan["lr"], "seed": seed, "dataset": dataset,
                    "dataset_fingerprint": fingerprint}
        (run_dir / "run.json").write_text(json.dumps({"identity": identity, "starts": []}))
    rng = np.random.default_rng(seed + 1000 * heads)
    lr_ratio = lr_ratio / math.exp(np.random.default_rng(heads).normal(0, optimum_spread))
    # compute in PFH scaled up so that the sizes span the range of the paper's figure
    scale = 1e6
    lines = []
    last = iterations if stop_at is None else stop_at
    for step in np.linspace(0, iterations, evals + 1).astype(int):
        if step > last:
            break
        tokens = int(step) * plan["tokens_per_step"]
        pfh = compute.pfh(compute.flops(plan["non_embedding_params"], tokens)) * scale
        loss = (10.0 if step == 0 else synthetic_loss(opt, lr_ratio, pfh)) + rng.normal(0, noise)
        lines.append({"step": int(step), "train_loss": loss + 0.01, "tokens": tokens,
                      "tokens_per_s": 1000.0})
        lines.append({"step": int(step), "val_loss": loss, "tokens": tokens})
    if stop_at is None:
        lines.append({**lines[-1], "final": True})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run_dir
