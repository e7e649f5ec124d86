"""The paths an update runs on (module base): the reference loop over a group's tensors, its
compiled copies, the capturable variant with a column of scalars per tensor, and the
low-precision writes (stochastic rounding into bf16 state)."""

from __future__ import annotations

import types
from collections.abc import Callable

import torch

from .rounding import random_integers, store

# The per-step scalar that carries the step count into the rounding's random bits.
ROUNDING_STEP = "rounding_step"


def working_dtype(param: torch.Tensor) -> torch.dtype:
    """The dtype an update computes in: at least float32 (bf16/fp16 parameters and bf16 state
    are widened to it)."""
    return torch.promote_types(param.dtype, torch.float32)


def run_per_tensor(update, params, grads, buffers, scalars, constants, rounding=None):
    """Apply ``update`` to each tensor: the reference path. ``rounding``: None, or
    ``(salts, layouts, round_params)`` (one salt and `shard_layout` per tensor) for
    `rounded_update`."""
    for i, (param, grad) in enumerate(zip(params, grads)):
        update_one(update, i, param, grad, buffers, scalars, constants, rounding)


def update_one(update, i, param, grad, buffers, scalars, constants, rounding):
    """``update`` on tensor ``i`` of the lists (rounded when ``rounding`` is given)."""
    tensor_buffers = [buffer[i] for buffer in buffers]
    if rounding is None:
        update(param, grad, *tensor_buffers, **scalars, **constants)
    else:
        rounded_update(update, param, grad, tensor_buffers, scalars, constants,
                       (rounding[0][i], rounding[1][i]), rounding[2])


def run_per_tensor_columns(update, params, grads, buffers, packed, names, constants,
                           rounding=None):
    """`run_per_tensor` with each tensor's own scalars: tensor i takes column i of ``packed``
    (2-D, one row per name of ``names``), so that tensors at different step counts share one
    call without the counts being read on the host. The capturable paths: the reference one
    runs it as it is, the compiled one compiles it."""
    rows = [row.unbind() for row in packed.unbind()]  # one op per name, not per name and tensor
    for i, (param, grad) in enumerate(zip(params, grads)):
        scalars = {name: row[i] for row, name in zip(rows, names)}
        update_one(update, i, param, grad, buffers, scalars, constants, rounding)


def pack_columns(scalars: dict, count: int, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """The capturable scalars (per-count vectors, 0-dim tensors, numbers) as one 2-D tensor on
    ``device`` for `run_per_tensor_columns`; numbers are filled in on the device (a constant
    of a captured graph), never copied from the host."""
    rows = [value.to(dtype).expand(count) if torch.is_tensor(value)
            else torch.full((count,), value, dtype=dtype, device=device)
            for value in scalars.values()]
    return torch.stack(rows)


def without_step(scalars: dict) -> tuple:
    """The step count for the rounding's random bits, and the scalars the update takes."""
    return scalars[ROUNDING_STEP], {n: v for n, v in scalars.items() if n != ROUNDING_STEP}


def working_state(param, buffers):
    """The parameter and buffers in the working dtype: themselves where they have it (updated
    in place), else widened copies."""
    dtype = working_dtype(param)
    return param.to(dtype), [buffer.to(dtype) for buffer in buffers]


def store_rounded(param, buffers, work, state, step, key, round_params):
    """Write the updated working copies back: low-precision buffers stochastically rounded, a
    low-precision parameter too when ``round_params``, else rounded to nearest."""
    writes = [(buffer, value, True) for buffer, value in zip(buffers, state) if value is not buffer]
    if work is not param:
        writes.append((param, work, round_params and param.dtype == torch.bfloat16))
    count = sum(rounds for _, _, rounds in writes)
    draws = random_integers(param, step, key[0], count, key[1]) if count else []
    for target, value, rounds in writes:
        store(target, value, draws.pop(0) if rounds else None)


def rounded_update(update, param, grad, buffers, scalars, constants, key, round_params):
    """``update`` on working copies in float32 (or wider), then `store_rounded`: every buffer
    write is stochastically rounded with random bits keyed by (tensor, step, element);
    ``key``: the tensor's salt and `shard_layout`."""
    step, scalars = without_step(scalars)
    work, state = working_state(param, buffers)
    update(work, grad, *state, **scalars, **constants)
    store_rounded(param, buffers, work, state, step, key, round_params)


def run_foreach_rounded(foreach_update, params, grads, buffers, scalars, constants, rounding):
    """The foreach path for low-precision state: the multi-tensor update on working copies,
    then each tensor stored back as `rounded_update` does."""
    step, scalars = without_step(scalars)
    pairs = [working_state(param, [buffer[i] for buffer in buffers])
             for i, param in enumerate(params)]
    work = [pair[0] for pair in pairs]
    state = [[pair[1][b] for pair in pairs] for b in range(len(buffers))]
    foreach_update(work, grads, *state, **scalars, **constants)
    for i, param in enumerate(params):
        store_rounded(param, [buffer[i] for buffer in buffers], work[i],
                      [values[i] for values in state], step, (rounding[0][i], rounding[1][i]),
                      rounding[2])


def run_per_tensor_packed(update, params, grads, buffers, packed, names, constants,
                          rounding=None):
    """`run_per_tensor` with the per-step scalars packed in one 1-D tensor (``names`` says which
    is which): the function the compiled path compiles. One tensor moves to the device per step
    (asynchronously, from pinned memory) instead of one blocking copy per scalar."""
    scalars = {name: packed[i] for i, name in enumerate(names)}
    run_per_tensor(update, params, grads, buffers, scalars, constants, rounding)


def compiled_available() -> bool:
    """Whether torch.compile can run here (dynamo is unsupported on some Pythons/platforms)."""
    try:
        from torch._dynamo.eval_frame import is_dynamo_supported
    except ImportError:
        return False
    return is_dynamo_supported()


def compile_per_tensor_runner() -> Callable:
    """A compiled copy of `run_per_tensor_packed` with a code object of its own (`compile_copy`)."""
    return compile_copy(run_per_tensor_packed)


def compile_columns_runner() -> Callable:
    """A compiled copy of `run_per_tensor_columns`, for capturable groups (`compile_copy`)."""
    return compile_copy(run_per_tensor_columns)


def compile_copy(runner: Callable) -> Callable:
    """A compiled copy of ``runner`` with a code object of its own.

    Dynamo keeps its cache, and its recompile limit, per code object; one copy per optimizer
    keeps optimizers (and their groups of different shapes) from evicting each other. Dynamo's
    guards already check every input's size and stride, so inductor's own per-call size asserts
    (one per tensor, a measurable part of a step's host time) are left out. Casts to bf16 are
    kept as written (``emulate_precision_casts``): inductor otherwise drops a round trip
    float32 -> bf16 -> float32, which the stochastic rounding relies on.
    """
    code = runner.__code__.replace()  # an equal but distinct code object
    copy = types.FunctionType(code, runner.__globals__, runner.__name__)
    return torch.compile(copy, fullgraph=True, dynamic=False,
                         options={"size_asserts": False, "emulate_precision_casts": True})


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


# -- copy-in / copy-out: the update runs in the state's dtype (float32 for bf16 parameters) -----

def working_copy(param: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """The parameter itself when it has the state's dtype, else a copy in that dtype."""
    return param if param.dtype == buffer.dtype else param.to(buffer.dtype)


def write_back(param: torch.Tensor, work: torch.Tensor) -> None:
    """Store an updated working copy into a low-precision parameter (nothing to do otherwise)."""
    if work is not param:
        param.copy_(work)


def working_copies(params, grads, buffers):
    """`working_copy` over lists, with the gradients in the state's dtype too."""
    work = [working_copy(p, b) for p, b in zip(params, buffers)]
    grads = [g.to(b.dtype) for g, b in zip(grads, buffers)]
    return work, grads


def finish_foreach(params, work, decay):
    """Apply the weight-decay multiplier, then `write_back` every working copy."""
    if decay != 1:
        torch._foreach_mul_(work, decay)
    for param, updated in zip(params, work):
        write_back(param, updated)
