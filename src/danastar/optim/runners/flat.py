"""The flat runners (``flat=True``): the group's small parameters, gradients and state each in
one flat tensor (module ``danastar.optim.flat``), so that a step is one update over all of them
and the large ones, on the reference loop or compiled."""

from __future__ import annotations

import torch

from ..flat import FlatLayout, build_layout
from .compiled import CompiledRunner
from .group import Gathered, local_grad
from .reference import ReferenceRunner


class FlatRunner(ReferenceRunner):
    """One update over the flat tensors and the large ones. A step where some gradient is None,
    or where the tensors' step counts differ, runs per tensor over the same views."""

    layout: FlatLayout | None = None
    layout_steps: tuple | None = None  # the packed counts the layout advanced last

    @staticmethod
    def check(owner: str, group: dict) -> None:
        """Refuse low-precision state or stochastic rounding, whose random bits are keyed by
        tensor."""
        if group["state_dtype"] != torch.float32 or group["stochastic_rounding"]:
            raise ValueError(f"{owner}: flat=True keeps float32 state without stochastic "
                             "rounding; drop flat=True, or state_dtype/stochastic_rounding, for "
                             "this group")

    def step(self) -> None:
        params = self.group["params"]
        grads = [param.grad for param in params]
        if not grads or any(grad is None for grad in grads):
            super().step()
            return
        layout = self.layout
        if layout is None or not layout.holds(params):
            states = [self.optimizer.init_state(param, self.group) for param in params]
            layout = self.layout = build_layout(params, states, self.optimizer.buffer_names,
                                                self.owner)
            self.kept = self.layout_steps = None  # they held the replaced state buffers
        counts = self.advance_layout(layout)
        if any(count != counts[0] for count in counts):
            self.run(self.gather(), counts)
            return
        if layout.large:
            grads = [grads[i] if i in layout.small_set else local_grad(self.owner, p, grads[i])
                     for i, p in enumerate(layout.params)]
        flat_params, flat_grads, buffers = layout.step_lists(grads, self.optimizer.buffer_names)
        self.run(Gathered(flat_params, flat_grads, buffers, None, None),
                 counts[:1] * len(flat_params))

    def advance_layout(self, layout: FlatLayout) -> list[float]:
        """`advance` over the layout's step counts, without gathering and comparing them again
        while the packed counts are the ones this layout advanced last (a per-tensor step, after
        a None grad, packs them anew)."""
        packed = self.packed_steps
        if packed is not None and packed is self.layout_steps:
            packed[0].add_(1)
            return packed[0].tolist()
        counts = self.advance([state["step"] for state in layout.states]).tolist()
        self.layout_steps = self.packed_steps
        return counts


class FlatCompiledRunner(FlatRunner, CompiledRunner):
    """`FlatRunner` with the update compiled (`CompiledRunner.run_bucket`)."""
