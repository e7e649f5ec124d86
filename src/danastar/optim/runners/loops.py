"""The loops every runner is made of: one update per tensor, with the per-step scalars as
numbers, packed in one tensor (what the compiled runner compiles), or one column per tensor
(capturable); and the compiled copies of those loops.

``keys`` is None for plain writes, else one rounding key per tensor (module rounding): the
update is then `rounding.rounded`'s wrapper, which takes it as ``rounding_key``.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch

from ..rounding import ROUNDING_KEY


def run_per_tensor(update, params, grads, buffers, keys, scalars, constants):
    """Apply ``update`` to each tensor of the lists (``buffers``: one list per state buffer)."""
    for i, (param, grad) in enumerate(zip(params, grads)):
        key = {} if keys is None else {ROUNDING_KEY: keys[i]}
        update(param, grad, *[buffer[i] for buffer in buffers], **scalars, **constants, **key)


def run_per_tensor_packed(update, params, grads, buffers, keys, packed, names, constants):
    """`run_per_tensor` with the per-step scalars packed in one 1-D tensor (``names`` says which
    is which): the function the compiled runner compiles. One tensor moves to the device per
    step (asynchronously, from pinned memory) instead of one blocking copy per scalar."""
    scalars = {name: packed[i] for i, name in enumerate(names)}
    run_per_tensor(update, params, grads, buffers, keys, scalars, constants)


def run_per_tensor_columns(update, params, grads, buffers, keys, packed, names, constants):
    """`run_per_tensor` with each tensor's own scalars: tensor i takes column i of ``packed``
    (2-D, one row per name of ``names``), so that tensors at different step counts share one
    call without the counts being read on the host (the capturable runner)."""
    rows = [row.unbind() for row in packed.unbind()]  # one op per name, not per name and tensor
    for i, (param, grad) in enumerate(zip(params, grads)):
        key = {} if keys is None else {ROUNDING_KEY: keys[i]}
        scalars = {name: row[i] for row, name in zip(rows, names)}
        update(param, grad, *[buffer[i] for buffer in buffers], **scalars, **constants, **key)


def pack_scalars(values: list[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The per-step scalars as one tensor on ``device``; on a GPU copied from pinned memory
    without blocking the host (the caching host allocator keeps the source alive until the copy
    is done)."""
    packed = torch.tensor(values, dtype=dtype)
    if device.type == "cpu":
        return packed
    if device.type == "cuda":
        packed = packed.pin_memory()
    return packed.to(device, non_blocking=True)


def pack_columns(scalars: dict, count: int, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """The capturable scalars (per-count vectors, 0-dim tensors, numbers) as one 2-D tensor on
    ``device`` for `run_per_tensor_columns`; numbers are filled in on the device (a constant
    of a captured graph), never copied from the host."""
    rows = [value.to(dtype).expand(count) if torch.is_tensor(value)
            else torch.full((count,), value, dtype=dtype, device=device)
            for value in scalars.values()]
    return torch.stack(rows)


def compiled_available() -> bool:
    """Whether torch.compile can run here (dynamo is unsupported on some Pythons/platforms)."""
    try:
        from torch._dynamo.eval_frame import is_dynamo_supported  # noqa: PLC0415  absent on some builds
    except ImportError:
        return False
    return is_dynamo_supported()


def compile_copy(loop: Callable) -> Callable:
    """A compiled copy of ``loop`` with a code object of its own.

    Dynamo keeps its cache, and its recompile limit, per code object; one copy per runner keeps
    groups of different shapes (and other optimizers) from evicting each other. Dynamo's
    guards already check every input's size and stride, so inductor's own per-call size asserts
    (one per tensor, a measurable part of a step's host time) are left out. Casts to bf16 are
    kept as written (``emulate_precision_casts``): inductor otherwise drops a round trip
    float32 -> bf16 -> float32, which the stochastic rounding relies on.
    """
    code = loop.__code__.replace()  # an equal but distinct code object
    copy = types.FunctionType(code, loop.__globals__, loop.__name__)
    return torch.compile(copy, fullgraph=True, dynamic=False,
                         options={"size_asserts": False, "emulate_precision_casts": True})
