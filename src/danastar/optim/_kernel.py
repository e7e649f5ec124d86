"""The machinery shared by danastar's own optimizers: state, step counting, and the three paths.

Each optimizer writes its math once, as a function that updates one tensor
(`update(param, grad, *buffers, k, lr, schedule_factor, **hyperparameters)`). That one function
serves two paths:

* ``reference``: a plain Python loop over the group's tensors (any dtype, float64 included);
* ``compiled``: the same loop handed to ``torch.compile`` as one function over the whole group's
  tensor lists. Every per-step scalar (k, lr, schedule factor) is a 0-dim tensor, so changing the
  LR or advancing the step never recompiles.

The DANA family adds a ``foreach`` path written with ``torch._foreach_*`` ops, used where
``torch.compile`` is unavailable. Under FSDP2 parameters, gradients and state are DTensors; every
update is elementwise, so the paths work on the local shards and never mix DTensors with plain
tensors.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable
from itertools import chain

import torch
from torch.distributed.tensor import DTensor

IMPLS = ("reference", "foreach", "compiled")


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor a rank owns: the local shard of a DTensor (sharing its storage), else itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def state_dtype(param: torch.Tensor) -> torch.dtype:
    """Moments are kept in at least float32 (bf16/fp16 parameters get float32 state)."""
    return torch.promote_types(param.dtype, torch.float32)


def decay_multiplier(weight_decay, schedule_factor, k, wd_ts):
    """Independent, decaying weight decay: the factor that multiplies the parameter.

    Scaled by the schedule factor s_t but not by the peak LR; with ``wd_ts`` it also decays as
    1 / (1 + k / wd_ts), the paper's omega / t with an offset that keeps it finite early.
    """
    if wd_ts is None:
        return 1 - weight_decay * schedule_factor
    return 1 - weight_decay * schedule_factor / (1 + k / wd_ts)


def schedule_factor(group: dict) -> float:
    """s_t = current LR / peak LR of the group (0 when the group was built with lr 0)."""
    initial_lr = float(group["initial_lr"])
    return float(group["lr"]) / initial_lr if initial_lr != 0 else 0.0


def run_per_tensor(update, params, grads, buffers, steps, lr, schedule_factor, hyperparameters):
    """Advance each tensor's step and apply ``update`` to it: the reference path, and (compiled)
    the fast one. Scalars are computed in float64 so float64 parameters are exact."""
    for i, (param, grad, step) in enumerate(zip(params, grads, steps)):
        step += 1
        update(param, grad, *(buffer[i] for buffer in buffers), step.double(), lr,
               schedule_factor, **hyperparameters)


def compiled_available() -> bool:
    """Whether torch.compile can run here (dynamo is unsupported on some Pythons/platforms)."""
    try:
        from torch._dynamo.eval_frame import is_dynamo_supported
    except ImportError:
        return False
    return is_dynamo_supported()


def compile_per_tensor_runner() -> Callable:
    """A compiled copy of `run_per_tensor` with a code object of its own.

    Dynamo keeps its cache, and its recompile limit, per code object; one copy per optimizer
    keeps optimizers (and their groups of different shapes) from evicting each other.
    """
    code = run_per_tensor.__code__.replace()  # an equal but distinct code object
    copy = types.FunctionType(code, run_per_tensor.__globals__, run_per_tensor.__name__)
    return torch.compile(copy, fullgraph=True, dynamic=False)


# On CPU a compile costs tens of seconds; below this many elements per group the foreach path
# finishes a short run sooner, above it the compiled kernel (one pass over memory) wins.
CPU_COMPILE_MIN_ELEMENTS = 2**21


def check_impl(impl: str | None, supported: tuple[str, ...]) -> None:
    if impl is not None and impl not in supported:
        raise ValueError(f"impl must be one of {supported} or None (automatic), got {impl!r}")


def check(condition: bool, message: str) -> None:
    """Raise ValueError for an invalid hyperparameter."""
    if not condition:
        raise ValueError(message)


class PerTensorOptimizer(torch.optim.Optimizer):
    """A torch optimizer whose update is one elementwise function per tensor.

    Subclasses define ``buffer_names`` (state buffers, created with ``zeros_like``), the
    per-tensor ``update`` function, ``hyperparameters(group)`` (the group's keywords of
    ``update``) and optionally ``foreach_update`` (the same math over lists, one step count).
    """

    buffer_names: tuple[str, ...]
    update: Callable
    foreach_update: Callable | None = None

    def __init__(self, params, defaults: dict, impl: str | None = None):
        check(defaults["lr"] >= 0, f"lr must be >= 0, got {defaults['lr']}")
        check_impl(impl, self.supported_impls())
        self.impl = impl
        super().__init__(params, defaults)

    def __getstate__(self) -> dict:  # torch's keeps only defaults, state and param_groups
        return {**super().__getstate__(), "impl": self.impl}

    @classmethod
    def supported_impls(cls) -> tuple[str, ...]:
        return IMPLS if cls.foreach_update is not None else ("reference", "compiled")

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        # The peak LR gamma*; torch LR schedulers use setdefault on this key, so they keep it.
        group.setdefault("initial_lr", group["lr"])

    def hyperparameters(self, group: dict) -> dict:
        raise NotImplementedError

    def resolve_impl(self, params: list[torch.Tensor]) -> str:
        """The path to run: the user's choice, else compiled, except for small groups on CPU
        (where compiling costs more start-up time than it saves)."""
        impl = self.impl
        if impl is None:
            small = sum(p.numel() for p in params) < CPU_COMPILE_MIN_ELEMENTS
            impl = "compiled"
            if params[0].device.type == "cpu" and small:
                impl = "foreach" if self.foreach_update is not None else "reference"
        if impl == "compiled" and not compiled_available():
            impl = "foreach" if self.foreach_update is not None else "reference"
        return impl

    def _init_state(self, param: torch.Tensor) -> dict:
        state = self.state[param]
        if not state:
            # `step` lives on the parameter's device so the compiled path never syncs with host.
            state["step"] = torch.zeros((), dtype=torch.float32, device=local(param).device)
            for name in self.buffer_names:
                state[name] = torch.zeros_like(param, dtype=state_dtype(param),
                                               memory_format=torch.preserve_format)
        return state

    def _gather(self, group: dict):
        params, grads, steps = [], [], []
        buffers = [[] for _ in self.buffer_names]
        for param in group["params"]:
            if param.grad is None:
                continue  # skipped: its step count does not advance
            if param.grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            state = self._init_state(param)
            params.append(local(param))
            grads.append(local(param.grad))
            steps.append(state["step"])
            for buffer, name in zip(buffers, self.buffer_names):
                buffer.append(local(state[name]))
        return params, grads, buffers, steps

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, buffers, steps = self._gather(group)
            if params:
                self._update_group(group, params, grads, buffers, steps)
        return loss

    def _update_group(self, group, params, grads, buffers, steps):
        hyperparameters = self.hyperparameters(group)
        lr, factor = float(group["lr"]), schedule_factor(group)
        impl = self.resolve_impl(params)
        if impl == "foreach":
            self._foreach(params, grads, buffers, steps, lr, factor, hyperparameters)
            return
        device = params[0].device
        lr_t = torch.tensor(lr, dtype=torch.float64, device=device)
        factor_t = torch.tensor(factor, dtype=torch.float64, device=device)
        args = (type(self).update, params, grads, buffers, steps, lr_t, factor_t, hyperparameters)
        if impl == "reference":
            run_per_tensor(*args)
            return
        if getattr(self, "_compiled_runner", None) is None:
            self._compiled_runner = compile_per_tensor_runner()
        try:
            # Each group compiles once (and once more per pattern of None grads).
            with torch._dynamo.config.patch(recompile_limit=8 + 2 * len(self.param_groups)):
                self._compiled_runner(*args)
        except Exception as error:  # compilation failed (no compiler, unsupported platform)
            if self.impl == "compiled" or getattr(self, "_compile_worked", False):
                raise
            warnings.warn(f"{type(self).__name__}: torch.compile failed ({error}); "
                          "using the non-compiled path", stacklevel=3)
            self.impl = "foreach" if self.foreach_update is not None else "reference"
            self._update_group(group, params, grads, buffers, steps)
            return
        self._compile_worked = True

    def _foreach(self, params, grads, buffers, steps, lr, factor, hyperparameters):
        """Group the tensors by step count (they share it unless some grads were None) and apply
        the list update to each bucket with Python-float scalars."""
        torch._foreach_add_(steps, 1)
        counts = torch.stack(steps).tolist() if len(steps) > 1 else [steps[0].item()]
        buckets: dict[float, list[int]] = {}
        for i, k in enumerate(counts):
            buckets.setdefault(k, []).append(i)
        for k, index in buckets.items():
            pick = lambda tensors: [tensors[i] for i in index]  # noqa: E731
            type(self).foreach_update(pick(params), pick(grads), *(pick(b) for b in buffers),
                                      k=k, lr=lr, schedule_factor=factor, **hyperparameters)

    def load_state_dict(self, state_dict: dict) -> None:
        # torch casts floating-point state to the parameter's dtype; ours stays in float32 or
        # wider (bf16 parameters keep float32 moments), so restore the saved dtypes exactly.
        super().load_state_dict(state_dict)
        saved_ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        for saved_id, param in zip(saved_ids, params):
            for key, value in state_dict["state"].get(saved_id, {}).items():
                if torch.is_tensor(value):
                    device = local(param).device if key == "step" else param.device
                    self.state[param][key] = value.to(device=device, copy=True)
