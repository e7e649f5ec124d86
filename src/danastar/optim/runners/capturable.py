"""The capturable runners (``capturable=True``): a CUDA graph can capture the step. The step
counts stay on the parameters' device and are not read back: the scalars are computed there over
the packed vector of counts, and each tensor takes its own column of them."""

from __future__ import annotations

import torch

from ..rounding import ROUNDING_STEP
from .compiled import give_up_compiling, scalar_dtype
from .group import GroupRunner
from .loops import compile_copy, pack_columns, run_per_tensor_columns


class CapturableRunner(GroupRunner):
    """One update over all the group's tensors, whatever their counts, reading nothing on
    the host; the loop as written (the reference path)."""

    def step(self) -> None:
        gathered = self.gather()
        if not gathered.params:
            return
        counts = self.advance(gathered.steps)
        scalars = self.optimizer.device_scalars(self.group, counts)
        if self.rounds:
            scalars[ROUNDING_STEP] = counts
        arguments = (self.update, gathered.params, gathered.grads, gathered.buffers,
                     gathered.keys)
        self.run_columns(arguments, scalars, counts.device)

    def run_columns(self, arguments: tuple, scalars: dict, device: torch.device) -> None:
        packed = pack_columns(scalars, len(arguments[1]), torch.float64, device)
        run_per_tensor_columns(*arguments, packed, tuple(scalars), self.constants())


class CompiledCapturableRunner(CapturableRunner):
    """The capturable loop compiled (the group's own copy); if compiling fails where it was
    not asked for, the loop as written takes over, as for the compiled runner."""

    compiled_loop = None
    failed = False

    def run_columns(self, arguments: tuple, scalars: dict, device: torch.device) -> None:
        packed = pack_columns(scalars, len(arguments[1]),
                              scalar_dtype(self.optimizer, arguments[1]), device)
        call = (*arguments, packed, tuple(scalars), self.constants())
        if self.failed:
            run_per_tensor_columns(*call)
            return
        if self.compiled_loop is None:
            self.compiled_loop = compile_copy(run_per_tensor_columns)
        try:
            self.compiled_loop(*call)
        except Exception as error:  # compilation failed (no compiler, unsupported platform)
            give_up_compiling(self, error)
            run_per_tensor_columns(*call)
            return
        self.optimizer.compiled_once = True
