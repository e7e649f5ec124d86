"""The LR to port from AdamW: the ratio of best peak LRs, each DANA optimizer's to AdamW's.

    python studies/lr-port/study.py            # train what is missing, then the report
    python studies/lr-port/study.py run        # only train the small tasks (resumes)
    python studies/lr-port/study.py report     # only rebuild the tables, figure and summary.json

Two sources, read by `report.py`:

* **The language-model studies' records** (`studies/cpu-shakespeare`, `studies/horizon`,
  `studies/moe-tau`): every size, horizon and model where AdamW and a DANA optimizer had their
  LRs swept at the same budget. Best LR = the lowest final validation loss of seed 0 (the seed
  every swept LR has) at the sweep's steps, over the sweep and its widenings; the same rule as
  the studies' own reports. (`studies/bf16-state` ran one LR per optimizer; Study II's 1x horizon
  is the first study's 2-head sweep, the same runs.)
* **Small tasks of other kinds**, trained here in-process on the CPU by `run`: a teacher-student
  regression MLP, an MLP and a small convnet on scikit-learn's 8x8 digits, and a fine-tune (the
  digits MLP pretrained with AdamW, then trained on the digits turned a quarter turn from that
  one checkpoint). Every optimizer is built as docs/porting.md says (`param_groups(model)`;
  ω = 4 and `total_steps=T` for the DANA optimizers; AdamW is `torch.optim.AdamW` with weight
  decay 0.1 on the same groups; every optimizer without weight decay when fine-tuning, as
  docs/porting.md advises), with the `cos_inf` schedule and a T/50 warm-up through
  `apply_schedule`, gradients clipped at norm 1. The peak LR runs over
  powers of 2 (2^-10 ... 2^-6 first); while an optimizer's best sits at an edge, two more
  powers beyond it. Three seeds (initialisation and batch order) at every LR; best LR = the
  lowest mean held-out loss (mean squared error for the regression, cross-entropy for the
  digits) over the seeds.

Each (task, optimizer) is one file `records/<task>-<optimizer>.json`, rewritten after every run:
`run` trains only the runs it does not hold, so it resumes where it stopped. One thread, a few
seconds a run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from functools import cache
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import common  # noqa: E402  (studies/common.py; puts src/ on the path)

from danastar.optim import ADana, DanaStar, apply_schedule, get_schedule, param_groups  # noqa: E402

RECORDS = HERE / "records"

OPTIMIZERS = ("adamw", "adana", "dana-mk4", "dana-star-mk4")
BASELINE = "adamw"
SEEDS = (0, 1, 2)
FIRST_EXPONENTS = tuple(range(-10, -5))  # peak LR = 2**e: 9.8e-4 ... 1.6e-2
EXPONENT_LIMITS = (-20, 0)  # never widened past these
ADAMW_WEIGHT_DECAY = 0.1  # a common AdamW recipe's λ (coupled: the step multiplies by 1 - lr·λ)
OMEGA = 4.0
GRAD_CLIP = 1.0
DATA_SEED = 1234  # the teacher, the digits' train/held-out split: the same for every run


# ---- the tasks ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Data:
    train_x: torch.Tensor
    train_y: torch.Tensor
    heldout_x: torch.Tensor
    heldout_y: torch.Tensor


@dataclasses.dataclass(frozen=True)
class SmallTask:
    name: str
    kind: str  # what the table says it is
    loss_name: str  # the held-out loss, as the table names it
    steps: int
    batch: int
    data: Callable[[], Data]
    model: Callable[[], nn.Module]
    classify: bool
    start: Callable[[], dict] | None = None  # a checkpoint to fine-tune from
    fine_tune: bool = False  # weight decay 0 (docs/porting.md's advice for fine-tuning)


@cache
def teacher_data() -> Data:
    """y = a fixed random two-layer tanh network of x (16 inputs, 4 outputs) plus noise."""
    generator = torch.Generator().manual_seed(DATA_SEED)
    w1 = torch.randn(16, 32, generator=generator) / 4.0
    w2 = torch.randn(32, 4, generator=generator) / math.sqrt(32)
    x = torch.randn(3072, 16, generator=generator)
    y = torch.tanh(x @ w1) @ w2 + 0.05 * torch.randn(3072, 4, generator=generator)
    return Data(x[:2048], y[:2048], x[2048:], y[2048:])


@cache
def digits_data(quarter_turn: bool = False) -> Data:
    """scikit-learn's 1,797 8x8 digits scaled to [0, 1], 1,297 to train and 500 held out;
    `quarter_turn` rotates every image by 90 degrees (the fine-tune's shifted task)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32) / 16.0
    if quarter_turn:
        images = torch.rot90(images, 1, dims=(1, 2))
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(DATA_SEED))
    images, labels = images[order].unsqueeze(1), labels[order]
    return Data(images[:1297], labels[:1297], images[1297:], labels[1297:])


def mlp(inputs: int, width: int, outputs: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(inputs, width), nn.GELU(),
                         nn.Linear(width, width), nn.GELU(), nn.Linear(width, outputs))


def convnet() -> nn.Module:
    """Two 3x3 convolutions (the second with stride 2) and a linear head, for 8x8 images."""
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.GELU(),
                         nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.GELU(),
                         nn.Flatten(), nn.Linear(32 * 4 * 4, 10))


@cache
def pretrained_digits_mlp() -> dict:
    """The fine-tune's starting point: the digits MLP trained by AdamW (seed 0, LR 2^-9)."""
    model, _ = train(TASKS["digits-mlp"], BASELINE, 2.0 ** -9, seed=0)
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


TASKS = {task.name: task for task in (
    SmallTask("teacher-mlp", "MLP, teacher-student regression (16 → 64 → 64 → 4)",
              "held-out MSE", 400, 64, teacher_data, lambda: mlp(16, 64, 4), classify=False),
    SmallTask("digits-mlp", "MLP, 8x8 digits (64 → 128 → 128 → 10)", "held-out cross-entropy",
              400, 64, digits_data, lambda: mlp(64, 128, 10), classify=True),
    SmallTask("digits-cnn", "convnet, 8x8 digits (two 3x3 convolutions)",
              "held-out cross-entropy", 400, 64, digits_data, convnet, classify=True),
    SmallTask("digits-finetune", "fine-tune: the digits MLP on the digits turned 90°",
              "held-out cross-entropy", 200, 64, lambda: digits_data(quarter_turn=True),
              lambda: mlp(64, 128, 10), classify=True, start=pretrained_digits_mlp,
              fine_tune=True),
)}


# ---- one run ------------------------------------------------------------------------------------

def build_optimizer(name: str, model: nn.Module, lr: float, steps: int, fine_tune: bool
                    ) -> torch.optim.Optimizer:
    """The optimizer as docs/porting.md builds it."""
    if name == "adamw":
        decay = 0.0 if fine_tune else ADAMW_WEIGHT_DECAY
        optimizer = torch.optim.AdamW(param_groups(model, weight_decay=decay), lr=lr)
    else:
        # fine-tuning: no decay (docs/porting.md); otherwise the paper's log-time decay
        decay = {"weight_decay": 0.0} if fine_tune else {"omega": OMEGA, "total_steps": steps}
        cls, clipsnr = {"adana": (ADana, None), "dana-mk4": (ADana, 2.0),
                        "dana-star-mk4": (DanaStar, 2.0)}[name]
        optimizer = cls(param_groups(model), lr=lr, clipsnr=clipsnr, **decay)
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])  # what a torch LR scheduler would record
    return optimizer


def loss_of(task: SmallTask, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, target) if task.classify else F.mse_loss(output, target)


def train(task: SmallTask, optimizer_name: str, lr: float, seed: int
          ) -> tuple[nn.Module, dict]:
    """One run: the model and its record (held-out loss, accuracy, last training loss)."""
    data = task.data()
    torch.manual_seed(seed)
    model = task.model()
    if task.start is not None:
        model.load_state_dict(task.start())
    optimizer = build_optimizer(optimizer_name, model, lr, task.steps, task.fine_tune)
    schedule = get_schedule("cos_inf", warmup_steps=max(1, task.steps // 50),
                            total_steps=task.steps)
    batches = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    for step in range(task.steps):
        apply_schedule(optimizer, schedule(step))
        index = torch.randint(0, len(data.train_y), (task.batch,), generator=batches)
        loss = loss_of(task, model(data.train_x[index]), data.train_y[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
    with torch.no_grad():
        output = model(data.heldout_x)
        heldout = float(loss_of(task, output, data.heldout_y))
        accuracy = float((output.argmax(1) == data.heldout_y).float().mean()) \
            if task.classify else None
    return model, {"lr": lr, "seed": seed,
                   "heldout_loss": heldout if math.isfinite(heldout) else None,
                   "heldout_accuracy": accuracy, "train_loss": finite(loss.item()),
                   "seconds": round(time.perf_counter() - started, 2)}


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


# ---- the records and the grid -------------------------------------------------------------------

def record_path(task: str, optimizer: str) -> Path:
    return RECORDS / f"{task}-{optimizer}.json"


def read_record(task: str, optimizer: str) -> dict:
    path = record_path(task, optimizer)
    if path.is_file():
        return json.loads(path.read_text())
    spec = TASKS[task]
    return {"task": task, "optimizer": optimizer, "steps": spec.steps, "batch": spec.batch,
            "seeds": list(SEEDS), "runs": []}


def write_record(record: dict) -> None:
    path = record_path(record["task"], record["optimizer"])
    path.parent.mkdir(parents=True, exist_ok=True)
    record["runs"].sort(key=lambda run: (run["lr"], run["seed"]))
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(temporary, path)


def mean_losses(runs: list[dict]) -> dict[float, float]:
    """LR -> mean held-out loss over the seeds, for the LRs that have every seed (a diverged
    run counts as an infinite loss)."""
    by_lr: dict[float, list[float]] = {}
    for run in runs:
        loss = run["heldout_loss"]
        by_lr.setdefault(run["lr"], []).append(math.inf if loss is None else loss)
    return {lr: sum(losses) / len(losses) for lr, losses in by_lr.items()
            if len(losses) == len(SEEDS)}


def exponents_to_run(runs: list[dict]) -> list[int]:
    """The first grid, then while the best (of the LRs with every seed) sits at an edge, the
    next two powers of 2 beyond it (within EXPONENT_LIMITS)."""
    done = {round(math.log2(lr)) for lr in mean_losses(runs)}
    wanted = [e for e in FIRST_EXPONENTS if e not in done]
    if wanted:
        return wanted
    losses = {round(math.log2(lr)): loss for lr, loss in mean_losses(runs).items()}
    best = min(losses, key=losses.get)
    if min(losses) < best < max(losses):
        return []
    step = -1 if best == min(losses) else 1
    return [e for e in (best + step, best + 2 * step)
            if EXPONENT_LIMITS[0] <= e <= EXPONENT_LIMITS[1] and e not in losses]


def run_all() -> None:
    torch.set_num_threads(1)
    for task in TASKS:
        for optimizer in OPTIMIZERS:
            record = read_record(task, optimizer)
            while exponents := exponents_to_run(record["runs"]):
                for exponent in exponents:
                    have = {run["seed"] for run in record["runs"] if run["lr"] == 2.0 ** exponent}
                    for seed in SEEDS:
                        if seed in have:
                            continue
                        _, run = train(TASKS[task], optimizer, 2.0 ** exponent, seed)
                        record["runs"].append(run)
                        write_record(record)
                        print(f"{task:<16} {optimizer:<14} lr 2^{exponent:<3} seed {seed}: "
                              f"held-out {common.fmt(run['heldout_loss'])} "
                              f"({run['seconds']:.1f} s)", flush=True)
    print("study: every small task's sweep is complete.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("what", nargs="?", choices=("all", "run", "report"), default="all")
    what = parser.parse_args().what
    if what in ("all", "run"):
        run_all()
    if what in ("all", "report"):
        import report

        report.report()


if __name__ == "__main__":
    main()
