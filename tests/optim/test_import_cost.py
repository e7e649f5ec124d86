"""`import danastar.optim` stays light: torch.distributed.tensor (about a second, with sympy)
is imported only where a DTensor can exist, by whoever shards the model."""

import subprocess
import sys

import torch

from danastar.optim.dtensors import DTENSOR_MODULE, is_dtensor


def test_importing_the_optimizers_does_not_import_torch_distributed_tensor():
    probe = ("import sys, danastar.optim, danastar.optim.muon; "
             f"print({DTENSOR_MODULE!r} in sys.modules, 'sympy' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "False"]


def test_a_dtensor_is_told_from_a_plain_tensor():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    plain = torch.ones(3)
    assert not is_dtensor(plain)
    created = not dist.is_initialized()
    if created:  # a one-process group of this test's own
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        sharded = DTensor.from_local(plain, mesh, [Replicate()])
        assert is_dtensor(sharded) and not is_dtensor(sharded.to_local())
    finally:
        if created:
            dist.destroy_process_group()
