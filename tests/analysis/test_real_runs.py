"""`danastar results` on directories written by `danastar train` itself: one complete run and
one stopped early (the format analysis reads is the one training writes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from danastar.cli import main

TINY = ["--dataset", "synthetic", "--heads", "2", "--batch_size", "4", "--sequence_length", "32",
        "--iterations", "6", "--eval_interval", "3", "train.eval_batches=2",
        "train.sample_tokens=0", "--no_auto_resume"]


@pytest.mark.slow
def test_results_reads_real_runs(tmp_path, capsys):
    # a run stopped by --iterations_to_run exits 75: stopped cleanly, to be resumed
    for name, extra, code in (("done", [], 0), ("stopped", ["--iterations_to_run", "3"], 75)):
        result = subprocess.run(
            [sys.executable, "-m", "danastar", "train", *TINY, *extra,
             "--run_dir", str(tmp_path / name)],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert result.returncode == code, result.stderr[-2000:]
    assert main(["results", str(tmp_path), "--json", "-"]) == 0
    rows = {row["run"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["done"]["state"] == "complete" and rows["done"]["steps"] == "6/6"
    assert rows["done"]["final_loss"] is not None and rows["done"]["optimizer"] == "adana κ=0.85"
    assert rows["stopped"]["state"] == "partial" and rows["stopped"]["final_loss"] is None
    assert rows["done"]["pfh"] > 0 and rows["done"]["tokens"] == 6 * 4 * 32
