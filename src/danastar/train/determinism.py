"""Make a process's first CPU computations round like its later ones.

Bitwise resume compares two processes with different histories: the uninterrupted run's step
k+1 is far from its first forward pass, the resumed run's step k+1 is its first. On some CPUs
the first vectorised `exp` of a fresh process with two or more threads was seen to round
differently (the first `torch.logsumexp` over 2048 × 4096 float32 logits gave three different
results over eight fresh processes; after one parallel `exp` over a large tensor, or with one
thread, all eight agreed), which made a resumed run drift from the uninterrupted one by about
1e-5 at its first step. One parallel `exp` at start-up, in every process, gives every run the
same history before its first forward pass, at the cost of about a millisecond.
"""

from __future__ import annotations

import torch

WARM_UP_ELEMENTS = 1 << 20  # large enough to be split over every intra-op thread


def warm_up_cpu_math(device: torch.device) -> None:
    """Run the vectorised `exp` and `logsumexp` once on every intra-op thread (CPU only)."""
    if device.type != "cpu":
        return
    values = torch.linspace(-20.0, 20.0, WARM_UP_ELEMENTS)
    torch.exp(values)
    torch.logsumexp(values.view(256, -1), dim=-1)
