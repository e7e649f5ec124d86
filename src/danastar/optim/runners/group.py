"""What every runner does for its param group before the update runs: gather the tensors that
have gradients (kept between steps), advance their step counts, and key their rounding."""

from __future__ import annotations

import torch

from ..dtensors import is_dtensor, local
from ..rounding import shard_layout, tensor_salt


def local_grad(owner: str, param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The gradient laid out like the parameter's local shard (the update is elementwise)."""
    if grad.is_sparse:
        raise RuntimeError(f"{owner} does not support sparse gradients")
    if is_dtensor(grad):
        if grad.placements != param.placements:
            grad = grad.redistribute(param.device_mesh, param.placements)
        return grad.to_local()
    return grad


class Gathered:
    """The tensors of one step: local params, grads, state buffers (one list per name), step
    counts, each tensor's position in the group, and rounding keys (None: plain writes)."""

    __slots__ = ("params", "grads", "buffers", "steps", "positions", "keys")

    def __init__(self, params, grads, buffers, steps, positions, keys=None):
        self.params, self.grads, self.buffers = params, grads, buffers
        self.steps, self.positions, self.keys = steps, positions, keys

    def pick(self, index: list[int]) -> Gathered:
        """The tensors at ``index`` (all of them: self)."""
        if len(index) == len(self.params):
            return self

        def take(items):
            return None if items is None else [items[i] for i in index]
        return Gathered(take(self.params), take(self.grads), [take(b) for b in self.buffers],
                        take(self.steps), take(self.positions), take(self.keys))


class GroupRunner:
    """One param group's step on one path. ``update`` is the optimizer's update function, or
    its rounded wrapper when the group writes low-precision state or rounds bf16 parameters
    (``rounds``); subclasses define `step`.

    The params, buffers and step tensors of a group change only when the group or the state
    does, so they are kept between steps (checked by identity of each parameter's state); only
    the gradients are read anew: the Python work per tensor is a visible part of a GPU step's
    host time.
    """

    def __init__(self, optimizer, group: dict, group_index: int, update, rounds: bool):
        self.optimizer, self.group, self.group_index = optimizer, group, group_index
        self.update, self.rounds = update, rounds
        self.owner = type(optimizer).__name__
        self.kept: tuple | None = None  # (group params, states, Gathered) of the last full step
        self.packed_steps: tuple | None = None  # (packed counts, their views)

    def constants(self) -> dict:
        return {name: self.group[name] for name in self.optimizer.update_constants}

    def gather(self) -> Gathered:
        """The group's tensors that have gradients (a tensor whose grad is None is skipped: its
        step count does not advance)."""
        group, state = self.group, self.optimizer.state
        grads = [param.grad for param in group["params"]]
        kept = self.kept
        if kept is not None and all(grad is not None for grad in grads) and kept[0] is \
                group["params"] and len(kept[1]) == len(grads) and all(
                state.get(param) is saved for param, saved in zip(kept[0], kept[1])):
            gathered = kept[2]
            return Gathered(gathered.params, [local_grad(self.owner, p, g) for p, g in zip(
                kept[0], grads)], gathered.buffers, gathered.steps, gathered.positions,
                gathered.keys)
        params, local_grads, steps, states, positions = [], [], [], [], []
        buffers = [[] for _ in self.optimizer.buffer_names]
        for position, (param, grad) in enumerate(zip(group["params"], grads)):
            if grad is None:
                continue
            param_state = self.optimizer.init_state(param, group)
            states.append(param_state)
            positions.append(position)
            params.append(local(param))
            local_grads.append(local_grad(self.owner, param, grad))
            steps.append(param_state["step"])
            for buffer, name in zip(buffers, self.optimizer.buffer_names):
                buffer.append(local(param_state[name]))
        gathered = Gathered(params, local_grads, buffers, steps, positions,
                            self.rounding_keys(positions))
        if len(params) == len(grads):
            self.kept = (group["params"], states, gathered)
        return gathered

    def rounding_keys(self, positions: list[int]):
        """Each tensor's rounding key: the salt of its stream (group seed, group index,
        position) and where its shard lies in the whole tensor; None for plain writes."""
        if not self.rounds:
            return None
        seed, params = self.group["rounding_seed"], self.group["params"]
        return [(tensor_salt(seed, self.group_index, position), shard_layout(params[position]))
                for position in positions]

    def advance(self, steps: list[torch.Tensor]) -> torch.Tensor:
        """Add one to each step count; returns the packed counts (one float32 tensor).

        The counts stay one 0-dim float32 tensor per parameter (on the CPU, or the parameter's
        device when capturable, as in torch.optim and the saved state), but those of a group are
        views of one tensor, so that advancing them and reading them back are one operation each
        instead of one per tensor.
        """
        packed = self.packed_steps
        if packed is None or len(packed[1]) != len(steps) or any(
                a is not b for a, b in zip(packed[1], steps)):
            packed = self.packed_steps = self.pack_steps(steps)
        packed[0].add_(1)
        return packed[0]

    def pack_steps(self, steps: list[torch.Tensor]) -> tuple:
        flat = torch.stack([step.detach().reshape(()) for step in steps]).to(torch.float32)
        views = list(flat.unbind())
        by_old = {id(old): view for old, view in zip(steps, views)}
        for param in self.group["params"]:
            param_state = self.optimizer.state.get(param)
            view = by_old.get(id(param_state.get("step"))) if param_state else None
            if view is not None:
                param_state["step"] = view
        steps[:] = views  # the caller's list now holds the views
        self.kept = None  # it may hold the replaced step tensors
        return flat, views
