"""The machinery shared by danastar's own optimizers: state, step counts, and the three paths.

Each optimizer writes its math as two functions:

* ``step_scalars(k, lr, schedule_factor, **group constants)``: the per-step scalars of one tensor
  (a_k, bias corrections, the weight-decay multiplier ...), computed once on the host in float64;
  with ``capturable=True`` the same function runs on the device over a tensor of step counts
  (written with `divide`, `sqrt`, `minimum` of module scalar_math and torch.where, which take
  numbers and tensors);
* ``update(param, grad, *buffers, **scalars, **constants)``: the elementwise update of one tensor.

The update serves two paths:

* ``reference``: a plain Python loop over the group's tensors with Python-float scalars (any
  dtype, float64 included);
* ``compiled``: the same loop handed to ``torch.compile`` as one function over the whole group's
  tensor lists, with every per-step scalar passed as a 0-dim tensor, so changing the LR or
  advancing the step never recompiles, and the kernel does no scalar math per element.

The DANA family adds a ``foreach`` path written with ``torch._foreach_*`` ops, used on
accelerators where ``torch.compile`` is unavailable. The step count ``k`` is per tensor (a
tensor whose grad is None does not advance); tensors are bucketed by ``k``, which all share unless
some grads were None. With ``capturable=True`` (a CUDA graph can capture the step) the counts
stay on the parameters' device and are not read back: the scalars are computed there over the
packed vector of counts and each tensor takes its own column (`run_per_tensor_columns`; the
paths themselves are in module paths).

Under FSDP2 parameters, gradients and state are DTensors; every update is elementwise, so the
paths work on the local shards and never mix DTensors with plain tensors.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from itertools import chain

import torch

from danastar import hparams
from danastar.hparams import check

from .dtensors import is_dtensor
from .flat import FlatLayout, build_layout
from .paths import (
    ROUNDING_STEP,
    compile_columns_runner,
    compile_per_tensor_runner,
    compiled_available,
    pack_columns,
    pack_scalars,
    run_foreach_rounded,
    run_per_tensor,
    run_per_tensor_columns,
    working_dtype,
)
from .rounding import seed_from_torch, shard_layout, tensor_salt
from .scalar_math import divide
from .state_origin import foreign_state_refusal

IMPLS = ("reference", "foreach", "compiled")
# The dtypes the state (m, v, tau ...) may be kept in: float32 (widened to the parameter's dtype
# for float64 parameters), or bfloat16 with stochastic rounding on every write.
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor a rank owns: the local shard of a DTensor (sharing its storage), else itself."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


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


def decay_multiplier(weight_decay, schedule_factor, k, wd_ts):
    """Independent, decaying weight decay: the factor that multiplies the parameter, in [0, 1]
    (`danastar.hparams.decay_multiplier`, its one formula), with the capturable path's
    divisions rounded once (module scalar_math)."""
    return hparams.decay_multiplier(weight_decay, schedule_factor, k, wd_ts, divide)


def check_parameters(params) -> None:
    """Refuse a parameter the update would get wrong: a complex one (its moments would mix real
    and imaginary parts) or an integer or boolean one (its update truncated)."""
    for param in params:
        kind = "complex" if param.is_complex() else "floating" if param.is_floating_point() \
            else "other"
        if kind != "floating":
            hparams.check_parameter_dtype(str(param.dtype).removeprefix("torch."),
                                          param.shape, kind)


def schedule_factor(group: dict) -> float:
    """s_t = current LR / peak LR of the group (0 when the group was built with lr 0)."""
    initial_lr = float(group["initial_lr"])
    return float(group["lr"]) / initial_lr if initial_lr != 0 else 0.0


def device_schedule_factor(group: dict):
    """`schedule_factor` without reading a tensor LR on the host: a 0-dim float64 tensor where
    ``lr`` or ``initial_lr`` is a tensor (the same value: both are widened before dividing),
    else the float (then a constant of a captured graph)."""
    lr, initial_lr = group["lr"], group["initial_lr"]
    if not torch.is_tensor(lr) and not torch.is_tensor(initial_lr):
        return schedule_factor(group)
    lr = lr.to(torch.float64) if torch.is_tensor(lr) else float(lr)
    if not torch.is_tensor(initial_lr):
        return lr / initial_lr if initial_lr != 0 else torch.zeros_like(lr)
    initial_lr = initial_lr.to(torch.float64)
    return torch.where(initial_lr != 0, divide(lr, initial_lr), 0.0)


# On CPU a compile costs tens of seconds; below this many elements per group the foreach path
# finishes a short run sooner, above it the compiled kernel (one pass over memory) wins.
CPU_COMPILE_MIN_ELEMENTS = 2**21


def check_impl(impl: str | None, supported: tuple[str, ...]) -> None:
    if impl is not None and impl not in supported:
        raise ValueError(f"impl must be one of {supported} or None (automatic), got {impl!r}")


def check_capturable_group(owner: str, group: dict, impl: str | None) -> None:
    """Refuse ``capturable=True`` where a path would read its step counts on the host: flat
    buffers (one count per flat tensor, compared on the host) and the foreach path (Python-float
    scalars)."""
    if group["capturable"] and group["flat"]:
        raise ValueError(f"{owner}: capturable=True keeps one step count per tensor on the device, "
                         "which flat buffers cannot; drop flat=True or capturable=True for this "
                         "group")
    if group["capturable"] and impl == "foreach":
        raise ValueError(f"{owner}: impl='foreach' has no capturable path; use impl='compiled' "
                         "(or 'reference', or None) with capturable=True")


def check_flat_group(owner: str, group: dict) -> None:
    """Refuse ``flat=True`` with low-precision state or stochastic rounding, whose random bits
    are keyed by tensor (module flat)."""
    if group["flat"] and (group["state_dtype"] != torch.float32
                          or group["stochastic_rounding"]):
        raise ValueError(f"{owner}: flat=True keeps float32 state without stochastic rounding; "
                         "drop flat=True, or state_dtype/stochastic_rounding, for this group")


# The default peak LR of every optimizer here, as torch.optim's Adam and AdamW have one: a model
# built from param groups that each carry their own lr needs no other.
DEFAULT_LR = 1e-3


def check_lr(lr: float | torch.Tensor) -> None:
    """A learning rate as torch.optim checks it: a 1-element tensor or a number, at least 0."""
    if isinstance(lr, torch.Tensor):
        check(lr.numel() == 1, "Tensor lr must be 1-element")
        lr = lr.item() if lr.device.type != "meta" else 0.0
    hparams.check_lr(lr)


class PerTensorOptimizer(torch.optim.Optimizer):
    """A torch optimizer whose update is one elementwise function per tensor.

    Subclasses define ``buffer_names`` (state buffers, created with ``zeros_like``), the
    functions ``step_scalars`` and ``update`` (see the module docstring), ``scalar_constants``
    and ``update_constants`` (the names of the group's settings each of them takes) and
    optionally ``foreach_update`` (``update`` over lists of tensors).
    """

    buffer_names: tuple[str, ...]
    step_scalars: Callable
    update: Callable
    scalar_constants: tuple[str, ...]
    update_constants: tuple[str, ...]
    foreach_update: Callable | None = None
    # Whether the compiled path may pass the scalars in float32 to groups without float64
    # tensors (the kernel then skips converting float64 scalars): only for updates that do no
    # arithmetic on a scalar that float32 would spoil, such as 1 - beta with beta near 1.
    float32_scalars: bool = False

    def __init__(self, params, defaults: dict, impl: str | None = None,
                 state_dtype=torch.float32, stochastic_rounding: bool = False,
                 flat: bool = False, capturable: bool = False):
        check_lr(defaults["lr"])
        check_impl(impl, self.supported_impls())
        self.impl = impl
        # Per group: the state's dtype, whether bf16 parameters are stochastically rounded too,
        # the seed of the rounding's random bits (module rounding), whether the group's tensors
        # are kept in flat buffers (module flat), and whether a step may be captured in a CUDA
        # graph (step counts and scalars on the device; module docstring).
        defaults = {**defaults, "state_dtype": resolve_state_dtype(state_dtype),
                    "stochastic_rounding": bool(stochastic_rounding),
                    "rounding_seed": seed_from_torch(), "flat": bool(flat),
                    "capturable": bool(capturable)}
        self._forget_kept()
        super().__init__(params, defaults)

    def _forget_kept(self) -> None:
        """What steps keep between them, derived from the groups and the state (never saved):
        id(group) -> the tensors `_gather` found, and id(group) -> `_advance`'s packed counts."""
        self._gathered: dict = {}
        self._packed_steps: dict = {}
        self._salts: dict = {}
        self._flat: dict[int, FlatLayout] = {}  # id(group) -> its flat layout (flat=True)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._forget_kept()

    def __getstate__(self) -> dict:  # torch's keeps only defaults, state and param_groups
        return {**super().__getstate__(), "impl": self.impl}

    @classmethod
    def supported_impls(cls) -> tuple[str, ...]:
        return IMPLS if cls.foreach_update is not None else ("reference", "compiled")

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        # The peak LR gamma*; torch LR schedulers use setdefault on this key, so they keep it. A
        # tensor LR is copied, as torch's schedulers do: it is changed in place as it schedules.
        lr = group["lr"]
        group.setdefault("initial_lr", lr.clone() if torch.is_tensor(lr) else lr)
        try:
            group["state_dtype"] = resolve_state_dtype(group["state_dtype"])
            check_flat_group(type(self).__name__, group)
            check_capturable_group(type(self).__name__, group, self.impl)
            check_lr(group["lr"])
            check_parameters(group["params"])
            self.check_param_group(group)
        except ValueError:
            self.param_groups.pop()  # a refused group is not kept
            raise

    def check_param_group(self, group: dict) -> None:
        """Refuse a group (with the defaults filled in) whose settings together are a mistake;
        raises ValueError. Subclasses with the independent weight decay check it here."""

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
        """The path to run: the user's choice, else compiled, except for small groups on CPU
        (where compiling costs more start-up time than it saves)."""
        impl = self.impl
        if impl is None:
            small = sum(p.numel() for p in params) < CPU_COMPILE_MIN_ELEMENTS
            impl = self.uncompiled_impl(params) if params[0].device.type == "cpu" and small \
                else "compiled"
        if impl == "compiled" and not compiled_available():
            impl = self.uncompiled_impl(params)
        return impl

    def uncompiled_impl(self, params: list[torch.Tensor]) -> str:
        """Without compilation: on CPU the per-tensor loop, which keeps each tensor in cache
        across the update's operations; on accelerators foreach, which launches fewer kernels."""
        if params[0].device.type == "cpu" or self.foreach_update is None:
            return "reference"
        return "foreach"

    def _init_state(self, param: torch.Tensor, group: dict) -> dict:
        state = self.state[param]
        if not state:
            # As in torch.optim: a float32 CPU tensor (exact to 2**24 steps), read without a
            # device sync when the per-step scalars are computed; capturable: on the device.
            state["step"] = torch.zeros((), dtype=torch.float32, device=self._step_device(
                param, group))
            dtype = buffer_dtype(param, group["state_dtype"])
            for name in self.buffer_names:
                state[name] = torch.zeros_like(param, dtype=dtype,
                                               memory_format=torch.preserve_format)
        return state

    @staticmethod
    def _step_device(param: torch.Tensor, group: dict) -> torch.device:
        """Where a step count lives: on the parameter's device when capturable, else the CPU."""
        return param.device if group["capturable"] else torch.device("cpu")

    def _gather(self, group: dict):
        """The group's tensors that have gradients: local params, grads, state buffers, steps,
        and each tensor's position in the group (which keys its rounding's random bits).

        The params, buffers and step tensors of a group change only when the group or the state
        does, so they are kept between steps (checked by identity of each parameter's state);
        only the gradients are read anew. The Python work per tensor is a visible part of a
        GPU step's host time.
        """
        grads = [param.grad for param in group["params"]]
        if all(grad is not None for grad in grads):
            cached = self._gathered.get(id(group))
            if cached is not None and cached[0] is group["params"] and len(cached[1]) == len(
                    grads) and all(
                    self.state.get(param) is kept for param, kept in zip(cached[0], cached[1])):
                return cached[2], [self._local_grad(p, g) for p, g in zip(cached[0], grads)], \
                    cached[3], cached[4], cached[5]
        params, local_grads, steps, states, positions = [], [], [], [], []
        buffers = [[] for _ in self.buffer_names]
        for position, (param, grad) in enumerate(zip(group["params"], grads)):
            if grad is None:
                continue  # skipped: its step count does not advance
            state = self._init_state(param, group)
            states.append(state)
            positions.append(position)
            params.append(local(param))
            local_grads.append(self._local_grad(param, grad))
            steps.append(state["step"])
            for buffer, name in zip(buffers, self.buffer_names):
                buffer.append(local(state[name]))
        if len(params) == len(grads):
            self._gathered[id(group)] = (group["params"], states, params, buffers, steps,
                                         positions)
        return params, local_grads, buffers, steps, positions

    def _local_grad(self, param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        if grad.is_sparse:
            raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
        if is_dtensor(grad):
            if grad.placements != param.placements:
                # The update is elementwise on local shards: lay the grad out like the param.
                grad = grad.redistribute(param.device_mesh, param.placements)
            return grad.to_local()
        return grad

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group_index, group in enumerate(self.param_groups):
            if group["flat"] and self._step_flat(group):
                continue
            params, grads, buffers, steps, positions = self._gather(group)
            if not params:
                continue
            rounding = self._rounding(group, group_index, params, buffers, positions)
            ks = self._advance(group, steps)
            if group["capturable"]:
                self._update_group_capturable(group, params, grads, buffers, ks, rounding)
            else:
                self._update_group(group, params, grads, buffers, ks, rounding)
        return loss

    def _step_flat(self, group: dict) -> bool:
        """One update over the group's flat tensors and its large ones (module flat); False,
        with nothing done, when some gradient is None (the per-tensor path then steps the
        others)."""
        grads = [param.grad for param in group["params"]]
        if not grads or any(grad is None for grad in grads):
            return False
        layout = self._flat.get(id(group))
        if layout is None or not layout.holds(group["params"]):
            states = [self._init_state(param, group) for param in group["params"]]
            layout = self._flat[id(group)] = build_layout(
                group["params"], states, self.buffer_names, type(self).__name__)
            self._gathered.pop(id(group), None)  # it kept the replaced state buffers
        ks = self._advance_flat(group, layout)
        if any(k != ks[0] for k in ks):  # counts that differ: per tensor, over the views
            params, grads, buffers, _, _ = self._gather(group)
            self._update_group(group, params, grads, buffers, ks)
        else:
            grads = [grads[i] if i in layout.small_set else self._local_grad(p, grads[i])
                     for i, p in enumerate(layout.params)] if layout.large else grads
            params, grads, buffers = layout.step_lists(grads, self.buffer_names)
            self._update_group(group, params, grads, buffers, ks[:1] * len(params))
        return True

    def _advance_flat(self, group: dict, layout: FlatLayout) -> list[float]:
        """`_advance` over the layout's step counts, without gathering and comparing them again
        while the packed counts are the ones this layout advanced last (a per-tensor step, after
        a None grad, packs them anew)."""
        packed = self._packed_steps.get(id(group))
        if packed is not None and packed is layout.packed_steps:
            packed[0].add_(1)
            return packed[0].tolist()
        ks = self._advance(group, [state["step"] for state in layout.states])
        layout.packed_steps = self._packed_steps.get(id(group))
        return ks

    def _rounding(self, group, group_index, params, buffers, positions):
        """None when every write is plain (float32 state, no stochastic rounding of bf16
        parameters); else ``(salts, layouts, round_params)`` for `run_per_tensor`."""
        round_params = group["stochastic_rounding"]
        low_state = bool(buffers) and buffers[0][0].dtype == torch.bfloat16
        if not low_state and not (round_params and any(
                p.dtype == torch.bfloat16 for p in params)):
            return None
        key = (group["rounding_seed"], group_index, tuple(positions))
        kept = self._salts.get(id(group))
        if kept is None or kept[0] != key:  # the salts change only with the group
            salts = tuple(tensor_salt(key[0], group_index, position) for position in positions)
            layouts = tuple(shard_layout(group["params"][position]) for position in positions)
            kept = self._salts[id(group)] = (key, salts, layouts)
        return kept[1], kept[2], round_params

    def _update_group(self, group, params, grads, buffers, ks, rounding=None):
        """Update the tensors of ``group`` whose step counts (advanced already) are ``ks``:
        one update per distinct count."""
        impl = self.resolve_impl(params)
        constants = {name: group[name] for name in self.update_constants}
        buckets: dict[float, list[int]] = {}
        for i, k in enumerate(ks):
            buckets.setdefault(k, []).append(i)
        for k, index in buckets.items():
            def pick(tensors, index=index):
                return tensors if len(index) == len(tensors) else [tensors[i] for i in index]
            lists = (pick(params), pick(grads), [pick(b) for b in buffers])
            scalars = self.scalars_for(group, k)
            picked = None
            if rounding is not None:
                scalars[ROUNDING_STEP] = k
                picked = (tuple(pick(list(rounding[0]))), tuple(pick(list(rounding[1]))),
                          rounding[2])
            if impl == "foreach":
                if picked is None:
                    type(self).foreach_update(lists[0], lists[1], *lists[2], **scalars,
                                              **constants)
                else:
                    run_foreach_rounded(type(self).foreach_update, *lists, scalars, constants,
                                        picked)
            elif impl == "reference":
                run_per_tensor(type(self).update, *lists, scalars, constants, picked)
            else:
                self._run_compiled(lists, scalars, constants, picked)

    def _update_group_capturable(self, group, params, grads, buffers, ks, rounding=None):
        """Update the tensors of a capturable ``group`` whose step counts (advanced already, on
        the device) are ``ks``: one update over all of them, each tensor with its own column of
        scalars, nothing read on the host."""
        constants = {name: group[name] for name in self.update_constants}
        scalars = self.device_scalars(group, ks)
        if rounding is not None:
            scalars[ROUNDING_STEP] = ks
        names, lists = tuple(scalars), (params, grads, buffers)
        # foreach is refused with capturable; it is reached only after a failed compile, where
        # the reference loop takes over.
        if self.resolve_impl(params) == "compiled":
            packed = pack_columns(scalars, len(params), self._scalar_dtype(params), ks.device)
            self._call_compiled("columns", lists, (packed, names, constants, rounding), None)
        else:
            packed = pack_columns(scalars, len(params), torch.float64, ks.device)
            run_per_tensor_columns(type(self).update, *lists, packed, names, constants, rounding)

    def _scalar_dtype(self, params: list[torch.Tensor]) -> torch.dtype:
        """The compiled path's scalars: float32 (see float32_scalars) unless the group holds
        float64 tensors."""
        wide = not self.float32_scalars or any(p.dtype == torch.float64 for p in params)
        return torch.float64 if wide else torch.float32

    def _advance(self, group: dict, steps: list[torch.Tensor]):
        """Add one to each step count; returns the new counts (capturable: the packed tensor
        of them, on the device, unread).

        The counts stay one 0-dim float32 tensor per parameter (on the CPU, or the parameter's
        device when capturable, as in torch.optim and the saved state), but those of a group are
        views of one tensor, so that advancing them and reading them back are one operation each
        instead of one per tensor.
        """
        packed = self._packed_steps.get(id(group))
        if packed is None or len(packed[1]) != len(steps) or any(
                a is not b for a, b in zip(packed[1], steps)):
            packed = self._packed_steps[id(group)] = self._pack_steps(steps)
        packed[0].add_(1)
        return packed[0] if group["capturable"] else packed[0].tolist()

    def _pack_steps(self, steps: list[torch.Tensor]):
        flat = torch.stack([step.detach().reshape(()) for step in steps]).to(torch.float32)
        views = list(flat.unbind())
        by_old = {id(old): view for old, view in zip(steps, views)}
        for state in self.state.values():
            view = by_old.get(id(state.get("step")))
            if view is not None:
                state["step"] = view
        steps[:] = views  # the caller's list (and `_gather`'s kept one) now holds the views
        self._gathered.clear()  # other kept lists may hold the replaced step tensors
        return flat, views

    def _run_compiled(self, lists, scalars, constants, rounding=None):
        names = tuple(scalars)
        packed = pack_scalars([scalars[name] for name in names], self._scalar_dtype(lists[0]),
                              lists[0][0].device)
        self._call_compiled("packed", lists, (packed, names, constants, rounding), scalars)

    def _call_compiled(self, runner, lists, arguments, scalars):
        """This optimizer's compiled copy of a runner (``runner``: "packed",
        `run_per_tensor_packed`, or "columns", `run_per_tensor_columns`) over ``lists`` and
        ``arguments``. If compiling fails (and compiled was not asked for), warn and finish the
        step uncompiled: with the host ``scalars``, or (capturable, ``scalars`` None) by the
        reference loop over the packed columns."""
        runners = self.__dict__.setdefault("_compiled_runners", {})
        if runner not in runners:
            runners[runner] = (compile_per_tensor_runner if runner == "packed"
                               else compile_columns_runner)()
        try:
            # Each group compiles once (and once more per pattern of None grads).
            with torch._dynamo.config.patch(recompile_limit=8 + 2 * len(self.param_groups)):
                runners[runner](type(self).update, *lists, *arguments)
        except Exception as error:  # compilation failed (no compiler, unsupported platform)
            if self.impl == "compiled" or getattr(self, "_compile_worked", False):
                raise
            warnings.warn(f"{type(self).__name__}: torch.compile failed ({error}); "
                          "using the non-compiled path", stacklevel=5)
            self.impl = self.uncompiled_impl(lists[0])
            if scalars is None:
                run_per_tensor_columns(type(self).update, *lists, *arguments)
            else:
                self._run_uncompiled(lists, scalars, *arguments[2:])
            return
        self._compile_worked = True

    def _run_uncompiled(self, lists, scalars, constants, rounding):
        """The step on the path `uncompiled_impl` chose, with host scalars."""
        if self.impl == "foreach" and rounding is not None:
            run_foreach_rounded(type(self).foreach_update, *lists, scalars, constants, rounding)
        elif self.impl == "foreach":
            type(self).foreach_update(lists[0], lists[1], *lists[2], **scalars, **constants)
        else:
            run_per_tensor(type(self).update, *lists, scalars, constants, rounding)

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
                    device = self._step_device(param, group) if key == "step" else param.device
                    self.state[param][key] = value.to(device=device, copy=True)
                elif key == "step":
                    self.state[param][key] = torch.tensor(float(value), dtype=torch.float32,
                                                          device=self._step_device(param, group))
