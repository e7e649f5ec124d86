"""The compiled runner: the reference loop handed to ``torch.compile`` as one function over the
group's tensor lists, every per-step scalar passed in one packed tensor, so that changing the
LR or advancing the step never recompiles and the kernel does no scalar math per element."""

from __future__ import annotations

import warnings

import torch

from .group import Gathered
from .loops import compile_copy, pack_scalars, run_per_tensor_packed
from .reference import ReferenceRunner


def scalar_dtype(optimizer, params: list[torch.Tensor]) -> torch.dtype:
    """The compiled kernel's scalars: float32 where the optimizer allows it
    (``float32_scalars``) and the group holds no float64 tensor, else float64."""
    wide = not optimizer.float32_scalars or any(p.dtype == torch.float64 for p in params)
    return torch.float64 if wide else torch.float32


class CompiledRunner(ReferenceRunner):
    """The group's own compiled copy of the loop (compiled at its first step, and once more
    per pattern of None grads). If compiling fails and ``compiled`` was not asked for, it warns,
    finishes the step on the reference loop and has the optimizer pick every group's runner
    again without compiling."""

    compiled_loop = None
    failed = False

    def run_bucket(self, tensors: Gathered, scalars: dict, constants: dict) -> None:
        if self.failed:
            super().run_bucket(tensors, scalars, constants)
            return
        names = tuple(scalars)
        packed = pack_scalars([scalars[name] for name in names],
                              scalar_dtype(self.optimizer, tensors.params),
                              tensors.params[0].device)
        if self.compiled_loop is None:
            self.compiled_loop = compile_copy(run_per_tensor_packed)
        try:
            self.compiled_loop(self.update, tensors.params, tensors.grads, tensors.buffers,
                               tensors.keys, packed, names, constants)
        except Exception as error:  # compilation failed (no compiler, unsupported platform)
            give_up_compiling(self, error)
            super().run_bucket(tensors, scalars, constants)
            return
        self.optimizer.compiled_once = True


def give_up_compiling(runner, error: Exception) -> None:
    """After a failed compile: raise ``error`` where compiling was asked for or has worked
    before; else warn, and have the optimizer stop compiling (this runner finishes its step
    uncompiled)."""
    optimizer = runner.optimizer
    if optimizer.impl == "compiled" or optimizer.compiled_once:
        raise error
    warnings.warn(f"{runner.owner}: torch.compile failed ({error}); using the non-compiled "
                  "path", stacklevel=6)
    runner.failed = True
    optimizer.stop_compiling()
