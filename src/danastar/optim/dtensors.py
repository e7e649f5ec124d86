"""Telling a DTensor (FSDP2, tensor parallelism) from a plain tensor without importing
``torch.distributed.tensor``: that import costs about a second (it brings in sympy), and every
process that imports the optimizers would pay it, sharded or not. No DTensor can exist before
its module is imported, so where it is not imported the answer is no."""

from __future__ import annotations

import sys

import torch

DTENSOR_MODULE = "torch.distributed.tensor"


def is_dtensor(tensor: torch.Tensor) -> bool:
    module = sys.modules.get(DTENSOR_MODULE)
    return module is not None and isinstance(tensor, module.DTensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor a rank owns: the local shard of a DTensor (sharing its storage), else itself."""
    return tensor.to_local() if is_dtensor(tensor) else tensor
