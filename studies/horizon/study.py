"""Study II: does the DANA family's gap to tuned AdamW close with the horizon?

    python studies/horizon/study.py            # train what is missing, then the report
    python studies/horizon/study.py run        # only train (resumes: run it again)
    python studies/horizon/study.py report     # only rebuild tables, figures and summary.json
    python studies/horizon/study.py status     # what is done, running-ready and waiting

Two parts, both on the embedded Shakespeare corpus with the first study's tokenizer and batch
(32 x 128 tokens), every run with `danastar sweep`:

* **The horizon** at 2 heads: 1x, 4x and 16x the first study's budget (128, 512 and 2048 steps:
  0.42, 1.7 and 6.7 tokens per parameter; 16x is about 4.4 epochs of the corpus). The LR is
  re-tuned at each horizon for every optimizer: at 1x the first study's 5 LRs (1/4 ... 4 x the
  scaling law's), at 4x and 16x the previous horizon's best LR x 1/2, 1, 2; while the best sits
  at an edge, two more LRs beyond it (x2 and x4 past the edge, at most 3 times). At each best
  LR: seeds 1 and 2; AdamW also at 1/4 and 1/2 of the steps with all three seeds (its loss
  against compute at that horizon, for the within-size multiplier) and at twice the steps when
  another optimizer's three-seed mean beats its own at the horizon.
* **The ablations** at 3 and 4 heads at the first study's budget and best LRs, 3 seeds each:
  clipsnr 0.25 (against 2.0) for the MK4 variants; warm-up T/10 (against T/50), z-loss 0
  (against 1e-4) and no bf16 autocast for AdamW, ADana and Dana-Star-MK4. The unchanged runs are
  the first study's (`studies/cpu-shakespeare/records/`).

`run` is a small scheduler: from the records alone it works out which sweeps can run now (a
horizon's LRs need the previous horizon's best, seeds need the best, ...), writes their files
under `sweeps/generated/`, and runs two at a time (one thread each) until nothing is left.
Every minute, and when a sweep ends, the complete runs' small records (plan, config, metrics,
run, status and sweep-point files; no checkpoints) are copied into `records/`. A later `run`,
on this machine or on a fresh clone, first puts the recorded runs back into the runs folder, so
that `danastar sweep` skips them, and trains only what is missing.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import common  # noqa: E402  (studies/common.py)

ROOT = common.ROOT
SWEEPS = HERE / "sweeps" / "generated"
RECORDS = HERE / "records"
FIRST_STUDY = ROOT / "studies" / "cpu-shakespeare"

HEADS = 2
HORIZONS = {1: 128, 4: 512, 16: 2048}  # x the first study's budget at 2 heads -> steps
EVAL_INTERVAL = {1: 16, 4: 32, 16: 64}  # 8, 16 and 32 evaluations along the run
REQUIRED = ("adamw", "adana", "dana-star-mk4")
EXTRA = ("dana-mk4",)  # trained when the required work leaves a slot free
BASELINE = "adamw"
FIRST_GRID = (0.25, 0.5, 1, 2, 4)  # the first study's LRs (x the law's)
STEP_GRID = (0.5, 1, 2)  # x the previous horizon's best
MAX_WIDENINGS = 3
SEEDS = (0, 1, 2)

ABLATION_HEADS = (3, 4)
ABLATIONS = {  # name -> (what changes, the optimizers it applies to)
    "clipsnr0.25": ({"optim.clipsnr": 0.25}, ("dana-mk4", "dana-star-mk4")),
    "warmup-T10": ({"optim.warmup_steps": "T/10"}, REQUIRED),
    "zloss0": ({"model.z_loss": 0.0}, REQUIRED),
    "autocast-off": ({"train.autocast": "off"}, REQUIRED),
}


Task = common.Task
final_loss = common.final_loss


def recorded(task_name: str) -> dict[str, Path]:
    """point name -> record folder, for the complete runs of one sweep."""
    return SCHEDULER.recorded(task_name)


def is_done(task: Task) -> bool:
    return SCHEDULER.is_done(task)


def point_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "sweep_point.json").read_text())


def seed_of(run_dir: Path) -> int:
    return int(json.loads((run_dir / "plan.json").read_text())["plan"]["seed"])


def horizon_runs(horizon: int, optimizer: str) -> list[Path]:
    prefix = f"x{horizon}-{optimizer}-"
    if not RECORDS.is_dir():
        return []
    return [run for sweep in sorted(RECORDS.iterdir()) if sweep.name.startswith(prefix)
            for run in recorded(sweep.name).values()]


def sweep_losses(horizon: int, optimizer: str) -> dict[float, float]:
    """LR multiplier -> final loss of the seed-0 runs at the horizon's steps (the LR sweep)."""
    steps = HORIZONS[horizon]
    losses = {}
    for run in horizon_runs(horizon, optimizer):
        plan = json.loads((run / "plan.json").read_text())["plan"]
        if plan["seed"] == 0 and plan["iterations"] == steps:
            losses[float(point_of(run)["lr_multiplier"])] = final_loss(run)
    return losses


def seed_losses(horizon: int, optimizer: str, multiplier: float) -> dict[int, float]:
    steps = HORIZONS[horizon]
    losses = {}
    for run in horizon_runs(horizon, optimizer):
        plan = json.loads((run / "plan.json").read_text())["plan"]
        if (plan["iterations"] == steps
                and abs(float(point_of(run)["lr_multiplier"]) - multiplier) < 1e-9 * multiplier):
            losses[plan["seed"]] = final_loss(run)
    return losses


# ---- the plan: which sweeps exist now ---------------------------------------------------------

def horizon_base(horizon: int) -> dict:
    return {"preset": "cpu_shakespeare", "model.heads": HEADS, "train.batch_size": 32,
            "train.iterations": HORIZONS[horizon], "train.eval_interval": EVAL_INTERVAL[horizon],
            "train.final_eval_batches": None, "train.sample_tokens": 0, "train.autocast": "bf16"}


def rounded(value: float) -> float | int:
    """0.25 * 0.5 stays 0.125, not a float's tail; a whole multiplier is written as the first
    study wrote it (`lrx2`, not `lrx2.0`)."""
    value = float(f"{value:.6g}")
    return int(value) if value.is_integer() else value


@dataclasses.dataclass
class Best:
    multiplier: float | None  # None: the LR sweep is not complete yet
    settled: bool  # inside the swept LRs, or widened as far as the study goes


def horizon_tasks(optimizer: str, rank: int) -> tuple[list[Task], dict[int, Best]]:
    """Every sweep of one optimizer's horizon chain that can be written now, and its best LRs."""
    tasks, bests = [], {}
    centre = None
    for horizon in HORIZONS:
        if horizon != 1 and centre is None:
            break
        grid = (FIRST_GRID if horizon == 1
                else tuple(rounded(centre * m) for m in STEP_GRID))
        steps = HORIZONS[horizon]
        base = horizon_base(horizon)
        label = f"{optimizer} at {horizon}x the first study's budget ({steps} steps)"
        lr_task = Task(f"x{horizon}-{optimizer}-lr", base,
                       {"optim.name": [optimizer], "lr_multiplier": list(grid),
                        "train.seed": [0]},
                       (0, -horizon, rank, 0), f"{label}: the LR sweep.")
        tasks.append(lr_task)
        best = settle(horizon, optimizer, lr_task, tasks, rank)
        bests[horizon] = best
        if not best.settled:
            break
        centre = best.multiplier
        tasks.append(Task(f"x{horizon}-{optimizer}-seeds", base,
                          {"optim.name": [optimizer], "lr_multiplier": [best.multiplier],
                           "train.seed": list(SEEDS[1:])},
                          (1, -horizon, rank, 0),
                          f"{label}, at its best LR ({best.multiplier:g} x the law's): seeds."))
        if optimizer == BASELINE:
            tasks.append(Task(f"x{horizon}-{optimizer}-budgets", base,
                              {"optim.name": [optimizer], "lr_multiplier": [best.multiplier],
                               "train.iterations": [steps // 4, steps // 2],
                               "train.seed": list(SEEDS)},
                              (2, -horizon, rank, 0),
                              f"{label}, at its best LR: 1/4 and 1/2 of the steps."))
    return tasks, bests


def settle(horizon: int, optimizer: str, lr_task: Task, tasks: list[Task], rank: int) -> Best:
    """The best LR of a horizon's sweep, adding widenings (to `tasks`) while it is at an edge."""
    if not is_done(lr_task):
        return Best(None, False)
    for widening in range(1, MAX_WIDENINGS + 1):
        losses = sweep_losses(horizon, optimizer)
        beyond = common.beyond_edge(losses)
        if beyond is None:
            return Best(min(losses, key=losses.get), True)
        task = Task(f"x{horizon}-{optimizer}-widen{widening}", lr_task.base,
                    {"optim.name": [optimizer],
                     "lr_multiplier": [rounded(m) for m in beyond],
                     "train.seed": [0]},
                    (0, -horizon, rank, widening),
                    f"{optimizer} at {horizon}x: LRs beyond the edge of its sweep.")
        tasks.append(task)
        if not is_done(task):
            return Best(None, False)
    losses = sweep_losses(horizon, optimizer)
    best = min(losses, key=losses.get)
    print(f"study: {optimizer} at {horizon}x still has its best LR at an edge after "
          f"{MAX_WIDENINGS} widenings; taking {best:g}.", file=sys.stderr)
    return Best(best, True)


def longer_baseline(bests: dict[str, dict[int, Best]]) -> list[Task]:
    """AdamW at twice a horizon's steps where another optimizer's three-seed mean at the
    horizon beats AdamW's own (its multiplier is then read inside AdamW's curve, not off its
    extrapolation)."""
    tasks = []
    for horizon, steps in HORIZONS.items():
        own = bests.get(BASELINE, {}).get(horizon)
        if own is None or not own.settled:
            continue
        baseline = seed_losses(horizon, BASELINE, own.multiplier)
        if len(baseline) < len(SEEDS):
            continue
        mean = sum(baseline.values()) / len(baseline)
        beaten = []
        for optimizer, per_horizon in bests.items():
            best = per_horizon.get(horizon)
            if optimizer == BASELINE or best is None or not best.settled:
                continue
            losses = seed_losses(horizon, optimizer, best.multiplier)
            if len(losses) == len(SEEDS) and sum(losses.values()) / len(losses) < mean:
                beaten.append(optimizer)
        if beaten:
            tasks.append(Task(f"x{horizon}-{BASELINE}-longer", horizon_base(horizon),
                              {"optim.name": [BASELINE], "lr_multiplier": [own.multiplier],
                               "train.iterations": [2 * steps], "train.seed": list(SEEDS)},
                              (2, -horizon, 0, 1),
                              f"{BASELINE} at {horizon}x, at its best LR, at twice the steps: "
                              f"{', '.join(beaten)} beat its three-seed mean at {steps} steps."))
    return tasks


def first_study_best(heads: int, optimizer: str) -> tuple[dict, float]:
    """The first study's base configuration at a size and an optimizer's best LR multiplier
    there (its final sweep file, written from its records)."""
    base = yaml.safe_load((FIRST_STUDY / "sweeps" / f"lr-h{heads}.yaml").read_text())["base"]
    name = "" if optimizer == BASELINE else "-seeds"
    final = yaml.safe_load((FIRST_STUDY / "sweeps" / "generated"
                            / f"final-h{heads}-{optimizer}{name}.yaml").read_text())
    return base, float(final["grid"]["lr_multiplier"][0])


def ablation_tasks() -> list[Task]:
    tasks = []
    for heads in ABLATION_HEADS:
        for change, (settings, optimizers) in ABLATIONS.items():
            for optimizer in optimizers:
                base, multiplier = first_study_best(heads, optimizer)
                steps = base["train.iterations"]
                overrides = {key: (steps // 10 if value == "T/10" else value)
                             for key, value in settings.items()}
                tasks.append(Task(f"ab-h{heads}-{optimizer}-{change}", {**base, **overrides},
                                  {"optim.name": [optimizer], "lr_multiplier": [multiplier],
                                   "train.seed": list(SEEDS)},
                                  (3, heads, list(ABLATIONS).index(change),
                                   (*REQUIRED, *EXTRA).index(optimizer)),
                                  f"{optimizer} at {heads} heads at the first study's best LR "
                                  f"({multiplier:g} x the law's), {steps} steps, with "
                                  f"{', '.join(f'{k}={v}' for k, v in overrides.items())}."))
    return tasks


def plan() -> list[Task]:
    """Every sweep the records allow to be written now, done or not, in queue order."""
    tasks, bests = [], {}
    for rank, optimizer in enumerate(REQUIRED):
        found, bests[optimizer] = horizon_tasks(optimizer, rank)
        tasks += found
    tasks += longer_baseline(bests)
    tasks += ablation_tasks()
    for rank, optimizer in enumerate(EXTRA):
        found, bests[optimizer] = horizon_tasks(optimizer, rank)
        tasks += [dataclasses.replace(t, priority=(9, *t.priority)) for t in found]
    names = [t.name for t in tasks]
    tasks += [t for t in longer_baseline(bests) if t.name not in names]
    return sorted(tasks, key=lambda t: t.priority)


SCHEDULER = common.Scheduler(RECORDS, SWEEPS, plan)


def main() -> None:
    def report() -> None:
        from report import report as rebuild  # noqa: PLC0415 (beside this file)

        rebuild()

    common.scheduled_main(__doc__.split("\n\n")[0], SCHEDULER, report)


if __name__ == "__main__":
    main()
