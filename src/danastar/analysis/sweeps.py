"""Selecting points from an LR sweep at one size (shared by the LR law and LR sensitivity)."""

from __future__ import annotations

from collections.abc import Sequence

MERGE_TOLERANCE = 0.05  # LRs within 5% of each other are one point


def merge_close_lrs(points: Sequence[tuple[float, float]],
                    tolerance: float = MERGE_TOLERANCE) -> list[tuple[float, float]]:
    """(lr, loss) points with LRs within ``tolerance`` (relative) merged, keeping the lower
    loss; sorted by LR."""
    merged: list[tuple[float, float]] = []
    for lr, loss in sorted(points):
        if merged and lr <= merged[-1][0] * (1 + tolerance):
            if loss < merged[-1][1]:
                merged[-1] = (lr, loss)
            continue
        merged.append((lr, loss))
    return merged
