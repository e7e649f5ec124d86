"""The reference runner: a plain Python loop over the group's tensors, the per-step scalars
Python floats computed on the host in float64 (any dtype, float64 included)."""

from __future__ import annotations

from ..rounding import ROUNDING_STEP
from .group import Gathered, GroupRunner
from .loops import run_per_tensor


class ReferenceRunner(GroupRunner):
    """The update once per tensor. Step counts are per tensor (a tensor whose grad was None
    did not advance); tensors at different counts run as one bucket per count."""

    def step(self) -> None:
        gathered = self.gather()
        if gathered.params:
            self.run(gathered, self.advance(gathered.steps).tolist())

    def run(self, gathered: Gathered, counts: list[float]) -> None:
        """Update the ``gathered`` tensors, whose step counts (advanced already) are
        ``counts``."""
        constants = self.constants()
        buckets: dict[float, list[int]] = {}
        for i, count in enumerate(counts):
            buckets.setdefault(count, []).append(i)
        for count, index in buckets.items():
            scalars = self.optimizer.scalars_for(self.group, count)
            if self.rounds:
                scalars[ROUNDING_STEP] = count
            self.run_bucket(gathered.pick(index), scalars, constants)

    def run_bucket(self, tensors: Gathered, scalars: dict, constants: dict) -> None:
        run_per_tensor(self.update, tensors.params, tensors.grads, tensors.buffers,
                       tensors.keys, scalars, constants)
