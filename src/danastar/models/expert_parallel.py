"""Expert parallelism: the routed experts of each MoE layer are split over the ranks of an `ep`
process group, and the rows routed to an expert held elsewhere travel there and back through a
differentiable all-to-all.

Rank r of a group of W holds experts [r·R/W, (r+1)·R/W) of the R routed experts, as the rows of
its DTensor shard (`Shard(0)` on the `ep` mesh) of each stacked (R, out, in) parameter. The
router, shared experts and every other weight stay whole on every rank; routing (and the routing
weights, applied by the layer) stays on the rank that owns the token, so the router's loss and
gradients are those of one process. `ExpertParallel` is the layer's `dispatcher`:

1. the per-expert row counts go through `all_to_all_single` (each rank learns how many rows it
   receives from each source for each of its experts: the splits of the exchange);
2. the rows, sorted by global expert id and so already grouped by destination, go through
   `all_to_all_single_autograd` (its backward is the reverse exchange of the gradients);
3. the received rows are regrouped by local expert and run through the local experts;
4. the outputs go back the same way, in the order they came.

Dropless by default. With a capacity factor cf > 0 a source sends at most C = ⌊cf·M/W⌋ + 1 rows
to each destination (M = N·k rows of N tokens: the release's buffer), keeping the first pairs in
token order; the others are dropped (their output is zero) and counted.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor
from torch.distributed.tensor import DTensor, Shard

from danastar.models.moe import eager_only


class ExpertParallel:
    """The dispatcher of a MoE layer whose routed experts are sharded over `group`.

    Called as `dispatcher(x_sorted, counts, experts, token_order=None)`: `x_sorted` (M, d) the
    local rows sorted by global expert id, `counts` (R,) int64 rows per global expert, `experts`
    the layer's `Experts` (this rank's slice of them), `token_order` (M,) optional: the rank of
    each row in the flattened (token, slot) order, which decides which pairs a capacity drops
    (without it, the first rows in expert order are kept). Returns (out (M, d) in the order of
    `x_sorted`, dropped pairs as an int); dropped rows come back as zeros.
    """

    def __init__(self, group: dist.ProcessGroup, capacity_factor: float = 0.0):
        self.group = group
        self.world = dist.get_world_size(group)
        self.capacity_factor = capacity_factor

    @eager_only  # data-dependent splits and eager collectives: run outside graphs
    def __call__(self, x_sorted: torch.Tensor, counts: torch.Tensor, experts: nn.Module,
                 token_order: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
        world, rows = self.world, x_sorted.shape[0]
        num_experts = counts.numel()
        if num_experts % world:
            raise ValueError(f"{num_experts} routed experts do not split over {world} ranks")
        per_rank = num_experts // world
        counts = counts.to(torch.int64)

        kept = None  # None: every row is sent
        if self.capacity_factor > 0:
            kept = self._within_capacity(counts, rows, token_order)
            expert_of_row = torch.repeat_interleave(
                torch.arange(num_experts, device=counts.device), counts)
            counts = torch.bincount(expert_of_row[kept], minlength=num_experts)
            x_sorted_kept = x_sorted[kept]
        else:
            x_sorted_kept = x_sorted

        # (source, local expert) counts this rank receives: the splits of the row exchange.
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts.contiguous(), group=self.group)
        send_splits = counts.view(world, per_rank).sum(1)
        receive_splits = received.view(world, per_rank).sum(1)
        # One copy to the host for every split (the exchange needs them as Python ints).
        host = torch.cat([send_splits, receive_splits]).tolist()
        send_splits, receive_splits = host[:world], host[world:]

        # Waited for here (differentiably): a plain tensor, not a pending collective, leaves.
        arrived = wait_tensor(all_to_all_single_autograd(x_sorted_kept, receive_splits,
                                                         send_splits, self.group))
        # Arrived rows are ordered by source, then local expert: regroup them by local expert
        # (stable, so each expert's rows keep their source order), run, and restore the order.
        local_expert = torch.arange(per_rank, device=counts.device).repeat(world)
        local_expert_of_row = torch.repeat_interleave(local_expert, received)
        by_expert = torch.argsort(local_expert_of_row, stable=True)
        local_counts = received.view(world, per_rank).sum(0)
        out_by_expert = run_local_experts(experts, arrived[by_expert], local_counts)
        out_arrived = out_by_expert[torch.argsort(by_expert)]

        returned = wait_tensor(all_to_all_single_autograd(out_arrived, send_splits,
                                                          receive_splits, self.group))
        if kept is None:
            return returned, 0
        out = returned.new_zeros((rows, returned.shape[1]))
        out = out.index_copy(0, kept.nonzero().squeeze(1), returned)
        return out, rows - sum(send_splits)

    def _within_capacity(self, counts: torch.Tensor, rows: int,
                         token_order: torch.Tensor | None) -> torch.Tensor:
        """Which rows fit in the release's per-destination buffer of C = ⌊cf·M/W⌋ + 1 rows,
        the first pairs in token order kept (a boolean mask over the sorted rows)."""
        capacity = int(self.capacity_factor * rows / self.world) + 1
        per_rank = counts.numel() // self.world
        device = counts.device
        destination = torch.repeat_interleave(
            torch.arange(counts.numel(), device=device) // per_rank, counts)
        if token_order is None:
            token_order = torch.arange(rows, device=device)
        # Rows sorted by (destination, token order); each one's rank within its destination.
        order = torch.argsort(destination * (rows + 1) + token_order.to(torch.int64))
        per_destination = counts.view(self.world, per_rank).sum(1)
        starts = per_destination.cumsum(0) - per_destination
        rank_within = torch.arange(rows, device=device) - starts[destination[order]]
        kept = torch.zeros(rows, dtype=torch.bool, device=device)
        kept[order] = rank_within < capacity
        return kept


def run_local_experts(experts: nn.Module, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """`experts(x, counts)` on this rank's slices of the stacked weights: a DTensor parameter
    is swapped for its local shard (a differentiable view, whose gradient lands in the DTensor's
    gradient as the same shard), so the experts' own code runs on plain tensors."""
    params = dict(experts.named_parameters())
    if not any(isinstance(p, DTensor) for p in params.values()):
        return experts(x, counts)
    local = {name: p.to_local() if isinstance(p, DTensor) else p for name, p in params.items()}
    return torch.func.functional_call(experts, local, (x, counts))


def is_moe_layer(module: nn.Module) -> bool:
    return hasattr(module, "dispatcher") and hasattr(module, "experts")


def apply_expert_parallel(model: nn.Module, ep_mesh, capacity_factor: float = 0.0) -> list[str]:
    """Shard every MoE layer's routed experts over the 1-D device mesh `ep_mesh` in place and set
    the layers' dispatchers; returns the names of the sharded parameters.

    Every rank builds the whole model from the same seed, so slicing its own rows keeps the
    initialisation of a single process: a run with expert parallelism starts where one without
    it starts. Each parameter becomes a DTensor `Shard(0)` on `ep_mesh`: gradient norms,
    optimizers and distributed checkpoints then see the experts whole.
    """
    world, rank = ep_mesh.size(), ep_mesh.get_local_rank()
    dispatcher = ExpertParallel(ep_mesh.get_group(), capacity_factor)
    names = []
    for path, module in model.named_modules():
        if not is_moe_layer(module) or module.dispatcher is not None:
            continue
        for name, param in list(module.experts.named_parameters(recurse=False)):
            if param.shape[0] % world:
                raise ValueError(f"{param.shape[0]} routed experts do not split over {world} "
                                 f"expert-parallel ranks; choose an ep_size that divides it")
            rows = param.shape[0] // world
            shard = param.detach()[rank * rows:(rank + 1) * rows].clone()
            sharded = DTensor.from_local(shard, ep_mesh, [Shard(0)], run_check=False)
            setattr(module.experts, name, nn.Parameter(sharded, requires_grad=param.requires_grad))
            names.append(f"{path}.experts.{name}")
        module.dispatcher = dispatcher
    return names
