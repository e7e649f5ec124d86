"""FSDP2 (DTensor parameters and state) with 2 CPU processes over gloo matches one process."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from danastar.optim import build_optimizer

# (registry name, impl): every variant, on the CPU default (reference) path or on foreach. (The
# compiled path runs the reference's per-tensor function on the same local shards; compiling in
# two processes would double this test's time, so the single-process tests cover it.)
VARIANTS = [("adana", None), ("dana-mk4", "foreach"), ("dana-star", None),
            ("dana-star-mk4", "foreach")]
HPARAMS = {"weight_decay": 0.1, "wd_ts": 2}
STEPS = 4


def make_model():
    torch.manual_seed(0)
    # Odd sizes so the shards are uneven; an embedding with unused rows (sparse gradients).
    return nn.Sequential(nn.Embedding(9, 6), nn.Linear(6, 7), nn.GELU(), nn.Linear(7, 5))


def train(model, name, impl):
    optimizer = build_optimizer(name, model.parameters(), lr=0.05, impl=impl, **HPARAMS)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step))
    idx = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 1]])
    for _ in range(STEPS):
        optimizer.zero_grad()
        model(idx).square().mean().backward()
        optimizer.step()
        scheduler.step()
    return optimizer.diagnostics()


def sharded_worker(rank, world, port, out_path):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    results = {}
    for name, impl in VARIANTS:
        model = make_model()
        for layer in model:
            if any(True for _ in layer.parameters()):
                fully_shard(layer)
        fully_shard(model)
        assert all(isinstance(p, DTensor) for p in model.parameters())
        diagnostics = train(model, name, impl)  # every rank joins the diagnostics' reductions
        params = [p.full_tensor() for p in model.parameters()]
        results[f"{name}-{impl}"] = (params, diagnostics)
    if rank == 0:
        torch.save(results, out_path)
    dist.barrier()  # neither rank tears gloo down while the other may still be talking to it
    dist.destroy_process_group()
    # The groups live on in the meshes and sharded modules built here, so the interpreter's exit
    # would destroy them again, which now and then aborts inside gloo's threads (SIGABRT).
    # Every result is saved and every collective done: leave without that second teardown.
    os._exit(0)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_fsdp2_two_processes_match_one(tmp_path):
    out_path = tmp_path / "sharded.pt"
    mp.spawn(sharded_worker, args=(2, free_port(), str(out_path)), nprocs=2, join=True)
    sharded = torch.load(out_path, weights_only=True)
    for name, impl in VARIANTS:
        model = make_model()
        diagnostics = train(model, name, "reference")
        params, sharded_diagnostics = sharded[f"{name}-{impl}"]
        for want, got in zip(model.parameters(), params):
            torch.testing.assert_close(got, want.detach(), rtol=1e-6, atol=1e-7)
        assert sharded_diagnostics.keys() == diagnostics.keys()
        for key, value in diagnostics.items():
            assert sharded_diagnostics[key] == pytest.approx(value, rel=1e-6)
