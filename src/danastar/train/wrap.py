"""The model wrapped for the run's parallelism (`train.parallel` sets up the processes), in a
fixed order: tensor parallelism or expert parallelism → activation checkpointing → torch.compile
→ FSDP2 (or DDP); and what the loop does through the wrapper (`unwrap`, `gradient_sync`).

Expert shards (`--ep_size N`) stay out of DDP and FSDP2, which would treat them as replicas over
all of `dp`: `ExpertGradients` reduces their gradients over `dp_mod_ep` after the last
micro-step.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from danastar.errors import UserError
from danastar.train.parallel import SHARDED_BACKENDS, Distributed


def data_parallel_mesh(env: Distributed):
    """The mesh FSDP2 shards over: 1-D `dp`, or the 2-D (replicate, shard) mesh of HSDP."""
    if env.backend == "hsdp":
        return env.mesh["dp_replicate", "dp_shard"]
    return env.flat_dp_mesh if env.flat_dp_mesh is not None else env.mesh["dp"]


def parallelize(model: nn.Module, config, env: Distributed) -> nn.Module:
    """TP → EP → activation checkpointing → compile → FSDP2/DDP, as the configuration asks."""
    if env.ep_size > 1:
        apply_expert_parallel(model, env)
    # FSDP2, DTensor and the parallel plans are imported where a layout uses them: importing
    # them costs a process about a second at start, which a one-process run need not pay.
    if config.parallel.tp_size > 1:
        from danastar.models.parallelize import apply_tensor_parallel  # noqa: PLC0415 (above)

        try:
            apply_tensor_parallel(model, env.mesh["tp"])
        except ValueError as error:
            raise UserError(f"{error}.") from None
    if config.parallel.activation_checkpointing:
        from danastar.models.parallelize import (  # noqa: PLC0415 (above)
            apply_activation_checkpointing,
        )

        apply_activation_checkpointing(model, config.parallel.activation_checkpointing)
    if config.train.compile:
        for block in model.blocks:  # per block: FSDP2 then wraps compiled blocks unchanged
            block.compile()
        # The loss's elementwise work too (a vocabulary-sharded head under TP stays eager).
        model.compile_loss = config.parallel.tp_size == 1
    if env.backend in SHARDED_BACKENDS:
        return apply_fsdp(model, config, env)
    if env.backend == "ddp":
        # DDP would all-reduce the experts' shards over every rank as if they were replicas:
        # they are left out of it and reduced by `ExpertGradients` over their true replicas.
        experts = [name for name, param in model.named_parameters() if is_expert_shard(param)]
        if experts:
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, experts)
        device_ids = [env.device.index] if env.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    return model


# ----------------------------------------------------------------------------------------------
# Expert parallelism

def is_expert_shard(param: torch.Tensor) -> bool:
    """A parameter sharded over the `ep` mesh (FSDP2's are on `dp`, TP's on `tp`)."""
    return is_instance_of_loaded(param, "torch.distributed.tensor", "DTensor") and \
        param.device_mesh.mesh_dim_names == ("ep",)


def is_instance_of_loaded(value, module: str, name: str) -> bool:
    """isinstance(value, module.name), where a module that is not imported yet (this process
    made no DTensor or FSDP2 module) has no instance to find."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(value, getattr(loaded, name))


def apply_expert_parallel(model: nn.Module, env: Distributed) -> None:
    """Split every MoE layer's routed experts over the `ep` mesh and route through them.

    The experts' stacked (R, out, in) parameters become DTensors `Shard(0)` on `ep` rather than
    plain local (R/ep, out, in) slices: the gradient-norm clip, the optimizers (which work on
    local shards), τ statistics and DCP checkpoints already handle DTensors, and a checkpoint then
    holds every expert whole whatever the ep size (saved with DCP by every rank, as under FSDP2,
    since one rank alone cannot write the experts it does not hold).
    """
    from danastar.models.expert_parallel import (  # noqa: PLC0415 (as in parallelize)
        apply_expert_parallel as shard_experts,
    )

    moe = getattr(model.config, "moe", None)
    capacity = moe.expert_capacity_factor if moe else 0.0
    names = shard_experts(model, env.mesh["ep"], capacity)
    if not names:
        raise UserError(f"--ep_size {env.ep_size} found no MoE layer to split; add --moe.")
    params = [param for param in model.parameters() if is_expert_shard(param)]
    model.expert_gradients = ExpertGradients(params, env.mesh["dp_mod_ep"].get_group(),
                                             env.data_world)


@dataclass
class ExpertGradients:
    """The reduction DDP and FSDP2 do not do for the expert shards (they are left out of both).

    Each rank's expert gradient already sums the contributions of the tokens of every `ep` rank
    (the all-to-all brings them back in backward); what remains is the sum over the replicas of
    the same experts (`dp_mod_ep`) and the division by the whole data-parallel world that DDP and
    FSDP2 apply to every other gradient (the gradients are those of the ranks' mean loss).
    """

    params: list
    replicas: "dist.ProcessGroup"
    data_world: int

    def reduce(self) -> None:
        for param in self.params:
            if param.grad is None:  # no rows reached these experts on any step of the backward
                param.grad = torch.zeros_like(param)
            grad = param.grad.to_local()
            if dist.get_world_size(self.replicas) > 1:
                dist.all_reduce(grad, group=self.replicas)
            grad.div_(self.data_world)


def apply_fsdp(model: nn.Module, config, env: Distributed) -> nn.Module:
    """fully_shard each block, then the root; fp32 parameters, bf16 gradient reduction on GPU."""
    from torch.distributed.fsdp import (  # noqa: PLC0415 (as in parallelize)
        MixedPrecisionPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    reduce = config.parallel.reduce_dtype
    if reduce == "auto":
        reduce = "bf16" if env.device.type == "cuda" else "fp32"
    policy = MixedPrecisionPolicy(
        param_dtype=torch.float32,
        reduce_dtype=torch.bfloat16 if reduce == "bf16" else torch.float32,
    )
    reshard = (
        env.backend != "zero2"
    )  # ZeRO-2-like: keep gathered parameters from forward to backward
    mesh = data_parallel_mesh(env)
    # Expert shards (expert parallelism) stay out of FSDP2, as out of DDP: `ExpertGradients`
    # reduces them over their replicas.
    experts = {param for param in model.parameters() if is_expert_shard(param)} or None
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard,
                    ignored_params=experts)
    fully_shard(
        model, mesh=mesh, mp_policy=policy, reshard_after_forward=False, ignored_params=experts
    )  # backward needs it next
    register_fsdp_forward_method(
        model, "generate"
    )  # gathers the root's parameters for sampling too
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The model under a DDP wrapper (FSDP2 and TP modify the model in place)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


@contextlib.contextmanager
def gradient_sync(model: nn.Module, sync: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on inner accumulation micro-steps (DDP no_sync / FSDP2)."""
    if is_instance_of_loaded(model, "torch.distributed.fsdp", "FSDPModule"):
        model.set_requires_gradient_sync(sync)
        yield
    elif isinstance(model, DistributedDataParallel) and not sync:
        with model.no_sync():
            yield
    else:
        yield
    experts = getattr(unwrap(model), "expert_gradients", None)
    if sync and experts is not None:  # after the last micro-step's backward, as DDP and FSDP2's
        experts.reduce()
