"""Training on a CUDA device: a short compiled bf16 run, exact resume after kill -9 on one GPU,
and sharded (DCP) checkpoints of an FSDP2 model on the GPU.

Marked ``cuda``: skipped where no CUDA device is visible (CI); run on a GPU with
``pytest -m cuda``.
"""

import os
import random
import signal

import pytest
import torch

from danastar.optim import ADana
from danastar.train.checkpoint import Checkpointer

from train_helpers import (
    assert_ok,
    compared,
    last_step,
    metrics,
    run_train,
    start_train,
    wait_for_step,
)

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ON_GPU = ("train.device=cuda", "train.compile=true", "train.autocast=bf16")
RUN = ("--iterations", "30", "checkpoint.latest_every=3", *ON_GPU)


def test_a_compiled_bf16_run_on_cuda_trains(tmp_path):
    run_dir = tmp_path / "run"
    assert_ok(run_train(["--iterations", "30", *ON_GPU], run_dir))
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "device cuda" in log, log
    validation = [m["val_loss"] for m in metrics(run_dir) if "val_loss" in m]
    assert validation[-1] < validation[0] - 0.1, validation


def test_kill_9_then_resume_on_one_gpu_is_bitwise_identical(tmp_path, reference_runs):
    reference = compared(reference_runs(RUN))
    run_dir = tmp_path / "run"
    process = start_train(list(RUN), run_dir)
    wait_for_step(process, run_dir, random.Random().randint(5, 20), timeout=300)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert last_step(run_dir) < 30, "the run finished before it could be killed"
    assert_ok(run_train(list(RUN), run_dir))
    assert "resumed from" in (run_dir / "logs" / "rank0.log").read_text()
    assert compared(run_dir) == reference


def test_sharded_checkpoint_round_trip_on_cuda(tmp_path):
    """An FSDP2 model and its ADana state on the GPU, saved with torch.distributed.checkpoint by
    the run's Checkpointer and loaded into a fresh model: weights and state come back exactly,
    and the next step is the same."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    try:
        mesh = init_device_mesh("cuda", (1,))

        def build(seed):
            torch.manual_seed(seed)
            model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                        torch.nn.Linear(128, 8)).cuda()
            for layer in (model[0], model[2]):
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            return model, ADana(model.parameters(), lr=1e-2, weight_decay=0.1, wd_ts=10)

        def step(model, optimizer, seed):
            generator = torch.Generator("cuda").manual_seed(seed)
            inputs = torch.randn(16, 64, device="cuda", generator=generator)
            model(inputs).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()

        model, optimizer = build(0)
        for seed in range(3):
            step(model, optimizer, seed)
        checkpointer = Checkpointer(tmp_path / "checkpoints", sharded=True)
        checkpointer.save(3, model, optimizer, {"step": 3})
        fresh_model, fresh_optimizer = build(1)
        step(fresh_model, fresh_optimizer, 99)  # state to be overwritten
        found = checkpointer.find_latest()
        assert (found.step, found.layout) == (3, "dcp")
        assert checkpointer.load(found, fresh_model, fresh_optimizer)["step"] == 3
        for a, b in zip(model.parameters(), fresh_model.parameters()):
            assert torch.equal(a.full_tensor(), b.full_tensor())
        for a, b in zip(model.parameters(), fresh_model.parameters()):
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(optimizer.state[a][key].full_tensor(),
                                   fresh_optimizer.state[b][key].full_tensor())
        step(model, optimizer, 3)
        step(fresh_model, fresh_optimizer, 3)
        for a, b in zip(model.parameters(), fresh_model.parameters()):
            assert torch.equal(a.full_tensor(), b.full_tensor())
    finally:
        dist.destroy_process_group()
