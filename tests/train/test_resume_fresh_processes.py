"""Bitwise resume whatever the process history: one stopped run resumed in many fresh processes,
each with two intra-op threads, on the default model (its 2048 × 4096 logits per step).

A failure that hits one resume in three is missed by six independent resumes with probability
(2/3)^6 < 9%; they run two at a time so that the threads compete as on a busy machine.
"""

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

ITERATIONS, STOP_AT, RESUMES = 8, 4, 6
ARGS = ["--iterations", str(ITERATIONS), "--log_interval", "1", "--eval_interval", "1000",
        "train.final_eval_batches=2", "train.sample_tokens=0", "logging.progress=false",
        "--no_wandb", f"checkpoint.latest_every={STOP_AT}"]
COMPARED = ("train_loss", "loss", "grad_norm", "val_loss")


def train(run_dir, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "danastar", "train", *ARGS, *extra,
                           "--run_dir", str(run_dir)],
                          env=env, capture_output=True, text=True, timeout=600)


def logged_after(run_dir, step):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], *(r.get(key) for key in COMPARED)) for r in records if r["step"] > step]


@pytest.mark.slow
def test_resumes_in_fresh_two_thread_processes_are_bitwise_identical(tmp_path):
    full, stopped = tmp_path / "full", tmp_path / "stopped"
    for result in (train(full), train(stopped, "--iterations_to_run", str(STOP_AT))):
        assert result.returncode in (0, 75), result.stderr[-2000:]
    expected = logged_after(full, STOP_AT)
    assert [row[0] for row in expected if row[1] is not None] == list(range(STOP_AT + 1,
                                                                          ITERATIONS + 1))
    copies = [tmp_path / f"resume{i}" for i in range(RESUMES)]
    for copy in copies:
        shutil.copytree(stopped, copy)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(train, copies))
    for copy, result in zip(copies, results):
        assert result.returncode == 0, result.stderr[-2000:]
        assert f"at step {STOP_AT}" in (copy / "logs" / "rank0.log").read_text()
    differing = [copy.name for copy in copies if logged_after(copy, STOP_AT) != expected]
    assert not differing, f"{len(differing)} of {RESUMES} resumes differ: {differing}"
