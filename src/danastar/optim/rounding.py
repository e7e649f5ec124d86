"""Stochastic rounding to bfloat16, and the random bits it takes.

A float32 value x lies between two neighbouring bf16 values lo <= x < hi. Stochastic rounding
writes hi with probability (x - lo) / (hi - lo) and lo otherwise, so the stored value equals x
on average: a long run of small EMA updates (a_k g with a_k -> 0) is not rounded away, as
round-to-nearest would do once a_k g is below half a bf16 step of the moment.

The rounding is written with arithmetic and float<->bf16 conversions only. (The usual form adds
16 random bits to x's bit pattern and truncates; inductor's CPU backend bit-casts through a
scalar loop, which costs more than the rest of an optimizer's update.) With x = lo + t·2⁻¹⁶·(hi
- lo), t an integer in [0, 2¹⁶) (float32 has 16 bits below bf16's last), and a uniform integer
r in [0, 2¹⁶), hi is written when r < t: probability t / 2¹⁶, exactly the fraction. Values in
the subnormal range (below 1.2e-38) are rounded to nearest instead; float64 working values are
first rounded to float32.

The random bits are a counter-based generator: a hash of (seed, tensor, step, element). Its whole
state is the seed, which each param group keeps as ``rounding_seed`` (saved in the optimizer's
``state_dict``), and the step counts, which the state already holds: a resumed run draws the
same bits as an uninterrupted one, on every path (reference, foreach, compiled), with no
generator state to carry and no memory traffic for random numbers. The element is numbered in
the whole tensor, so a shard of a DTensor (FSDP2, tensor parallel) draws what the same elements
draw unsharded.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .dtensors import is_dtensor
from .working import working_dtype

# The per-step scalar that carries the step count into the rounding's random bits, and the
# per-tensor argument that carries the tensor's key (its salt and `shard_layout`).
ROUNDING_STEP = "rounding_step"
ROUNDING_KEY = "rounding_key"

MASK32 = 0xFFFFFFFF
HASH_MULTIPLIER = 0x45D9F3B  # < 2**27, so products of 32-bit values stay exact in int64
GOLDEN = 0x9E3779B1  # 2**32 / golden ratio: spreads consecutive step counts over the key space
BITS = 16
# Factors that move a bf16 value b = m·2^e (1 <= m < 2, ulp u = 2^(e-7)) to its neighbour once
# rounded to nearest: b·NEXT_UP is b + 0.75·m·u, in [0.75u, 1.5u) above b, so it rounds to b + u;
# b·NEXT_DOWN is b - 0.7·m·u, in (0.7u, 1.4u) below b, which rounds to b - u, or (m = 1, where
# the step below is u/2) to b - u/2.
NEXT_UP = 1 + 0.75 * 2**-7
NEXT_DOWN = 1 - 0.7 * 2**-7


def mix32(x):
    """A 32-bit integer hash (xor-shift-multiply), on Python ints or int64 tensors in [0, 2³²)."""
    x = x ^ (x >> 16)
    x = (x * HASH_MULTIPLIER) & MASK32
    x = x ^ (x >> 16)
    x = (x * HASH_MULTIPLIER) & MASK32
    return x ^ (x >> 16)


def tensor_salt(seed: int, group_index: int, position: int) -> int:
    """The key of one tensor's stream: its group's seed, the group and its place in the group."""
    return mix32((mix32((mix32(seed & MASK32) + group_index) & MASK32) + position) & MASK32)


def seed_from_torch() -> int:
    """A group's default seed: derived from the seed torch's default generator started from, so
    runs seeded alike round alike, and no random number is drawn (the run's other random streams
    are left as they were)."""
    return mix32(torch.initial_seed() & MASK32)


def shard_layout(param: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Where a (local shard of a) tensor lies in the whole: the offset of its first element in
    each dimension, and the whole tensor's contiguous strides."""
    shape = tuple(param.shape)
    offsets = (0,) * len(shape)
    if is_dtensor(param):
        from torch.distributed.tensor._utils import (  # noqa: PLC0415  a DTensor exists
            compute_local_shape_and_global_offset,
        )

        _, offsets = compute_local_shape_and_global_offset(shape, param.device_mesh,
                                                           param.placements)
    strides = [1] * len(shape)
    for dim in range(len(shape) - 2, -1, -1):
        strides[dim] = strides[dim + 1] * shape[dim + 1]
    return tuple(offsets), tuple(strides)


def element_index(like: torch.Tensor, layout) -> torch.Tensor:
    """Each element's position in the whole tensor (int64), shaped like ``like`` (the local
    part); ``layout`` from `shard_layout`."""
    offsets, strides = layout
    index = torch.zeros((), dtype=torch.int64, device=like.device)
    for dim, (size, offset, stride) in enumerate(zip(like.shape, offsets, strides)):
        along = torch.arange(offset, offset + size, dtype=torch.int64, device=like.device)
        index = index + along.view([-1 if d == dim else 1 for d in range(like.ndim)]) * stride
    return index.expand(like.shape)


def random_integers(like: torch.Tensor, step, salt: int, count: int,
                    layout) -> list[torch.Tensor]:
    """``count`` tensors shaped like ``like`` of independent uniform integers in [0, 2¹⁶) (held
    as float32), for step ``step`` (a number or a 0-dim tensor) of the tensor keyed ``salt``,
    whose place in the whole tensor is ``layout`` (`shard_layout`)."""
    step = step.to(torch.int64) if torch.is_tensor(step) else int(step)
    key = mix32((step * GOLDEN + salt) & MASK32)
    bits = mix32((element_index(like, layout) + key) & MASK32)
    draws = []
    while True:
        draws += [(bits & 0xFFFF).to(torch.float32), (bits >> BITS).to(torch.float32)]
        if len(draws) >= count:
            return draws[:count]
        bits = mix32((bits + GOLDEN) & MASK32)  # 32 more bits, a function of the first 32


def stochastic_round(x: torch.Tensor, draw: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to bfloat16 up or down with the probabilities that keep its mean; ``draw``
    holds integers in [0, 2¹⁶) from `random_integers`."""
    size = x.float().abs()
    nearest = size.to(torch.bfloat16).float()
    low = torch.where(nearest > size, (nearest * NEXT_DOWN).to(torch.bfloat16).float(), nearest)
    high = (low * NEXT_UP).to(torch.bfloat16).float()
    # size - low and draw·(high - low)·2⁻¹⁶ are exact, so the comparison is r < t (module doc).
    up = size - low > draw * ((high - low) * 2.0**-BITS)
    rounded = torch.where(up, high, low)
    return torch.copysign(rounded, x.float()).to(torch.bfloat16)


def store(target: torch.Tensor, value: torch.Tensor, draw: torch.Tensor | None) -> None:
    """Write a working value into a lower-precision tensor: stochastically rounded when
    ``draw`` is given, else rounded to nearest."""
    target.copy_(value if draw is None else stochastic_round(value, draw))


def rounded(update: Callable, round_params: bool) -> Callable:
    """``update`` with its writes rounded: it runs on working copies in float32 (or wider) and
    every low-precision buffer is stored back stochastically rounded, with random bits keyed by
    (tensor, step, element); a bf16 parameter too when ``round_params``, else rounded to
    nearest. The returned function takes the update's arguments plus ``rounding_step`` (the
    step count) and ``rounding_key`` (the tensor's salt and `shard_layout`)."""
    def rounded_update(param, grad, *buffers, rounding_step, rounding_key, **arguments):
        dtype = working_dtype(param)
        work = param.to(dtype)
        state = [buffer.to(dtype) for buffer in buffers]
        update(work, grad, *state, **arguments)
        writes = [(buffer, value, True) for buffer, value in zip(buffers, state)
                  if value is not buffer]
        if work is not param:
            writes.append((param, work, round_params and param.dtype == torch.bfloat16))
        count = sum(rounds for _, _, rounds in writes)
        salt, layout = rounding_key
        draws = random_integers(param, rounding_step, salt, count, layout) if count else []
        for target, value, rounds in writes:
            store(target, value, draws.pop(0) if rounds else None)

    return rounded_update
