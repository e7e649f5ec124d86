"""What the training engine applies to a model for memory and parallelism: activation
checkpointing of blocks and the tensor-parallel plan of its projections."""

from __future__ import annotations

import re

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

WRAPPED = "._checkpoint_wrapped_module"  # the path segment checkpoint_wrapper inserts


def apply_activation_checkpointing(model: nn.Module, every_n: int = 1) -> nn.Module:
    """Wrap every ``every_n``-th block (0, n, 2n, ...) so its activations are recomputed in
    backward instead of stored. Modifies ``model.blocks`` in place and returns the model."""
    if every_n < 1:
        raise ValueError(f"every_n must be >= 1, got {every_n}")
    for i, block in enumerate(model.blocks):
        if i % every_n == 0:
            model.blocks[i] = checkpoint_wrapper(block)
    return model


def tensor_parallel_plan(model: nn.Module, tp_size: int | None = None) -> dict[str, ParallelStyle]:
    """Module path → ColwiseParallel / RowwiseParallel for ``parallelize_module`` on a 1-D mesh.

    Input projections are split by output features (whole heads, whole MLP columns per rank),
    output projections by input features, so each block needs one all-reduce per sublayer.
    The attention reads its local head count from the projection's output size at run time.
    The per-head q/k norms take their input as sharded along heads. Embedding, the other norms
    and the head stay replicated. With ``tp_size``, checks that heads and MLP
    hidden units split evenly (ValueError if not).
    """
    config = model.config
    if tp_size is not None:
        for name, size in (("n_head", config.n_head), ("mlp_hidden", config.mlp_hidden)):
            if size % tp_size:
                raise ValueError(f"{name}={size} does not split evenly over {tp_size} "
                                 "tensor-parallel ranks; choose a tensor-parallel size that "
                                 "divides it")
    plan: dict[str, ParallelStyle] = {}
    for path, _ in model.named_modules():
        # match inside blocks whether or not activation checkpointing wrapped them already
        within_block = re.fullmatch(r"blocks\.\d+\.(.+)", path.replace(WRAPPED, ""))
        if within_block and within_block[1] in model.tp_colwise:
            plan[path] = ColwiseParallel()
        elif within_block and within_block[1] in model.tp_rowwise:
            plan[path] = RowwiseParallel()
        elif within_block and within_block[1] in model.tp_per_head_norms:
            # the q/k norms see only local heads: their weight becomes a replicated DTensor and
            # their input one sharded along heads (dim 2), so its gradient is summed over ranks
            plan[path] = SequenceParallel(sequence_dim=2, use_local_output=True)
    return plan


def apply_tensor_parallel(model: nn.Module, tp_mesh) -> nn.Module:
    """Shard ``model``'s block projections over the 1-D device mesh ``tp_mesh`` in place."""
    return parallelize_module(model, tp_mesh, tensor_parallel_plan(model, tp_mesh.size()))
