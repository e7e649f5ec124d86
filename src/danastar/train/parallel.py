"""Distribution: the processes of a run (single process, DDP, FSDP2 in full shard, ZeRO-2-like
or HSDP, TP + FSDP2), their devices and collectives; `train.wrap` wraps the model for them.

`setup_distributed` reads torchrun's environment, picks the device and process-group backend
(nccl on GPU, gloo on CPU) and builds the device mesh; `autocast_context` is the precision a
device's passes run in.

Mesh dimensions (outermost first): `dp_replicate` (HSDP only), `dp_shard` (or `dp`), `tp`.
Ranks that differ only in their `tp` coordinate see the same data, so the data loader is given
`data_rank`/`data_world` rather than the global rank and world. With expert parallelism
(`--ep_size N`) the data-parallel dimension is built as (`dp_mod_ep`, `ep`) and flattened into
`dp`: the `ep` ranks (which see different data) split each MoE layer's routed experts between
them, and replicas of the same experts differ in their `dp_mod_ep` coordinate. The expert
shards stay out of DDP and FSDP2 (which would treat them as replicas over all of `dp`);
`wrap.ExpertGradients` reduces their gradients over `dp_mod_ep` after the last micro-step.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import threading
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from danastar.errors import UserError, report

SHARDED_BACKENDS = ("fsdp", "zero2", "hsdp")
# How long a process waits for the other processes of its job (see `join_process_group`).
RENDEZVOUS_TIMEOUT_VARIABLE = "DANASTAR_RENDEZVOUS_TIMEOUT"
DEFAULT_RENDEZVOUS_TIMEOUT = 600.0
RENDEZVOUS_NOTICE_S = 10.0  # a job's processes usually meet within this: say nothing before


@dataclass
class Distributed:
    """Where this process sits: rank, world, device, mesh, and which slice of data it reads."""

    backend: str  # single | ddp | fsdp | zero2 | hsdp
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    data_rank: int
    data_world: int
    mesh: Optional["torch.distributed.device_mesh.DeviceMesh"] = None
    ep_size: int = 1  # expert-parallel ranks (1: every rank holds every expert)
    # With expert parallelism, `dp_mod_ep` × `ep` flattened: the mesh FSDP2 shards the rest over
    # (kept here: slicing a flattened dimension from the root mesh is deprecated).
    flat_dp_mesh: Optional["torch.distributed.device_mesh.DeviceMesh"] = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """Whether some parameters are sharded over ranks (FSDP2, or the experts under expert
        parallelism): checkpoints are then written by every rank with DCP."""
        return self.backend in SHARDED_BACKENDS or self.ep_size > 1


def choose_device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "train.device=cuda was asked for but no CUDA device is visible; use train.device=cpu."
        )
    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    # Modulo: a cluster that binds one GPU per task (srun --gpus-per-task) shows each task one.
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())


def autocast_context(config, device: torch.device):
    """bf16 autocast on CUDA by default; off on CPU unless asked for (it is slow there)."""
    wanted = config.train.autocast
    if wanted == "bf16" or (wanted == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def resolve_backend(requested: str, world_size: int) -> str:
    """The backend to use: one process is always `single` (nothing to shard or replicate)."""
    if world_size == 1:
        return "single"
    if requested == "auto":
        return "ddp"
    if requested == "single" and world_size > 1:
        raise UserError(
            f"--distributed_backend single cannot run {world_size} processes; use ddp or fsdp."
        )
    return requested


def setup_distributed(config) -> Distributed:
    """Initialise torch.distributed when launched by torchrun (WORLD_SIZE > 1) and build the
    mesh."""
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    backend = resolve_backend(config.parallel.backend, world_size)
    device = choose_device(config.train.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tp, replicas = config.parallel.tp_size, config.parallel.hsdp_replicas
    if world_size == 1:
        if tp > 1 or replicas > 1:
            raise UserError("tensor parallelism and HSDP need several processes; add --nproc.")
        return Distributed(backend, 0, 0, 1, device, 0, 1)
    if not dist.is_initialized():
        join_process_group(device, rank, world_size)
    data_world = world_size // tp
    ep = config.parallel.ep_size
    shape, names = [data_world], ["dp"]
    if backend == "hsdp":
        shape, names = [replicas, data_world // replicas], ["dp_replicate", "dp_shard"]
    elif ep > 1:  # config.py has checked: ep divides the data-parallel world, no TP, no HSDP
        shape, names = [data_world // ep, ep], ["dp_mod_ep", "ep"]
    if tp > 1:
        shape, names = shape + [tp], names + ["tp"]
    mesh = init_device_mesh(device.type, tuple(shape), mesh_dim_names=tuple(names))
    flat_dp = mesh["dp_mod_ep", "ep"]._flatten("dp") if ep > 1 else None
    return Distributed(backend, rank, local_rank, world_size, device, rank // tp, data_world, mesh,
                       ep, flat_dp)


def rendezvous_timeout() -> float:
    """Seconds to wait for the other processes of the job: `$DANASTAR_RENDEZVOUS_TIMEOUT`, else
    600 (torchrun's own wait for the nodes of a job)."""
    value = os.environ.get(RENDEZVOUS_TIMEOUT_VARIABLE, "").strip()
    if not value:
        return DEFAULT_RENDEZVOUS_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise UserError(f"{RENDEZVOUS_TIMEOUT_VARIABLE}={value} is not a number of seconds above "
                        f"0; set it to how long to wait for the other processes (default "
                        f"{DEFAULT_RENDEZVOUS_TIMEOUT:g}) or unset it.")
    return seconds


def join_process_group(device: torch.device, rank: int, world_size: int) -> None:
    """Meet the job's other processes at MASTER_ADDR:MASTER_PORT. The environment alone says
    there are others (a launcher's variables, or ones a shell inside a torchrun job inherited):
    after a few seconds without them this process says what it waits for, and after
    `rendezvous_timeout()` it gives up with exit 2 and the fix, rather than wait for ever."""
    why = (f"RANK={rank} and WORLD_SIZE={world_size} in the environment say this process is rank "
           f"{rank} of a {world_size}-process job")
    fix = (f"if it is meant to run alone, unset RANK, WORLD_SIZE and LOCAL_RANK (a shell inside a "
           f"torchrun job inherits them); else start the {world_size} processes together (--nproc "
           f"{world_size}, torchrun, srun or mpirun)")
    address, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    if not address or not port:
        raise UserError(f"{why}, but MASTER_ADDR and MASTER_PORT (where its processes meet) are "
                        f"not set; {fix}.")
    timeout = rendezvous_timeout()
    joined = threading.Event()

    def watch() -> None:
        notice = min(RENDEZVOUS_NOTICE_S, timeout / 2)
        if joined.wait(notice):
            return
        others = "process" if world_size == 2 else f"{world_size - 1} processes"
        print(f"danastar train: waiting at {address}:{port} for the other {others} of the job "
              f"({why}); giving up in {timeout - notice:g} s.", file=sys.stderr, flush=True)
        if joined.wait(timeout - notice):
            return
        report(UserError(f"the other processes of a {world_size}-process job did not join at "
                         f"{address}:{port} within {timeout:g} s ({why}); {fix}; "
                         f"{RENDEZVOUS_TIMEOUT_VARIABLE}=<seconds> waits longer."), "train")
        os._exit(UserError.exit_code)  # the main thread is blocked inside torch: leave from here

    threading.Thread(target=watch, name="rendezvous-watch", daemon=True).start()
    try:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            timeout=datetime.timedelta(minutes=30),
            device_id=device if device.type == "cuda" else None,
        )
    except dist.DistNetworkError as error:  # e.g. rank 0 cannot listen: the port is taken
        raise UserError(f"this process cannot meet the others at {address}:{port} ("
                        f"{str(error).splitlines()[0].rstrip('.')}; {why}); {fix}, or choose "
                        f"another MASTER_PORT.") from None
    finally:
        joined.set()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over every rank (a no-op in a single process); returns the tensor for chaining."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def teardown(synchronize: bool = False) -> None:
    """Destroy the process group; first a barrier if ``synchronize`` (not after an error, where
    a rank that failed would leave the others waiting at it)."""
    if dist.is_available() and dist.is_initialized():
        if synchronize:
            dist.barrier()
        dist.destroy_process_group()
