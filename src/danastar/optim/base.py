"""The torch contract of danastar's own optimizers: groups, state, checks, step counts,
``state_dict``/``load_state_dict``. How a group's update runs is its runner's (package runners).

Each optimizer writes its math as two functions:

* ``step_scalars(k, lr, schedule_factor, **group constants)``: the per-step scalars of one tensor
  (a_k, bias corrections, the weight-decay multiplier ...), computed once on the host in float64;
  with ``capturable=True`` the same function runs on the device over a tensor of step counts
  (written with `divide`, `sqrt`, `minimum` of module scalar_math and torch.where, which take
  numbers and tensors);
* ``update(param, grad, *buffers, **scalars, **constants)``: the elementwise update of one tensor,
  the one form every path runs (the reference loop, its compiled copy, the capturable loop with a
  column of scalars per tensor, the flat buffers, and under `rounding.rounded` for bf16 state).

The step count ``k`` is per tensor (a tensor whose grad is None does not advance). Under FSDP2
parameters, gradients and state are DTensors; every update is elementwise, so the runners work
on the local shards and never mix DTensors with plain tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain

import torch

from danastar import hparams
from danastar.hparams import check

from .extension import extend_optimizer
from .group_scalars import device_schedule_factor, schedule_factor
from .rounding import rounded, seed_from_torch
from .runners import IMPLS, GroupRunner, check_path, compiled_available, runner_class
from .state_origin import foreign_state_refusal
from .working import working_dtype

# The dtypes the state (m, v, tau ...) may be kept in: float32 (widened to the parameter's dtype
# for float64 parameters), or bfloat16 with stochastic rounding on every write.
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def buffer_dtype(param: torch.Tensor, group_state_dtype: torch.dtype) -> torch.dtype:
    """The dtype of a parameter's state buffers: bfloat16 when the group asks for it, else the
    working dtype (float32 state for bf16 parameters, float64 for float64 ones)."""
    return torch.bfloat16 if group_state_dtype == torch.bfloat16 else working_dtype(param)


def resolve_state_dtype(value) -> torch.dtype:
    """``state_dtype`` as a torch dtype; a name ("bfloat16") is accepted too (module hparams
    refuses the rest, in the sentence danastar.optax uses)."""
    name = value if isinstance(value, str) else str(value).removeprefix("torch.") \
        if isinstance(value, torch.dtype) else None
    return STATE_DTYPES[hparams.state_dtype_name(name, value)]


def check_parameters(params) -> None:
    """Refuse a parameter the update would get wrong: a complex one (its moments would mix real
    and imaginary parts) or an integer or boolean one (its update truncated)."""
    for param in (p for p in params if not p.is_floating_point()):
        hparams.check_parameter_dtype(str(param.dtype).removeprefix("torch."), param.shape,
                                      "complex" if param.is_complex() else "other")


# On CPU a compile costs tens of seconds: below this many elements per group the reference loop
# finishes a short run sooner, above it the compiled kernel (one pass over memory) wins.
CPU_COMPILE_MIN_ELEMENTS = 2**21


def check_impl(impl: str | None) -> None:
    if impl == "foreach":  # the DANA family's hand-written multi-tensor copies are gone
        raise ValueError("impl='foreach' is no longer a path: use impl='compiled' (the default "
                         "where torch.compile runs), or flat=True for many small tensors")
    if impl is not None and impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS} or None (automatic), got {impl!r}")


# The default peak LR of every optimizer here, as torch.optim's Adam and AdamW have one: a model
# built from param groups that each carry their own lr needs no other.
DEFAULT_LR = 1e-3


def check_lr(lr: float | torch.Tensor) -> None:
    """A learning rate as torch.optim checks it: a 1-element tensor or a number, at least 0."""
    if isinstance(lr, torch.Tensor):
        check(lr.numel() == 1, "Tensor lr must be 1-element")
        lr = lr.item() if lr.device.type != "meta" else 0.0
    hparams.check_lr(lr)


def step_device(param: torch.Tensor, group: dict) -> torch.device:
    """Where a step count lives: on the parameter's device when capturable, else the CPU."""
    return param.device if group["capturable"] else torch.device("cpu")


class PerTensorOptimizer(torch.optim.Optimizer):
    """A torch optimizer whose update is one elementwise function per tensor.

    Subclasses define ``buffer_names`` (state buffers, created with ``zeros_like``), the
    functions ``step_scalars`` and ``update`` (see the module docstring), and
    ``scalar_constants`` and ``update_constants`` (the names of the group's settings each of
    them takes). Each group's runner (package runners) is picked from its settings at the
    group's first step and kept: `step` runs each group's runner.
    """

    buffer_names: tuple[str, ...]
    step_scalars: Callable
    update: Callable
    scalar_constants: tuple[str, ...]
    update_constants: tuple[str, ...]
    # Whether the compiled path may pass the scalars in float32 to groups without float64
    # tensors (the kernel then skips converting float64 scalars): only for updates that do no
    # arithmetic on a scalar that float32 would spoil, such as 1 - beta with beta near 1.
    float32_scalars: bool = False

    def __init__(self, params, defaults: dict, impl: str | None = None,
                 state_dtype=torch.float32, stochastic_rounding: bool = False,
                 flat: bool = False, capturable: bool = False):
        check_lr(defaults["lr"])
        check_impl(impl)
        self.impl = impl
        # Per group: the state's dtype, whether bf16 parameters are stochastically rounded too,
        # the seed of the rounding's random bits (module rounding), whether the group's tensors
        # are kept in flat buffers (module flat), and whether a step may be captured in a CUDA
        # graph (step counts and scalars on the device).
        defaults = {**defaults, "state_dtype": resolve_state_dtype(state_dtype), "flat": bool(flat),
                    "stochastic_rounding": bool(stochastic_rounding),
                    "rounding_seed": seed_from_torch(), "capturable": bool(capturable)}
        self._forget_runners()
        self.compiled_once = False  # a compile that worked: a later failure is a bug, raised
        super().__init__(params, defaults)

    def _forget_runners(self) -> None:  # id(group) -> its runner, built at its first step
        self._runners: dict[int, GroupRunner] = {}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._forget_runners()
        self.__dict__.setdefault("compiled_once", False)

    def __getstate__(self) -> dict:  # torch's keeps only defaults, state and param_groups
        return {**super().__getstate__(), "impl": self.impl}

    @classmethod
    def supported_impls(cls) -> tuple[str, ...]:
        return IMPLS

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        # The peak LR gamma*; torch LR schedulers use setdefault on this key, so they keep it. A
        # tensor LR is copied, as torch's schedulers do: it is changed in place as it schedules.
        lr = group["lr"]
        group.setdefault("initial_lr", lr.clone() if torch.is_tensor(lr) else lr)
        try:
            group["state_dtype"] = resolve_state_dtype(group["state_dtype"])
            check_path(type(self).__name__, self.impl, group)
            check_lr(group["lr"])
            check_parameters(group["params"])
            self.check_param_group(group)
        except ValueError:
            self.param_groups.pop()  # a refused group is not kept
            raise

    def check_param_group(self, group: dict) -> None:
        """Refuse (ValueError) a group, defaults filled in, whose settings together are wrong."""

    def extend_to(self, new_total_steps: int, *, from_step: int | None = None,
                  decay_rule: str = "keep", planned_steps: int | None = None) -> None:
        """Continue this run to ``new_total_steps`` steps (`extension.extend_optimizer`; the LR
        schedule is the caller's, `schedules.extended_schedule`)."""
        extend_optimizer(self, new_total_steps, from_step=from_step, decay_rule=decay_rule,
                         planned_steps=planned_steps)

    def scalars_for(self, group: dict, k: float) -> dict[str, float]:
        """The per-step scalars of a tensor of ``group`` at step ``k``."""
        constants = {name: group[name] for name in self.scalar_constants}
        return type(self).step_scalars(k, float(group["lr"]), schedule_factor(group),
                                       **constants)

    def device_scalars(self, group: dict, ks: torch.Tensor) -> dict:
        """`scalars_for` computed on the device by the same ``step_scalars`` over ``ks``, the
        1-D tensor of the tensors' step counts: each scalar a vector of one entry per tensor, a
        0-dim tensor (from a tensor LR) or a number (a constant of a captured graph)."""
        constants = {name: group[name] for name in self.scalar_constants}
        lr = group["lr"]
        if torch.is_tensor(lr) and lr.device != ks.device:
            raise ValueError(f"{type(self).__name__}: with capturable=True a tensor lr must be on "
                             f"the parameters' device ({ks.device}), got {lr.device}; create "
                             "it there")
        lr = lr.to(torch.float64) if torch.is_tensor(lr) else float(lr)
        return type(self).step_scalars(ks.to(torch.float64), lr, device_schedule_factor(group),
                                       **constants)

    def resolve_impl(self, params: list[torch.Tensor]) -> str:
        """The impl of a group of ``params``: the user's choice, else compiled, except for small
        groups on CPU (where compiling costs more start-up time than it saves); reference where
        torch.compile cannot run."""
        impl = self.impl
        if impl is None:
            small = sum(p.numel() for p in params) < CPU_COMPILE_MIN_ELEMENTS
            impl = "reference" if params and params[0].device.type == "cpu" and small \
                else "compiled"
        return impl if impl == "reference" or compiled_available() else "reference"

    def runner(self, group_index: int) -> GroupRunner:
        """The runner of group ``group_index``, picked from its settings the first time."""
        group = self.param_groups[group_index]
        runner = self._runners.get(id(group))
        if runner is None or runner.group is not group:
            update = type(self).update
            rounds = group["state_dtype"] == torch.bfloat16 or (
                group["stochastic_rounding"] and any(
                    p.dtype == torch.bfloat16 for p in group["params"]))
            if rounds:
                update = rounded(update, group["stochastic_rounding"])
            cls = runner_class(self.resolve_impl(group["params"]), group["capturable"],
                               group["flat"])
            runner = self._runners[id(group)] = cls(self, group, group_index, update, rounds)
        return runner

    def stop_compiling(self) -> None:
        """After a failed compile (runners.compiled): every group's runner is picked again,
        without compiling."""
        self.impl = "reference"
        self._runners.clear()

    def init_state(self, param: torch.Tensor, group: dict) -> dict:
        """The parameter's state, created at its first step: its step count and zeroed
        buffers."""
        state = self.state[param]
        if not state:
            # As in torch.optim: a float32 CPU tensor (exact to 2**24 steps), read without a
            # device sync when the per-step scalars are computed; capturable: on the device.
            state["step"] = torch.zeros((), dtype=torch.float32, device=step_device(
                param, group))
            dtype = buffer_dtype(param, group["state_dtype"])
            for name in self.buffer_names:
                state[name] = torch.zeros_like(param, dtype=dtype,
                                               memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group_index in range(len(self.param_groups)):
            self.runner(group_index).step()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load, with the saved state kept as saved: torch casts floating-point state to
        the parameter's dtype, but ours stays in float32 or wider (bf16 parameters keep float32
        moments), so the saved tensors are copied back with their dtypes. A plain-number
        ``step`` (torch's older format) becomes a float32 tensor, as torch does.

        The restoring runs as the first post-hook, on the state dict every pre-hook has seen, so
        what registered load-state-dict hooks do is kept. Another optimizer's state (DanaStar's
        in ADana, torch AdamW's ...) is refused first, naming where it comes from (module
        state_origin). ``capturable`` stays this optimizer's
        (how the step runs, not training state), and each step count moves to where it wants
        it: the parameter's device when capturable, else the CPU."""
        loaded: dict = {}
        capturable = [group["capturable"] for group in self.param_groups]

        def keep(optimizer, final_state_dict):  # registered last: sees every pre-hook's work
            refusal = foreign_state_refusal(type(optimizer).__name__, optimizer.buffer_names,
                                            final_state_dict)
            if refusal is not None:  # before anything is loaded
                raise ValueError(refusal)
            loaded["state_dict"] = final_state_dict

        def restore(optimizer):
            for group, mode in zip(optimizer.param_groups, capturable):
                # saved before the rounding settings existed
                for key in ("state_dtype", "stochastic_rounding", "rounding_seed", "flat"):
                    group.setdefault(key, optimizer.defaults[key])
                group["state_dtype"] = resolve_state_dtype(group["state_dtype"])
                group["capturable"] = mode
            optimizer._restore_saved_state(loaded["state_dict"])

        handles = (self.register_load_state_dict_pre_hook(keep),
                   self.register_load_state_dict_post_hook(restore, prepend=True))
        try:
            super().load_state_dict(state_dict)
        finally:
            for handle in handles:
                handle.remove()

    def _restore_saved_state(self, state_dict: dict) -> None:
        saved_ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable([(p, g) for p in g["params"]] for g in self.param_groups)
        for saved_id, (param, group) in zip(saved_ids, params):
            for key, value in state_dict["state"].get(saved_id, {}).items():
                if torch.is_tensor(value):
                    device = step_device(param, group) if key == "step" else param.device
                    self.state[param][key] = value.to(device=device, copy=True)
                elif key == "step":
                    self.state[param][key] = torch.tensor(float(value), dtype=torch.float32,
                                                          device=step_device(param, group))
