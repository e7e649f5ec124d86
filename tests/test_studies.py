"""The studies' planners decide from records alone: the same records give the same choice,
whatever order the runs ended in."""

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from danastar.launch.sweep_spec import run_state

FAIR = Path(__file__).parents[1] / "studies" / "fair" / "study.py"


@pytest.fixture(scope="module")
def fair():
    spec = importlib.util.spec_from_file_location("fair_study", FAIR)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def lr_sweep(fair, losses: dict[float, float]):
    """Settles a seed-0 LR sweep over ⅛, ¼, ½ whose recorded final losses are `losses`."""
    def key(multiplier, seed=0):
        return fair.Key("sh", 2048, "adana", float(multiplier), 40, seed)

    planner = fair.Planner({key(m): ("recorded", Path()) for m in losses})
    planner.loss = lambda k: losses[k.multiplier]
    best = planner.settle("lr", "sh", 16, lambda: {m: planner.loss(key(m)) for m in losses},
                          [0.125, 0.25, 0.5], fair.lr_beyond, key, (0,), "the LR sweep")
    return best, planner.tasks


def test_a_widening_decides_only_once_all_its_runs_are_recorded(fair):
    # The best sits at the low edge, so the sweep widens to 1/16 and 1/32. With only the far
    # run ended, ⅛ must not read as interior: the choice waits for 1/16.
    edge = {0.125: 4.2298, 0.25: 4.2440, 0.5: 4.3160}
    best, tasks = lr_sweep(fair, {**edge, 0.03125: 4.4032})
    assert best is None
    assert tasks["lr-widen1"].grid["lr_multiplier"] == [0.0625]

    assert lr_sweep(fair, {**edge, 0.03125: 4.4032, 0.0625: 4.2500})[0] == 0.125
    assert lr_sweep(fair, {**edge, 0.03125: 4.4032, 0.0625: 4.2000})[0] == 0.0625


def test_a_point_outside_the_sweep_does_not_move_its_choice(fair):
    # A run recorded by another sweep at the same warm-up (an LR re-check, say) is not part of
    # this one: ⅛ stays an edge and the sweep widens.
    best, tasks = lr_sweep(fair, {0.125: 4.2298, 0.25: 4.2440, 0.5: 4.3160, 0.03125: 4.4032,
                                  1: 4.5})
    assert best is None and "lr-widen1" in tasks


SEED0_TABLE = """
import sys
from pathlib import Path
sys.path.insert(0, "studies/fair")
import report, study
known = {study.Key(corpus, steps, "adamw", 0.125, steps // 50, 0): ("recorded", Path())
         for corpus, steps in (("sh", 2048), ("sh", 4096), ("pr", 4096))}
planner = study.Planner(known)
planner.loss = lambda key: 4.0 + key.steps / 1e4
results = report.Results.__new__(report.Results)
results.planner = planner
print("\\n".join(report.seed0_table(results)))
"""


def test_the_seed0_table_lists_only_the_horizons_a_corpus_is_swept_at():
    # AdamW's run at twice Shakespeare 16x's steps is a budget run, not a Shakespeare 32x sweep;
    # prose is swept at 32x.
    table = subprocess.run([sys.executable, "-c", SEED0_TABLE], capture_output=True, text=True,
                           cwd=FAIR.parents[2], check=True).stdout
    assert "| shakespeare | 16× | adamw | 40 | 0.125: 4.2048 |" in table
    assert "| prose | 32× | adamw | 81 | 0.125: 4.4096 |" in table
    assert "shakespeare | 32×" not in table


GAP_CELLS = """
import sys
sys.path.insert(0, "studies/fair")
import report
for differences in ([-0.0658, -0.0689, -0.0673], [-0.060, -0.070, -0.065], [-0.042, -0.023, -0.042],
                    [-0.01, 0.005, -0.005]):
    print(report.gap_cell(report.paired_gap_of(differences)))
"""


def test_a_gap_cell_keeps_a_small_p_visible():
    # The paired t-test's p for 3 seeds: a tight gap reads "< 0.001" or "0.00x", never "0.00".
    cells = subprocess.run([sys.executable, "-c", GAP_CELLS], capture_output=True, text=True,
                           cwd=FAIR.parents[2], check=True).stdout.splitlines()
    assert cells[0] == "-0.0673 ± 0.0009 (-75.2, < 0.001)"
    assert cells[1] == "-0.0650 ± 0.0029 (-22.5, 0.002)"  # p 0.00197
    assert cells[2].endswith("(-5.6, 0.03)")
    assert cells[3] == "-0.0033 ± 0.0044 (-0.8, 0.53)"


# -- the scheduler every driver shares (studies/common.py) -------------------------------------

DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, {studies!r})
import common
folder = Path(sys.argv[1])
task = common.Task("tiny", {base!r}, {{"optim.name": ["adamw"], "lr_multiplier": [1]}}, (0,),
                   "a tiny sweep")
sys.exit(common.Scheduler(folder / "records", folder / "sweeps", lambda: [task])
         .run(folder / "runs", 1) or 0)
"""
# A tiny model on the in-memory synthetic source, long enough to be training when stopped.
TINY = {"data.dataset": "synthetic", "model.heads": 2, "train.batch_size": 4,
        "train.sequence_length": 32, "train.iterations": 400, "train.eval_interval": 400,
        "train.log_interval": 1, "train.sample_tokens": 0}


@pytest.mark.slow
def test_a_stopped_driver_stops_its_sweeps_where_they_can_resume(tmp_path):
    # Before: SIGTERM ended the driver alone; its sweep went on training without it, holding
    # the run's lock, so the next driver could not resume that sweep.
    script = DRIVER.format(studies=str(FAIR.parents[1]), base=TINY)
    driver = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)],
                              env={**os.environ, "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "runs" / "tiny" / "adamw-lrx1" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and '"train_loss"' in metrics.read_text()):
        assert time.monotonic() < deadline and driver.poll() is None, driver.communicate()
        time.sleep(0.2)
    driver.send_signal(signal.SIGTERM)
    stdout, stderr = driver.communicate(timeout=120)
    assert driver.returncode == 75, stderr
    assert "stopped tiny" in stdout and "study: stopped by SIGTERM" in stderr
    assert "Traceback" not in stderr
    written = metrics.read_bytes()
    time.sleep(1.0)  # nothing is left training: the metrics stay as they are
    assert metrics.read_bytes() == written
    state = run_state(metrics.parent)
    assert state["state"] == "partial" and 0 < state["step"] < 400, state
    assert any((metrics.parent / "checkpoints").iterdir())  # it saved before stopping
