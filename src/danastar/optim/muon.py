"""Muon for hidden weight matrices, AdamW for everything else, as one optimizer.

Hidden matrices get Muon (momentum 0.95 with Nesterov, five Newton-Schulz iterations, the update
scaled with ``adjust_lr_fn="match_rms_adamw"`` so one LR serves both): ``torch.optim.Muon``'s
algorithm, extended to stacked matrices (E, out, in) — a mixture of experts' weights — whose E
slices are orthogonalised one by one, as E separate matrices would be. Under FSDP2 and tensor
parallelism each matrix is orthogonalised whole, never shard by shard (`orthogonalise`).
Token embeddings (names ending in ``embed.weight``), the output head (``lm_head.weight``) and all
1-D parameters go to ``torch.optim.AdamW`` with betas (0.8, 0.999). Both use coupled weight
decay; every incoming group keeps its own ``weight_decay``.

It refuses what the other optimizers refuse, in their sentences: a complex, integer or boolean
parameter (``check_parameters``), and at ``load_state_dict`` a state it did not save
(`MuonWithAdamW.foreign_state_refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz

from .base import check_parameters
from .dtensors import is_dtensor
from .state_origin import origins, saved_keys

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

ADAMW_ONLY_SUFFIXES = ("embed.weight", "lm_head.weight")


@dataclass(frozen=True)
class Part:
    """One of MuonWithAdamW's two optimizers, as its saved state is recognised."""

    title: str
    origin: str  # what `state_origin.origins` calls the groups it saves
    state: tuple[str, ...]  # what it keeps per parameter (AdamW's max_exp_avg_sq: amsgrad only)


PARTS = {"muon": Part("Muon", "torch.optim.Muon", ("momentum_buffer",)),
         "adamw": Part("AdamW", "torch.optim.AdamW",
                       ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"))}


def uses_muon(name: str | None, param: torch.Tensor) -> bool:
    """Whether a parameter is a hidden weight matrix or a stack of them (Muon) rather than
    AdamW's."""
    return param.ndim in (2, 3) and not (name is not None and name.endswith(ADAMW_ONLY_SUFFIXES))


def holds_whole_matrices(tensor: DTensor) -> bool:
    """Whether every rank's shard of a DTensor stack (E, out, in) holds whole (out, in) matrices:
    it is split along its first dimension only (as FSDP2 and expert parallelism split experts)."""
    from torch.distributed.tensor import Shard  # noqa: PLC0415  loaded once a DTensor exists (dtensors.py)

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
        from torch.distributed.tensor import (  # noqa: PLC0415  loaded once a DTensor exists
            DTensor,
            distribute_tensor,
        )

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


def as_group_dicts(params) -> list[dict]:
    """``params`` as param-group dicts holding a list of tensors each: from tensors, ``(name,
    tensor)`` pairs (their names become the group's ``"names"``) or group dicts."""
    groups = list(params)
    if groups and not isinstance(groups[0], dict):
        groups = [{"params": groups}]
    return [with_tensor_list(group) for group in groups]


def with_tensor_list(group: dict) -> dict:
    params = group["params"]
    params = [params] if torch.is_tensor(params) else list(params)
    group = {**group, "params": params}  # never the caller's dict
    if params and isinstance(params[0], tuple):
        group["names"] = [name for name, _ in params]
        group["params"] = [param for _, param in params]
    return group


def part_of(group: dict) -> str:
    """Which part steps a param group (a key of PARTS), by the keys its optimizer gave it."""
    return "muon" if "ns_steps" in group else "adamw"


def is_part_state(part: str, saved_group: dict, saved_state: dict) -> bool:
    """Whether a saved param group, with its parameters' state, is one that ``part`` saved."""
    state = {index: saved_state[index] for index in saved_group["params"] if index in saved_state}
    group_keys, state_keys = saved_keys({"param_groups": [saved_group], "state": state})
    return (PARTS[part].origin in origins(group_keys, state_keys, [saved_group])
            and state_keys <= set(PARTS[part].state))


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
    (the same dicts the inner optimizers read; groups added later follow, split alike), and its
    ``state`` is shared with both, so LR schedulers, ``state_dict`` and ``load_state_dict`` see a
    single ordinary optimizer.

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
        groups = as_group_dicts(params)
        for group in groups:
            check_parameters(group["params"])
        # what each part is built with (kept: a group added later may be a new part's first)
        self.part_options = {
            "muon": dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                         ns_steps=ns_steps, adjust_lr_fn="match_rms_adamw"),
            "adamw": dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay),
        }
        muon_groups, adamw_groups = split_groups(groups)
        muon = StackedMuon(muon_groups, **self.part_options["muon"]) if muon_groups else None
        adamw = torch.optim.AdamW(adamw_groups, **self.part_options["adamw"]) \
            if adamw_groups else None
        inner_groups = [g for opt in (muon, adamw) if opt is not None for g in opt.param_groups]
        super().__init__(inner_groups, dict(lr=lr, weight_decay=weight_decay))
        # set after torch's constructor, whose add_param_group calls take the parts' groups as
        # they are (see add_param_group)
        self.muon, self.adamw = muon, adamw
        self._share_groups_and_state()

    def _inner(self) -> list[torch.optim.Optimizer]:
        return [opt for opt in (self.muon, self.adamw) if opt is not None]

    def _share_groups_and_state(self) -> None:
        for group in self.param_groups:
            group.setdefault("initial_lr", group["lr"])
        for name in PARTS:
            part = getattr(self, name)
            if part is not None:
                part.param_groups = [g for g in self.param_groups if part_of(g) == name]
                part.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self._inner():
            opt.step()
        return loss

    def add_param_group(self, param_group: dict) -> None:
        """Add a group split as the constructor splits them, its hidden matrices to Muon and the
        rest to AdamW (torch's own would keep it here, where neither part steps it). Refused, and
        nothing kept, with a parameter the update would get wrong or one already in a group."""
        if "muon" not in self.__dict__:  # from torch's constructor: the parts' groups, as built
            super().add_param_group(param_group)
            return
        (group,) = as_group_dicts([param_group])
        check_parameters(group["params"])
        held = {id(param) for held_group in self.param_groups for param in held_group["params"]}
        if any(id(param) in held for param in group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        muon_groups, adamw_groups = split_groups([group])
        for name, split in (("muon", muon_groups), ("adamw", adamw_groups)):
            self.param_groups += [self._add_to_part(name, part) for part in split]
        self._share_groups_and_state()

    def _add_to_part(self, name: str, group: dict) -> dict:
        """``group`` added to the part ``name`` (built with it where the part had no group
        yet); returns it as that part filled it in."""
        part = getattr(self, name)
        if part is None:
            build = StackedMuon if name == "muon" else torch.optim.AdamW
            part = build([group], **self.part_options[name])
            setattr(self, name, part)
        else:
            part.add_param_group(group)
        return part.param_groups[-1]

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load, refusing first a state this optimizer did not save (see
        `foreign_state_refusal`), as the state dict stands after every registered pre-hook."""
        def refuse_foreign(optimizer, final_state_dict):  # registered last
            refusal = optimizer.foreign_state_refusal(final_state_dict)
            if refusal is not None:  # before anything is loaded
                raise ValueError(refusal)

        handle = self.register_load_state_dict_pre_hook(refuse_foreign)
        try:
            super().load_state_dict(state_dict)  # replaces the group dicts and the state
        finally:
            handle.remove()
        self._share_groups_and_state()

    def foreign_state_refusal(self, state_dict: dict) -> str | None:
        """The sentence refusing ``state_dict``, or None when it is this optimizer's: each saved
        group the same part's (Muon or AdamW) as the group in its place here, of as many
        parameters, holding that part's state only. torch would load any state with as many
        parameters per group, and another optimizer's (ADana's, torch AdamW's) then failed at a
        step, or set a Muon group's hyperparameters on an AdamW one."""
        saved_groups = state_dict.get("param_groups", [])
        parts = [part_of(group) for group in self.param_groups]
        if len(saved_groups) == len(parts) and all(
                len(saved["params"]) == len(group["params"])
                and is_part_state(part, saved, state_dict.get("state", {}))
                for part, group, saved in zip(parts, self.param_groups, saved_groups)):
            return None
        group_keys, state_keys = saved_keys(state_dict)
        found = origins(group_keys, state_keys, saved_groups)
        origin = ("a MuonWithAdamW over other parameters" if "MuonWithAdamW" in found
                  else " or ".join(sorted(found)))
        state = ", ".join(sorted(state_keys)) or "no state yet"
        own = " and ".join(
            f"{count} of {PARTS[part].title} (state {', '.join(sorted(PARTS[part].state))})"
            for part in PARTS if (count := parts.count(part)))
        return (f"MuonWithAdamW.load_state_dict: this state dict comes from {origin} "
                f"(per-parameter state: {state}), not from MuonWithAdamW over these parameters, "
                f"whose param groups are {own}; load it into the optimizer that saved it, or "
                f"give MuonWithAdamW a state dict it saved")

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "muon": self.muon, "adamw": self.adamw,
                "part_options": self.part_options}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if "muon" in self.__dict__:
            self._share_groups_and_state()
