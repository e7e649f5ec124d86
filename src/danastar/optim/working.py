"""The dtype an update computes in, and the copies in and out of it: every update works in
float32 or wider, whatever the parameter's dtype (bf16 parameters keep float32 moments)."""

from __future__ import annotations

import torch


def working_dtype(param: torch.Tensor) -> torch.dtype:
    """The dtype an update computes in: at least float32 (bf16/fp16 parameters and bf16 state
    are widened to it)."""
    return torch.promote_types(param.dtype, torch.float32)


def working_copy(param: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """The parameter itself when it has the state's dtype, else a copy in that dtype."""
    return param if param.dtype == buffer.dtype else param.to(buffer.dtype)


def write_back(param: torch.Tensor, work: torch.Tensor) -> None:
    """Store an updated working copy into a low-precision parameter (nothing to do otherwise)."""
    if work is not param:
        param.copy_(work)
