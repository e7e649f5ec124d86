"""The CPU study: ADana and its family against tuned AdamW on the embedded Shakespeare corpus.

    python studies/cpu-shakespeare/study.py            # train what is missing, then the report
    python studies/cpu-shakespeare/study.py run        # only train (resumes: run it again)
    python studies/cpu-shakespeare/study.py report     # only rebuild tables and figures

`run` trains, size by size, with `danastar sweep`:

1. the LR sweep of `sweeps/lr-h<H>.yaml` (every optimizer at 5 LRs spaced x2 around its scaling
   law's LR);
2. where an optimizer's best LR is at an edge of what was swept, two more LRs beyond that edge
   (`sweeps/generated/widen-h<H>-<OPT>.yaml`), until the best is inside;
3. at each optimizer's best LR: seeds 1 and 2, and the shorter budgets (1/4 and 1/2 of the
   size's steps; AdamW also twice the steps where that stays within about an epoch, and every
   AdamW budget with the three seeds, so that its loss-against-compute curve can be inverted seed
   by seed) (`sweeps/generated/final-h<H>-<OPT>.yaml`).

Each run's small records (plan, config, metrics, run and status files; no checkpoints) are copied
into `records/`, which `report` (and `danastar results` / `danastar plot`) read. Everything is
resumable: a sweep skips complete runs and resumes interrupted ones.
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
SIZES = (2, 3, 4)
OPTIMIZERS = ("adamw", "adamw-decaying-wd", "adana", "dana-mk4", "dana-star-mk4")
BASELINE = "adamw"
SEEDS = (0, 1, 2)
EPOCH_STEPS = 462  # 1,892,697 training tokens / (32 x 128) tokens per step
MAX_WIDENINGS = 3
LR_MULTIPLIERS = (0.25, 0.5, 1, 2, 4)  # the sweep files' grid


def sweep_file(heads: int) -> Path:
    return SWEEPS / f"lr-h{heads}.yaml"


def base_of(heads: int) -> dict:
    return yaml.safe_load(sweep_file(heads).read_text())["base"]


def run_sweep(path: Path, runs: Path, parallel: int) -> None:
    common.run_sweep(path, yaml.safe_load(path.read_text())["name"], runs, parallel, RECORDS)


def final_losses(heads: int, optimizer: str, seed: int = 0) -> dict[float, float]:
    """lr multiplier -> final validation loss of the complete full-budget runs at one seed."""
    from danastar.analysis.records import find_runs

    full = base_of(heads)["train.iterations"]
    losses = {}
    for run in find_runs([RECORDS]):
        multiplier = lr_multiplier(run.path)
        if (run.heads == heads and run.optimizer == optimizer and run.seed == seed
                and run.iterations == full and run.complete and multiplier is not None):
            losses[float(multiplier)] = run.final_loss
    return losses


def lr_multiplier(run_dir: Path) -> float | None:
    """The sweep point's LR multiplier (sweep_point.json; the plan holds only the LR)."""
    point = run_dir / "sweep_point.json"
    if not point.is_file():
        return None
    return json.loads(point.read_text()).get("lr_multiplier")


def best_multiplier(heads: int, optimizer: str) -> float:
    losses = final_losses(heads, optimizer)
    return min(losses, key=losses.get)


def write_sweep(path: Path, name: str, heads: int, grid: dict, comment: str) -> Path:
    return common.write_sweep(path, name, base_of(heads), grid, comment)


def widen(heads: int, optimizer: str, runs: Path, parallel: int) -> None:
    """Add LRs beyond an edge while the best of this optimizer's sweep sits on it: two more
    at a time (x2 and x4 past the edge), so that two runs can train side by side."""
    for _ in range(MAX_WIDENINGS):
        losses = final_losses(heads, optimizer)
        beyond = common.beyond_edge(losses)
        if beyond is None:
            return
        swept = sorted(set(losses) | set(beyond))
        path = write_sweep(GENERATED / f"widen-h{heads}-{optimizer}.yaml",
                           f"study-widen-h{heads}-{optimizer}", heads,
                           {"optim.name": [optimizer],
                            "lr_multiplier": [m for m in swept if m not in LR_MULTIPLIERS],
                            "train.seed": [0]},
                           f"LRs beyond the edge of {optimizer}'s sweep at {heads} heads.")
        run_sweep(path, runs, parallel)
    print(f"study: {optimizer} at {heads} heads still has its best LR at an edge after "
          f"{MAX_WIDENINGS} widenings.", file=sys.stderr)


def budgets(heads: int, optimizer: str) -> list[int]:
    full = base_of(heads)["train.iterations"]
    steps = [full // 4, full // 2, full]
    if optimizer == BASELINE and 2 * full <= 1.15 * EPOCH_STEPS:
        steps.append(2 * full)
    return steps


def final_runs(heads: int, optimizer: str, runs: Path, parallel: int) -> None:
    """Seeds and budgets at the best LR."""
    multiplier = best_multiplier(heads, optimizer)
    full = base_of(heads)["train.iterations"]
    name = f"study-final-h{heads}-{optimizer}"
    comment = (f"{optimizer} at {heads} heads, at its best LR ({multiplier:g} x the law's): "
               "seeds and budgets.")
    if optimizer == BASELINE:
        # every budget with seeds 1 and 2; with seed 0 all but the sweep's own run
        seeds = write_sweep(GENERATED / f"final-h{heads}-{optimizer}.yaml", name, heads,
                            {"optim.name": [optimizer], "lr_multiplier": [multiplier],
                             "train.iterations": budgets(heads, optimizer),
                             "train.seed": list(SEEDS[1:])}, comment)
        seed0 = write_sweep(GENERATED / f"final-h{heads}-{optimizer}-seed0.yaml",
                            name + "-seed0", heads,
                            {"optim.name": [optimizer], "lr_multiplier": [multiplier],
                             "train.iterations": [s for s in budgets(heads, optimizer)
                                                  if s != full],
                             "train.seed": [0]}, comment)
        run_sweep(seeds, runs, parallel)
        run_sweep(seed0, runs, parallel)
        return
    seeds = write_sweep(GENERATED / f"final-h{heads}-{optimizer}-seeds.yaml", name + "-seeds",
                        heads, {"optim.name": [optimizer], "lr_multiplier": [multiplier],
                                "train.iterations": [full], "train.seed": list(SEEDS[1:])},
                        comment)
    shorter = write_sweep(GENERATED / f"final-h{heads}-{optimizer}-budgets.yaml",
                          name + "-budgets", heads,
                          {"optim.name": [optimizer], "lr_multiplier": [multiplier],
                           "train.iterations": budgets(heads, optimizer)[:2], "train.seed": [0]},
                          comment)
    run_sweep(seeds, runs, parallel)
    run_sweep(shorter, runs, parallel)


def run(args: argparse.Namespace) -> None:
    for heads in args.sizes:
        run_sweep(sweep_file(heads), args.runs, args.parallel)
        for optimizer in OPTIMIZERS:
            widen(heads, optimizer, args.runs, args.parallel)
        for optimizer in OPTIMIZERS:
            final_runs(heads, optimizer, args.runs, args.parallel)


def main() -> None:
    parser = common.driver_parser(__doc__.split("\n\n")[0], ("all", "run", "report"),
                                  "runs at a time (default 2, one thread each)")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    args = parser.parse_args()
    # Two one-thread runs side by side train about 15% more tokens per second on two cores than
    # one two-thread run; set OMP_NUM_THREADS yourself to override.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.parallel)))
    if args.what in ("all", "run"):
        run(args)
    if args.what in ("all", "report"):
        from report import report  # noqa: PLC0415 (beside this file)

        report()


if __name__ == "__main__":
    main()
