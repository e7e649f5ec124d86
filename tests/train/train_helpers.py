"""Helpers for the training tests: running `danastar train` as real processes (single, `--nproc`,
or torchrun)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

# A tiny model on the in-memory synthetic source: milliseconds per step, no corpus needed. The LR
# keeps its loss falling smoothly, so that comparisons across layouts measure rounding, not chaos.
TINY = [
    "--dataset",
    "synthetic",
    "--heads",
    "2",
    "--lr",
    "3e-3",
    "--batch_size",
    "4",
    "--acc_steps",
    "2",
    "--sequence_length",
    "32",
    "--log_interval",
    "1",
    "--eval_interval",
    "5",
    "--no_wandb",
    "train.eval_batches=2",
    "train.final_eval_batches=2",
    "train.sample_tokens=0",
    "logging.progress=false",
]
STOPPED_RUN = ("--iterations", "12", "checkpoint.latest_every=2")  # see conftest.stopped_run
COMPARED = ("train_loss", "loss", "grad_norm", "lr", "val_loss")  # everything but timings


def environment() -> dict:
    # One thread per process: the machine is small, and results must not depend on thread counts.
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def command(args, run_dir, torchrun=0):
    base = [sys.executable, "-m", "danastar", "train"]
    if torchrun:
        base = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={torchrun}",
            "-m",
            "danastar",
            "train",
        ]
    return base + [*TINY, *args, "--run_dir", str(run_dir)]


def run_train(args, run_dir, torchrun=0, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(args, run_dir, torchrun),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_train(args, run_dir, torchrun=0) -> subprocess.Popen:
    # Its own session, so that the whole process tree (torchrun and workers) can be signalled,
    # with Ctrl-C live as in a terminal: a shell's background job (`pytest ... &`) inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt until training sets its own handler.
    return subprocess.Popen(
        command(args, run_dir, torchrun),
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def metrics(run_dir) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if path.exists()
        else []
    )


def compared(run_dir) -> list[tuple]:
    """(step, key, value) of every logged loss-like number, in order."""
    return [(m["step"], key, m[key]) for m in metrics(run_dir) for key in COMPARED if key in m]


def last_step(run_dir) -> int:
    return max((m["step"] for m in metrics(run_dir) if "train_loss" in m), default=0)


def wait_for_step(process, run_dir, step, timeout=120) -> None:
    """Poll metrics.jsonl until `step` is logged (the process must still be running)."""
    deadline = time.monotonic() + timeout
    while last_step(run_dir) < step:
        assert process.poll() is None, f"the run ended before step {step}:\n{process.stdout.read()}"
        assert time.monotonic() < deadline, f"step {step} was not reached in {timeout} s"
        time.sleep(0.01)


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


def assert_stopped_with_work_left(result: subprocess.CompletedProcess) -> None:
    """A segment that saved a checkpoint and stopped before the end (`--iterations_to_run`)."""
    assert result.returncode == 75, result.stdout[-3000:] + result.stderr[-6000:]


def prepare_words(root, name, seed):
    """A small prepared dataset (bytes tokenizer) of random words."""
    texts = root / f"{name}-text"
    texts.mkdir()
    words = "the of and to in is was that for on with as by at from his her it be are".split()
    rng = random.Random(seed)
    for index in range(12):
        (texts / f"doc{index}.txt").write_text(" ".join(rng.choice(words) for _ in range(2000)))
    out = root / name
    result = subprocess.run(
        [sys.executable, "-m", "danastar", "prepare", str(texts), "--out", str(out),
         "--tokenizer", "bytes", "--workers", "1", "--no_progress", "--val_fraction", "0.2"],
        env=environment(), capture_output=True, text=True, timeout=120)
    assert_ok(result)
    return out
