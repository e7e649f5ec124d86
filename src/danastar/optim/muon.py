"""Muon for hidden weight matrices, AdamW for everything else, as one optimizer.

Hidden matrices get Muon (momentum 0.95 with Nesterov, five Newton-Schulz iterations, the update
scaled with ``adjust_lr_fn="match_rms_adamw"`` so one LR serves both): ``torch.optim.Muon``'s
algorithm, extended to stacked matrices (E, out, in) — a mixture of experts' weights — whose E
slices are orthogonalised one by one, as E separate matrices would be. Under FSDP2 and tensor
parallelism each matrix is orthogonalised whole, never shard by shard (`orthogonalise`).
Token embeddings (names ending in ``embed.weight``), the output head (``lm_head.weight``) and all
1-D parameters go to ``torch.optim.AdamW`` with betas (0.8, 0.999). Both use coupled weight
decay; every incoming group keeps its own ``weight_decay``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz

from .dtensors import is_dtensor

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

ADAMW_ONLY_SUFFIXES = ("embed.weight", "lm_head.weight")


def uses_muon(name: str | None, param: torch.Tensor) -> bool:
    """Whether a parameter is a hidden weight matrix or a stack of them (Muon) rather than
    AdamW's."""
    return param.ndim in (2, 3) and not (name is not None and name.endswith(ADAMW_ONLY_SUFFIXES))


def holds_whole_matrices(tensor: DTensor) -> bool:
    """Whether every rank's shard of a DTensor stack (E, out, in) holds whole (out, in) matrices:
    it is split along its first dimension only (as FSDP2 and expert parallelism split experts)."""
    from torch.distributed.tensor import Shard

    return tensor.ndim == 3 and all(
        placement.is_replicate() or (type(placement) is Shard and placement.dim == 0)
        for placement in tensor.placements)


def orthogonalise(update: torch.Tensor, coefficients, steps: int, eps: float) -> torch.Tensor:
    """Newton-Schulz of each (out, in) matrix of ``update`` (a matrix, or a stack of them).

    Newton-Schulz must see whole matrices: orthogonalising each rank's shard of a matrix is a
    different function. A sharded DTensor (FSDP2, TP, both) is therefore gathered whole on
    every rank, orthogonalised there, and each rank keeps its own shard of the result, which
    needs no communication since every rank computed the same matrix. A stack split only along
    its first dimension already holds whole matrices on each rank and is done in place. Plain
    tensors take the path they always took.
    """
    if is_dtensor(update):
        from torch.distributed.tensor import DTensor, distribute_tensor

        mesh, placements = update.device_mesh, update.placements
        if holds_whole_matrices(update):
            local = orthogonalise(update.to_local(), coefficients, steps, eps)
            return DTensor.from_local(local, mesh, placements, shape=update.shape,
                                      stride=update.stride())
        whole = orthogonalise(update.full_tensor(), coefficients, steps, eps)
        return distribute_tensor(whole, mesh, placements, src_data_rank=None)
    if update.numel() == 0:  # a rank's empty shard of a stack
        return update.to(torch.bfloat16)
    matrices = [_zeropower_via_newtonschulz(matrix, coefficients, steps, eps)
                for matrix in update.reshape(-1, *update.shape[-2:])]
    return torch.stack(matrices).view(update.shape)


class StackedMuon(torch.optim.Muon):
    """``torch.optim.Muon`` (same hyperparameters, groups and state) that also takes stacked
    matrices of shape (E, out, in): momentum is elementwise, and the Newton-Schulz
    orthogonalisation and the shape-dependent LR adjustment apply to each (out, in) slice."""

    def __init__(self, params, **kwargs):
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        # torch's constructor refuses anything but 2-D: let it check 2-D stand-ins for stacks
        stand_ins = [{**g, "params": [p[0].detach() if p.ndim == 3 else p for p in g["params"]]}
                     for g in groups]
        super().__init__(stand_ins, **kwargs)
        for group, original in zip(self.param_groups, groups):
            group["params"] = list(original["params"])

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, weight_decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                if is_dtensor(grad) and grad.placements != param.placements:
                    grad = grad.redistribute(param.device_mesh, param.placements)
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(grad)  # sharded as the param
                buffer = state["momentum_buffer"]
                buffer.lerp_(grad, 1 - momentum)
                update = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
                update = orthogonalise(update, group["ns_coefficients"], group["ns_steps"],
                                       group["eps"])
                adjusted_lr = _adjust_lr(lr, group["adjust_lr_fn"], param.shape[-2:])
                param.mul_(1 - lr * weight_decay)
                param.add_(update, alpha=-adjusted_lr)
        return loss


def split_groups(groups: list[dict]) -> tuple[list[dict], list[dict]]:
    """Split each param group into its Muon part and its AdamW part (other keys kept)."""
    muon_groups, adamw_groups = [], []
    for group in groups:
        names = group.get("names") or [None] * len(group["params"])
        parts = {True: ([], []), False: ([], [])}
        for name, param in zip(names, group["params"]):
            params, part_names = parts[uses_muon(name, param)]
            params.append(param)
            part_names.append(name)
        for to_muon, (params, part_names) in parts.items():
            if params:
                part = {**group, "params": params}
                if "names" in group:
                    part["names"] = part_names
                (muon_groups if to_muon else adamw_groups).append(part)
    return muon_groups, adamw_groups


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer over two: its ``param_groups`` are the Muon groups then the AdamW groups
    (the same dicts the inner optimizers read), and its ``state`` is shared with both, so LR
    schedulers, ``state_dict`` and ``load_state_dict`` see a single ordinary optimizer.

    Args:
        params: tensors, ``(name, tensor)`` groups or param-group dicts with a ``"names"`` list;
            the names route embeddings and the head to AdamW (unnamed 2-D tensors go to Muon).
        lr: peak learning rate of both parts (Muon's update is scaled to AdamW's RMS).
        weight_decay: coupled weight decay of both parts (a group's own value wins).
        momentum: Muon's momentum coefficient.
        nesterov: whether Muon uses Nesterov momentum.
        betas: AdamW's (β1, β2).
        eps: AdamW's epsilon.
        ns_steps: Newton-Schulz iterations of Muon's orthogonalisation.
    """

    def __init__(self, params, lr, *, weight_decay=0.0, momentum=0.95, nesterov=True,
                 betas=(0.8, 0.999), eps=1e-8, ns_steps=5):
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        muon_groups, adamw_groups = split_groups(groups)
        self.muon = StackedMuon(
            muon_groups, lr=lr, weight_decay=weight_decay, momentum=momentum,
            nesterov=nesterov, ns_steps=ns_steps, adjust_lr_fn="match_rms_adamw",
        ) if muon_groups else None
        self.adamw = torch.optim.AdamW(
            adamw_groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
        ) if adamw_groups else None
        inner_groups = [g for opt in self._inner() for g in opt.param_groups]
        super().__init__(inner_groups, dict(lr=lr, weight_decay=weight_decay))
        for group in self.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self._share_groups_and_state()

    def _inner(self) -> list[torch.optim.Optimizer]:
        return [opt for opt in (self.muon, self.adamw) if opt is not None]

    def _share_groups_and_state(self) -> None:
        start = 0
        for opt in self._inner():
            count = len(opt.param_groups)
            opt.param_groups = self.param_groups[start:start + count]
            opt.state = self.state
            start += count

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self._inner():
            opt.step()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # replaces the group dicts and the state
        self._share_groups_and_state()

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "muon": self.muon, "adamw": self.adamw}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if "muon" in self.__dict__:
            self._share_groups_and_state()
