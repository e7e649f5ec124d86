"""DDP, FSDP2 (full shard, ZeRO-2-like, HSDP) and TP + FSDP2 on 2 CPU processes reproduce one
process on the same global batch, within float rounding; every rank takes part in evaluation."""

import pytest
from train_helpers import assert_ok, compared, metrics, run_train

RUN = ("--iterations", "8", "checkpoint.latest_every=-1")


def assert_close_to(run_dir, reference_dir, rel):
    got, expected = compared(run_dir), compared(reference_dir)
    assert [(step, key) for step, key, _ in got] == [(step, key) for step, key, _ in expected]
    for (step, key, value), (_, _, reference) in zip(got, expected):
        assert value == pytest.approx(reference, rel=rel, abs=rel), (step, key, value, reference)


@pytest.mark.slow
@pytest.mark.parametrize("layout, rel", [
    (("--distributed_backend", "ddp"), 1e-5),
    (("--distributed_backend", "fsdp"), 1e-5),
    (("--distributed_backend", "zero2", "parallel.activation_checkpointing=1"), 1e-5),
    (("--distributed_backend", "hsdp", "parallel.hsdp_replicas=2"), 1e-5),
])
def test_two_processes_match_one(tmp_path, reference_runs, layout, rel):
    run_dir = tmp_path / "run"
    assert_ok(run_train([*RUN, *layout], run_dir, torchrun=2))
    assert_close_to(run_dir, reference_runs(RUN), rel)
    assert all(m["step"] <= 8 for m in metrics(run_dir)) and metrics(run_dir)[-1].get("final")


@pytest.mark.slow
def test_tensor_parallel_with_fsdp_matches_one_process(tmp_path, reference_runs):
    run_dir = tmp_path / "run"
    assert_ok(run_train([*RUN, "--distributed_backend", "fsdp", "parallel.tp_size=2"], run_dir, torchrun=2))
    assert_close_to(run_dir, reference_runs(RUN), 1e-5)


@pytest.mark.slow
def test_nproc_flag_launches_torchrun_itself(tmp_path, reference_runs):
    run_dir = tmp_path / "run"
    assert_ok(run_train([*RUN, "--nproc", "2"], run_dir))
    assert "world_size\": 2" in (run_dir / "environment.json").read_text()
    assert (run_dir / "logs" / "rank1.log").exists()
    assert_close_to(run_dir, reference_runs(RUN), 1e-5)
