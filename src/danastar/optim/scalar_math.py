"""Arithmetic for the per-step scalars that takes numbers (the host path, Python floats in
float64) and tensors alike (the capturable path, step counts on the device), with the same
rounding either way, so that one ``*_scalars`` function serves both."""

from __future__ import annotations

import math

import torch


def divide(numerator, denominator):
    """numerator / denominator rounded once: Python's ``number / tensor`` multiplies by the
    tensor's reciprocal (two roundings), which would make the capturable scalars differ from
    the host's."""
    if torch.is_tensor(denominator) and not torch.is_tensor(numerator):
        numerator = torch.full_like(denominator, numerator)
    return numerator / denominator


def sqrt(value):
    """The square root of a number (math.sqrt) or of a tensor."""
    return value.sqrt() if torch.is_tensor(value) else math.sqrt(value)


def minimum(value, bound: float):
    """min(value, bound) of a number, or of each element of a tensor (no host read)."""
    return value.clamp(max=bound) if torch.is_tensor(value) else min(value, bound)
