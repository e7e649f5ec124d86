"""The τ study: Dana-Star-MK4 against Dana-MK4 and AdamW on a mixture of experts routed sparsely.

    python studies/moe-tau/study.py            # train what is missing, then the report
    python studies/moe-tau/study.py run        # only train (resumes: run it again)
    python studies/moe-tau/study.py sweeps     # only the LR sweeps (and their widenings)
    python studies/moe-tau/study.py report     # only rebuild the tables and figures

Dana-Star's τ estimates, coordinate by coordinate, how often a gradient arrives; an expert's
weights get one only in the steps where some token is routed to it. `run` trains with
`danastar sweep`:

1. the LR sweeps of `sweeps/lr.yaml` (the sparse mixture: 64 experts, 2 per token, 512 tokens per
   step, no load-balancing loss) and `sweeps/lr-dense.yaml` (its dense counterpart: 2 experts, both
   always used, the same active parameters), every optimizer at 4 LRs spaced x2 around its scaling
   law's LR; where the best sits at an edge, two more LRs beyond it
   (`sweeps/generated/widen-*.yaml`);
2. at each optimizer's best LR on the mixture, seeds 0, 1 and 2 with the per-expert statistics and
   (Dana-Star-MK4) the τ statistics; on the dense model, seeds 1 and 2 beside the sweep's seed 0
   (`sweeps/generated/final-*.yaml`).

Each run's small records (plan, config, metrics with the per-expert statistics, run and status
files, τ statistics; no checkpoints) are copied into `records/`, which `report` reads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import common  # noqa: E402  (studies/common.py)

SWEEPS = HERE / "sweeps"
GENERATED = SWEEPS / "generated"
RECORDS = HERE / "records"
OPTIMIZERS = ("adamw", "dana-mk4", "dana-star-mk4")
MODELS = {"moe": SWEEPS / "lr.yaml", "dense": SWEEPS / "lr-dense.yaml"}
SEEDS = (0, 1, 2)
MAX_WIDENINGS = 2


def spec(model: str) -> dict:
    return yaml.safe_load(MODELS[model].read_text())


def run_sweep(path: Path, runs: Path, parallel: int) -> None:
    """`danastar sweep` one file, then copy its records (with the τ statistics)."""
    common.run_sweep(path, yaml.safe_load(path.read_text())["name"], runs, parallel, RECORDS,
                     folders=("tau_stats",))


def sweep_losses(model: str, optimizer: str) -> dict[float, float]:
    """LR multiplier -> final validation loss of the complete seed-0 runs of this model's LR
    sweep (and its widenings)."""
    losses = {}
    for status in RECORDS.glob(f"tau-*-{model}*/{optimizer}-lrx*-s0/status.json"):
        run_dir = status.parent
        if json.loads(status.read_text()).get("state") != "complete":
            continue
        if not run_dir.parent.name.startswith((f"tau-lr-{model}", f"tau-widen-{model}")):
            continue
        point = json.loads((run_dir / "sweep_point.json").read_text())
        finals = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()
                  if '"final"' in line]
        losses[float(point["lr_multiplier"])] = finals[-1]["val_loss"]
    return losses


def best_multiplier(model: str, optimizer: str) -> float:
    losses = sweep_losses(model, optimizer)
    return min(losses, key=losses.get)


def write_sweep(model: str, name: str, grid: dict, comment: str) -> Path:
    path = GENERATED / f"{name.removeprefix('tau-')}.yaml"
    return common.write_sweep(path, name, spec(model)["base"], grid, comment)


def widen(model: str, optimizer: str, runs: Path, parallel: int) -> None:
    """Two more LRs beyond an edge (x2 and x4 past it) while the best sits on it."""
    swept_grid = spec(model)["grid"]["lr_multiplier"]
    for _ in range(MAX_WIDENINGS):
        losses = sweep_losses(model, optimizer)
        beyond = common.beyond_edge(losses)
        if beyond is None:
            return
        extra = sorted(set(losses) | set(beyond))
        path = write_sweep(model, f"tau-widen-{model}-{optimizer}",
                           {"optim.name": [optimizer],
                            "lr_multiplier": [m for m in extra if m not in swept_grid],
                            "train.seed": [0]},
                           f"LRs beyond the edge of {optimizer}'s sweep ({model}).")
        run_sweep(path, runs, parallel)
    print(f"study: {optimizer} ({model}) still has its best LR at an edge after "
          f"{MAX_WIDENINGS} widenings.", file=sys.stderr)


def final_runs(model: str, optimizer: str, runs: Path, parallel: int) -> None:
    multiplier = best_multiplier(model, optimizer)
    grid = {"optim.name": [optimizer], "lr_multiplier": [multiplier]}
    if model == "moe":
        grid["train.seed"] = list(SEEDS)
        if optimizer.startswith("dana-star"):
            grid["train.collect_tau_stats"] = [True]
    else:
        grid["train.seed"] = list(SEEDS[1:])
    path = write_sweep(model, f"tau-final-{model}-{optimizer}", grid,
                       f"{optimizer} ({model}) at its best LR ({multiplier:g} x the law's): "
                       "seeds.")
    run_sweep(path, runs, parallel)


def run(args: argparse.Namespace) -> None:
    for model in args.models:
        run_sweep(MODELS[model], args.runs, args.parallel)
        for optimizer in OPTIMIZERS:
            widen(model, optimizer, args.runs, args.parallel)
    if args.what == "sweeps":
        return
    for model in args.models:
        for optimizer in OPTIMIZERS:
            final_runs(model, optimizer, args.runs, args.parallel)


def main() -> None:
    parser = common.driver_parser(__doc__.split("\n\n")[0], ("all", "run", "sweeps", "report"),
                                  "runs at a time (default 2, one thread each)")
    parser.add_argument("--models", nargs="+", choices=tuple(MODELS), default=list(MODELS))
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.parallel)))
    if args.what in ("all", "run", "sweeps"):
        run(args)
    if args.what in ("all", "report"):
        from report import report  # noqa: PLC0415 (beside this file)

        report()


if __name__ == "__main__":
    main()
