"""The memory a run needs at least on this machine, against what the machine has free: the
check that refuses a model too large before anything is allocated."""

from __future__ import annotations

import torch

from danastar.config import TrainConfig
from danastar.machine import available_memory
from danastar.scaling import Plan
from danastar.train.parallel import SHARDED_BACKENDS, resolve_backend


def training_memory(config: TrainConfig, plan: Plan, world_size: int, device
                    ) -> tuple[int, int]:
    """(bytes, processes) that training needs at least on this machine's memory for `device`:
    each process builds the whole model in float32 before it shards it, and holds its share of
    the gradients and two optimizer states (each in `--state_dtype`); activations come on top.
    On a CPU the `--nproc` processes share the memory, on GPUs each has its own."""
    backend = resolve_backend(config.parallel.backend, world_size)
    shards = world_size if backend in SHARDED_BACKENDS or config.parallel.tp_size > 1 else 1
    state_bytes = 2 if config.optim.state_dtype == "bfloat16" else 4
    per_process = plan.params.exact_total_params * (4 + (4 + 2 * state_bytes) / shards)
    processes = 1 if device.type == "cuda" else world_size
    return int(per_process * processes), processes


def memory_problem(config: TrainConfig, plan: Plan, world_size: int, device) -> str | None:
    """Why the planned model cannot fit in the memory `device` has free on this machine (the
    memory available to new processes for a CPU), or None (it may fit, or the system does not
    say)."""
    need, processes = training_memory(config, plan, world_size, device)
    free = free_memory(device)
    if free is None or need <= free:
        return None
    where = (f"GPU {torch.cuda.get_device_name(device)} has {free / 2**30:.1f} GiB free"
             if device.type == "cuda" else f"machine has {free / 2**30:.1f} GiB available")
    each = f" in {processes} processes" if processes > 1 else ""
    return (f"the model's {plan.params.exact_total_params:,} parameters need at least "
            f"{need / 2**30:.1f} GiB{each} for their weights, gradients and optimizer state, "
            f"and this {where}")


def free_memory(device) -> int | None:
    """Bytes free on `device` (a CPU: the memory available to new processes), None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return available_memory()
