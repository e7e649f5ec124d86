"""Golden losses: one tiny deterministic run's per-step numbers, stored, so that any change to the
numerics between commits (model, loss, optimizer, schedule, data order) is seen.

The run is the synthetic source, a 2-head Enoki and ADana for 12 steps, in a fresh process with
one CPU thread: bitwise reproducible from process to process on one machine (more threads split
reductions differently; the last digits change). Other CPUs may round differently, hence the
small tolerance. After an intended numerics change, regenerate the file and commit it with the
change:

    DANASTAR_UPDATE_GOLDEN=1 python -m pytest tests/train/test_golden.py
"""

import json
import os
from pathlib import Path

import pytest
import torch

from train_helpers import TINY, assert_ok, metrics, run_train

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "tiny_synthetic_enoki_adana.json"
ARGS = ["--iterations", "12", "checkpoint.latest_every=-1"]
KEYS = ("loss", "train_loss", "grad_norm", "lr", "val_loss")  # not timings
RELATIVE_TOLERANCE = 1e-5


def golden_run(run_dir: Path) -> dict[str, dict[str, float]]:
    assert_ok(run_train(ARGS, run_dir))
    steps: dict[str, dict[str, float]] = {}
    for line in metrics(run_dir):
        steps.setdefault(str(line["step"]), {}).update(
            {key: line[key] for key in KEYS if key in line})
    return steps


def test_tiny_run_matches_its_golden_losses(tmp_path):
    steps = golden_run(tmp_path / "run")
    if os.environ.get("DANASTAR_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({"arguments": [*TINY, *ARGS], "torch": torch.__version__,
                                      "steps": steps}, indent=1) + "\n")
        pytest.skip(f"wrote {GOLDEN}")
    expected = json.loads(GOLDEN.read_text())["steps"]
    assert steps.keys() == expected.keys()
    for step, values in expected.items():
        assert steps[step].keys() == values.keys(), step
        for key, value in values.items():
            assert steps[step][key] == pytest.approx(value, rel=RELATIVE_TOLERANCE), (step, key)
