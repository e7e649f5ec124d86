"""Flat buffers (``flat=True``): a group's small parameters, their gradients and their state each
kept in one contiguous tensor, so that a step is one update over all of them, whatever their
number.

Without it the step runs the update once per tensor: on a CPU each tensor costs a few
microseconds of dispatch (torch's fused AdamW pays the same), on a GPU a kernel launch or a
slice of one, so that models of many small tensors are bound by the count, not by the bytes.
With it, as apex's fused optimizers and FSDP's flat parameters do:

* each small parameter's ``.data`` (up to ``FLAT_MAX_NUMEL`` elements) becomes a view into one
  flat tensor per group (so the model reads and writes the same memory the update writes), and
  its state buffers (``exp_avg`` ...) views into one flat buffer per name;
  ``optimizer.state[p]`` holds those views, so state_dict, diagnostics and checkpoints see
  per-parameter tensors as before;
* each step copies the small gradients into one flat gradient (a single multi-tensor copy) and
  runs the update once over the flat tensors and the large ones, with the same per-step
  scalars: every element gets the same arithmetic as on the per-tensor path.

Larger tensors keep their own memory: their per-tensor cost is small beside their bytes, and
copying their gradients would cost more than flattening saves (a float32 step moves 28 to 36
bytes per parameter; the copy adds 8).

The layout is built at the first step and rebuilt when it no longer holds: a parameter whose
``.data`` was replaced (``model.to(...)``, a user's assignment), a loaded state dict, a changed
group. (State buffers replaced by hand, other than through ``load_state_dict``, are not
noticed: write into them in place.) A step where some gradient is None, or where the tensors'
step counts differ, runs on the per-tensor path over the same views. Each parameter starts at
a multiple of 16 elements (64 bytes for float32), the padding holding zeros that no parameter
sees.

Only plain tensors of one device and dtype per group flatten (not DTensor shards: FSDP2
already keeps its own flat layout per rank), with float32 (or wider) state: bf16 state keys
its random rounding bits by tensor, so such groups are refused when built.
"""

from __future__ import annotations

import dataclasses

import torch

from .dtensors import is_dtensor

ALIGNMENT = 16  # elements: each parameter starts on a 64-byte boundary (float32)
# The largest tensor that joins the flat buffer. On one CPU core a tensor's dispatch costs about
# as much as updating 10-20 thousand elements (docs/benchmarks.md).
FLAT_MAX_NUMEL = 2**16


@dataclasses.dataclass
class FlatLayout:
    """One group's flat tensors and the per-parameter views into them; the large parameters,
    outside them, step beside them."""

    params: list[torch.Tensor]  # the group's parameters, in the group's order
    states: list[dict]  # each parameter's state dict (a small one's buffers are views)
    small: list[int]  # positions of the flattened parameters
    large: list[int]  # positions of the others
    param: torch.Tensor  # 1-D: every small parameter's values
    grad: torch.Tensor  # 1-D: their gradients, copied in at each step
    grad_views: list[torch.Tensor]  # views of `grad` shaped like each small parameter
    buffers: list[torch.Tensor]  # 1-D: one per state buffer name
    param_pointers: list[int]  # each parameter's data_ptr() when the layout was built

    def __post_init__(self):
        self.small_set = frozenset(self.small)

    def holds(self, group_params: list) -> bool:
        """Whether the layout still describes ``group_params``: the same parameters, each still
        a view of the flat tensor. (A loaded state dict forgets every layout: the optimizer's
        ``__setstate__``.)"""
        return (len(group_params) == len(self.params)
                and all(a is b for a, b in zip(group_params, self.params))
                and [p.data_ptr() for p in self.params] == self.param_pointers)

    def step_lists(self, grads: list[torch.Tensor], buffer_names: tuple[str, ...]):
        """The tensors one update runs over: the flat ones, then the large ones (``grads``: the
        group's gradients in order); the small gradients are copied into the flat one."""
        params, step_grads, buffers = [], [], [[] for _ in buffer_names]
        if self.small:
            torch._foreach_copy_(self.grad_views, [grads[i] for i in self.small])
            params.append(self.param)
            step_grads.append(self.grad)
            for buffer, flat in zip(buffers, self.buffers):
                buffer.append(flat)
        for i in self.large:
            params.append(self.params[i])
            step_grads.append(grads[i])
            for buffer, name in zip(buffers, buffer_names):
                buffer.append(self.states[i][name])
        return params, step_grads, buffers


def check_flattenable(params: list[torch.Tensor], owner: str) -> None:
    """Refuse (ValueError) a group that cannot be laid out flat."""
    if any(is_dtensor(p) for p in params):
        raise ValueError(f"{owner}: flat=True is for plain tensors; a DTensor-sharded model "
                         "(FSDP2) keeps its own layout, so leave flat=False there")
    kinds = {(p.device, p.dtype) for p in params}
    if len(kinds) > 1:
        raise ValueError(f"{owner}: flat=True needs one device and dtype per param group, got "
                         f"{sorted(str(k) for k in kinds)}; put each dtype in a group of its own")


def _aligned(numel: int) -> int:
    return -(-numel // ALIGNMENT) * ALIGNMENT


def build_layout(params: list[torch.Tensor], states: list[dict], buffer_names: tuple[str, ...],
                 owner: str) -> FlatLayout:
    """Lay the small ones of ``params`` (each with its initialised ``state`` dict) out flat: copy
    their values and their state into new flat tensors, and point ``.data`` and the state at
    views of them."""
    check_flattenable(params, owner)
    small = [i for i, p in enumerate(params) if p.numel() <= FLAT_MAX_NUMEL]
    offsets, total = [], 0
    for i in small:
        offsets.append(total)
        total += _aligned(params[i].numel())
    device, dtype = params[0].device, params[0].dtype
    flat_param = torch.zeros(total, device=device, dtype=dtype)
    flat_grad = torch.zeros_like(flat_param)
    flat_buffers = [torch.zeros(total, device=device, dtype=states[0][name].dtype)
                    for name in buffer_names]

    def view(flat, offset, like):
        return flat[offset:offset + like.numel()].view(like.shape)

    grad_views = []
    for i, offset in zip(small, offsets):
        param, state = params[i], states[i]
        values = view(flat_param, offset, param)
        values.copy_(param.detach())
        param.data = values  # the model now reads and writes the flat tensor
        grad_views.append(view(flat_grad, offset, param))
        for name, flat in zip(buffer_names, flat_buffers):
            buffer = view(flat, offset, param)
            buffer.copy_(state[name])
            state[name] = buffer
    return FlatLayout(params=list(params), states=list(states), small=small,
                      large=[i for i in range(len(params)) if i not in set(small)],
                      param=flat_param, grad=flat_grad, grad_views=grad_views,
                      buffers=flat_buffers, param_pointers=[p.data_ptr() for p in params])
