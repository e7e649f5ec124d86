"""τ statistics (`--collect_tau_stats`): the order statistics kept, the schedule, and the files of
a real Dana-Star run, identical after a stop and a resume."""

import json

import numpy as np
import pytest
import torch

from danastar.train.tau_stats import collection_due, is_collection, order_indices, order_statistics

from train_helpers import assert_ok, run_train


def test_order_indices_and_statistics():
    indices = order_indices(1000)
    # k = 0 … ⌈ln 1000 / ln 1.1⌉ = 73
    expected = sorted({min(int(np.floor(1.1 ** k)) - 1, 999) for k in range(74)})
    assert indices.tolist() == expected and indices[0] == 0 and indices[-1] == 999
    tau = torch.randperm(1000).float().reshape(20, 50)  # τ values 0 … 999: order statistic = index
    stats = order_statistics(tau)
    assert stats["smallest"].tolist() == indices.tolist()
    assert stats["largest"].tolist() == (999 - indices).tolist()
    assert stats["shape"].tolist() == [20, 50]
    assert order_indices(1).tolist() == [0]


def test_collections_are_at_evaluations_10_20_40_80():
    assert [n for n in range(200) if is_collection(n)] == [10, 20, 40, 80, 160]
    assert [s for s in range(0, 500, 5) if collection_due(s, 5)] == [50, 100, 200, 400]
    assert not collection_due(51, 5)


RUN = ["--opt", "dana-star-mk4", "--collect_tau_stats", "--eval_interval", "1", "--iterations",
       "21", "checkpoint.latest_every=-1"]


def arrays(run_dir, step):
    with np.load(run_dir / "tau_stats" / f"step-{step:08d}.npz") as loaded:
        return {key: loaded[key] for key in loaded.files}


@pytest.mark.slow
def test_a_run_collects_at_the_scheduled_evaluations_and_resume_keeps_them(tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert_ok(run_train(RUN, whole))
    meta = json.loads((whole / "tau_stats" / "metadata.json").read_text())
    assert [c["step"] for c in meta["collections"]] == [10, 20]
    assert meta["optimizer"] == "dana-star-mk4" and meta["eval_interval"] == 1
    collected = arrays(whole, 20)
    names = {key.split("::")[0] for key in collected}
    assert "lm_head.weight" in names or any("weight" in name for name in names)
    for name in names:
        n = int(np.prod(collected[f"{name}::shape"]))
        assert collected[f"{name}::indices"].tolist() == order_indices(n).tolist()
        assert np.all(np.diff(collected[f"{name}::smallest"]) >= 0)
        assert np.all(np.diff(collected[f"{name}::largest"]) <= 0)
    assert not np.array_equal(arrays(whole, 10)[f"{name}::largest"], collected[f"{name}::largest"])

    stopped = run_train([*RUN, "--iterations_to_run", "15"], resumed)
    assert stopped.returncode == 75, stopped.stderr[-2000:]
    assert_ok(run_train(RUN, resumed))
    assert [c["step"] for c in json.loads((resumed / "tau_stats" / "metadata.json").read_text())
            ["collections"]] == [10, 20]
    for step in (10, 20):
        again = arrays(resumed, step)
        assert again.keys() == arrays(whole, step).keys()
        for key, value in arrays(whole, step).items():
            assert np.array_equal(again[key], value), (step, key)
