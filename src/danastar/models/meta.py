"""A model built on the meta device: its shapes and parameter groups, with no memory and no
values (a plan's parameter count, a dry run's optimizer, a checkpoint's template)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from danastar.models import build_model


@contextlib.contextmanager
def _normal_skipped_on_meta() -> Iterator[None]:
    """`torch.nn.init.normal_` leaves meta tensors alone while a meta model is built. Under
    `torch.device("meta")` it runs torch's reference implementation, whose decorator imports
    torch's compiler (torch._dynamo): two seconds at the start of every command that plans a
    run, for values a meta tensor does not hold."""
    normal = nn.init.normal_

    def normal_unless_meta(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return tensor if tensor.is_meta else normal(tensor, *args, **kwargs)

    nn.init.normal_ = normal_unless_meta
    try:
        yield
    finally:
        nn.init.normal_ = normal


def build_meta_model(config) -> nn.Module:
    """`build_model(config)` on the meta device."""
    with torch.device("meta"), _normal_skipped_on_meta():
        return build_model(config)
