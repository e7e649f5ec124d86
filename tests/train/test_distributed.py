"""DDP, FSDP2 (full shard, ZeRO-2-like, HSDP) and TP + FSDP2 on 2 CPU processes reproduce one
process on the same global batch, within float rounding; every rank takes part in evaluation."""

import pytest

from train_helpers import assert_ok, compared, metrics, run_train

RUN = (
    "--iterations",
    "40",
    "checkpoint.latest_every=3",
)  # the resume tests' run: references are shared


def assert_close_to(run_dir, reference_dir):
    """Same steps and keys, values within float rounding. Rounding differences (reduction orders)
    start near 1e-7 and an adaptive optimizer amplifies them over 40 steps to ~2e-5 in the losses
    and a few 1e-4 in the gradient norm; a real discrepancy (a missing all-reduce, a wrong shard)
    shows at the first step and is orders of magnitude larger."""
    got, expected = compared(run_dir), compared(reference_dir)
    assert [(step, key) for step, key, _ in got] == [(step, key) for step, key, _ in expected]
    for (step, key, value), (_, _, reference) in zip(got, expected):
        rel = 1e-6 if step <= 2 else 2e-3 if key == "grad_norm" else 2e-4
        assert value == pytest.approx(reference, rel=rel), (step, key, value, reference)


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout",
    [
        (),  # DDP, the default with several processes
        ("--distributed_backend", "fsdp"),
        ("--distributed_backend", "zero2", "parallel.activation_checkpointing=1"),
        ("--distributed_backend", "hsdp", "parallel.hsdp_replicas=2"),
    ],
)
def test_two_processes_match_one(reference_runs, layout):
    run_dir = reference_runs((*RUN, *layout), torchrun=2)
    assert_close_to(run_dir, reference_runs(RUN))
    assert metrics(run_dir)[-1]["step"] == 40 and metrics(run_dir)[-1].get("final")


@pytest.mark.slow
def test_tensor_parallel_with_fsdp_matches_one_process(tmp_path, reference_runs):
    run_dir = tmp_path / "run"
    assert_ok(
        run_train(
            [*RUN, "--distributed_backend", "fsdp", "parallel.tp_size=2"], run_dir, torchrun=2
        )
    )
    assert_close_to(run_dir, reference_runs(RUN))


@pytest.mark.slow
def test_nproc_flag_launches_torchrun_itself(tmp_path, reference_runs):
    run_dir = tmp_path / "run"
    assert_ok(run_train([*RUN, "--nproc", "2"], run_dir))
    assert 'world_size": 2' in (run_dir / "environment.json").read_text()
    assert (run_dir / "logs" / "rank1.log").exists()
    assert_close_to(run_dir, reference_runs(RUN))
