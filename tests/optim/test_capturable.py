"""``capturable=True``: the step counts live on the parameters' device and the per-step scalars
are computed there, so that a step reads nothing on the host and a CUDA graph can capture it.

On the CPU a capturable step gives the host path's values (float32 parameters bit for bit;
float64 ones within a few ulps, see `assert_same`); on the ``meta`` device, under a dispatch mode
that records every host read or host tensor, a capturable step touches none; on a GPU (marked
``cuda``) a step captured in a CUDA graph and replayed equals the eager steps.
"""

import io

import pytest
import torch
from optim_variants import DECAY, OPTIMIZERS
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from danastar.optim import ADana, AdEMAMix, DanaStar

OPTIMIZERS = {**OPTIMIZERS,
              "ademamix-decaying-wd": (AdEMAMix, {"decaying_wd": True, **DECAY})}
SHAPES = [(7, 5), (13,), (3, 4, 5), (1,)]
SKIP = {2: (1,), 3: (1, 3)}  # step -> tensors whose grad is None: their counts fall behind
STEPS = 6


def learning_rate(step: int) -> float:
    return 1e-2 / (1 + 0.3 * step)


def make_params(dtype, device="cpu"):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator).to(dtype).to(device).requires_grad_()
            for shape in SHAPES]


def set_grads(params, step):
    generator = torch.Generator().manual_seed(100 + step)
    for i, param in enumerate(params):
        grad = torch.randn(param.shape, generator=generator).to(param.dtype).to(param.device)
        param.grad = None if i in SKIP.get(step, ()) else grad


def set_lr(optimizer, step, tensor_lr):
    """The schedule: a float, or written into the tensor LR in place (as between replays)."""
    for group in optimizer.param_groups:
        if tensor_lr:
            group["lr"].fill_(learning_rate(step))
        else:
            group["lr"] = learning_rate(step)


def build(name, params, capturable, tensor_lr=False, **options):
    cls, settings = OPTIMIZERS[name]
    lr = torch.tensor(learning_rate(0)) if tensor_lr else learning_rate(0)
    return cls(params, lr=lr, capturable=capturable, **settings, **options)


def train(name, capturable, dtype=torch.float32, tensor_lr=False, steps=STEPS, **options):
    params = make_params(dtype)
    optimizer = build(name, params, capturable, tensor_lr, **options)
    run_steps(optimizer, params, range(steps), tensor_lr)
    return params, optimizer


def run_steps(optimizer, params, steps, tensor_lr=False):
    for step in steps:
        set_lr(optimizer, step, tensor_lr)
        set_grads(params, step)
        optimizer.step()


def assert_same(a_params, a_opt, b_params, b_opt, bitwise=True):
    """Equal parameters and state. Not bitwise (float64 parameters): torch's vectorised float64
    pow and sqrt (the bias corrections, alpha(k), AdEMAMix's beta3) are not always Python's
    math to the last bit (`test_device_scalars_are_the_host_scalars_in_float32`), and float64
    parameters see that bit (the few counts here happen to give equal values)."""
    for a, b in zip(a_params, b_params):
        pairs = [(a, b)] + [(value, b_opt.state[b][key]) for key, value in a_opt.state[a].items()]
        for x, y in pairs:
            if bitwise:
                assert torch.equal(x.cpu(), y.cpu())
            else:
                torch.testing.assert_close(x.cpu(), y.cpu(), rtol=1e-14, atol=1e-300)


@pytest.mark.parametrize("tensor_lr", [False, True], ids=["float-lr", "tensor-lr"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_capturable_step_equals_the_host_step(name, dtype, tensor_lr):
    """Over steps with None grads (counts that differ per tensor) and a changing LR; the counts
    of capturable state are float32 tensors on the parameters' device, as torch's."""
    host = train(name, capturable=False, dtype=dtype, tensor_lr=tensor_lr)
    device = train(name, capturable=True, dtype=dtype, tensor_lr=tensor_lr)
    assert_same(*host, *device, bitwise=dtype == torch.float32)
    steps = [device[1].state[p]["step"] for p in device[0]]
    assert [float(s) for s in steps] == [STEPS, STEPS - 2, STEPS, STEPS - 1]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_device_scalars_are_the_host_scalars_in_float32(name):
    """The same ``step_scalars`` over a tensor of 2000 counts: the float32 values the kernels
    of float32 parameters take are Python's exactly. In float64, torch's vectorised pow and
    sqrt differ from Python's math in the last bit for a few counts, which 1 - beta^k (the
    bias corrections) can magnify to about 1e-13 relative."""
    params = make_params(torch.float32)
    optimizer = build(name, params, capturable=True, tensor_lr=True)
    group = optimizer.param_groups[0]
    group["lr"].fill_(learning_rate(3))
    counts = torch.arange(1, 2001, dtype=torch.float32)
    device = optimizer.device_scalars(group, counts)
    for i, k in enumerate(counts.tolist()):
        for key, value in optimizer.scalars_for(group, k).items():
            entry = device[key]
            entry = float(entry[i] if torch.is_tensor(entry) and entry.ndim else entry)
            assert torch.tensor(entry).float() == torch.tensor(value).float(), (key, k)
            assert entry == pytest.approx(value, rel=1e-12, abs=0), (key, k)


@pytest.mark.parametrize("name", ["adana", "dana-star-mk4", "adamw", "ademamix"])
def test_capturable_bf16_state_rounds_as_the_host_step(name):
    """The random bits of the stochastic rounding are keyed by the step count, read on the
    device: the same bits as the host path's."""
    options = {"state_dtype": torch.bfloat16, "stochastic_rounding": True}
    host = train(name, capturable=False, dtype=torch.bfloat16, **options)
    device = train(name, capturable=True, dtype=torch.bfloat16, **options)
    assert_same(*host, *device)


@pytest.mark.parametrize("saved_capturable", [True, False])
def test_a_checkpoint_loads_into_the_other_mode_and_resumes_bitwise(saved_capturable):
    """The loading optimizer keeps its own ``capturable``; each step count moves where that
    mode keeps it."""
    reference = train("dana-star-mk4", capturable=False)
    params, saved = train("dana-star-mk4", capturable=saved_capturable, steps=3)
    buffer = io.BytesIO()
    torch.save(saved.state_dict(), buffer)
    buffer.seek(0)
    resumed = build("dana-star-mk4", params, capturable=not saved_capturable)
    resumed.load_state_dict(torch.load(buffer))
    assert resumed.param_groups[0]["capturable"] is not saved_capturable
    run_steps(resumed, params, range(3, STEPS))
    assert_same(*reference, params, resumed)


def test_capturable_refuses_flat_buffers():
    params = make_params(torch.float32)
    with pytest.raises(ValueError, match="drop flat=True or capturable=True"):
        ADana(params, capturable=True, flat=True)
    with pytest.raises(ValueError, match="drop flat=True or capturable=True"):
        DanaStar(params, capturable=True, flat=True, impl="compiled")


class HostReads(TorchDispatchMode):
    """Records every op that reads a tensor's value on the host (``.item()``, ``.tolist()``,
    ``float()``, ``bool()``) or takes or makes a tensor off the ``meta`` device (a copy from
    host data, a CPU scalar tensor)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_leaves((args, kwargs, result)) if isinstance(t, torch.Tensor)]
        if func is torch.ops.aten._local_scalar_dense.default or any(
                t.device.type != "meta" for t in tensors):
            self.seen.append(str(func))
        return result


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_capturable_step_reads_nothing_on_the_host(name):
    """On ``meta`` tensors (which hold no values: a host read raises), with a tensor LR on the
    device, counts that differ per tensor, and bf16 state for the rounding's random bits."""
    params = make_params(torch.float32, device="meta")
    optimizer = build(name, params, capturable=True, impl="reference")
    optimizer.add_param_group({"params": make_params(torch.float32, device="meta"),
                               "state_dtype": torch.bfloat16})
    for group in optimizer.param_groups:
        group["lr"] = torch.tensor(learning_rate(0), device="meta")
    for step in range(4):
        for group in optimizer.param_groups:
            set_grads(group["params"], step)
        with HostReads() as mode:
            optimizer.step()
        assert mode.seen == [], f"step {step} read the host: {mode.seen[:5]}"
    assert all(optimizer.state[p]["step"].device.type == "meta" for p in params)
    with pytest.raises(RuntimeError, match="meta"):  # a meta tensor has no value to read
        optimizer.state[params[0]]["step"].item()


def test_a_tensor_lr_must_be_on_the_parameters_device():
    params = make_params(torch.float32, device="meta")
    optimizer = ADana(params, capturable=True)
    optimizer.param_groups[0]["lr"] = torch.tensor(1e-3)
    set_grads(params, 0)
    with pytest.raises(ValueError, match="tensor lr must be on the parameters' device"):
        optimizer.step()


def test_compiled_capturable_step_equals_the_compiled_host_step():
    """One compiled function over the group's tensors, each taking its column of the packed
    scalars, gives the host path's compiled step (float32 scalars: the DANA family)."""
    host = train("dana-star-mk4", capturable=False, impl="compiled", steps=4)
    device = train("dana-star-mk4", capturable=True, impl="compiled", steps=4, tensor_lr=True)
    assert_same(*host, *device)


def cuda_params(seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(shape, device="cuda", generator=generator).requires_grad_()
            for shape in [*SHAPES, (1024, 257)]]


def cuda_grads(params, count):
    generator = torch.Generator(device="cuda").manual_seed(1)
    return [[torch.randn(p.shape, device="cuda", generator=generator) + 0.3 for p in params]
            for _ in range(count)]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["adana", "dana-mk4", "dana-star", "dana-star-mk4"])
def test_a_step_captured_in_a_cuda_graph_replays_the_eager_steps(name):
    """The compiled capturable step warmed up on a side stream, captured once, replayed with
    new gradients copied into the static ones and the tensor LR changed between replays."""
    cls, settings = OPTIMIZERS[name]
    warmup, replays = 3, 8
    eager_params, static_params = cuda_params(), cuda_params()
    grads = cuda_grads(eager_params, warmup + replays)
    eager = cls(eager_params, lr=learning_rate(0), impl="compiled", **settings)
    for step in range(warmup + replays):
        eager.param_groups[0]["lr"] = learning_rate(step)
        for param, grad in zip(eager_params, grads[step]):
            param.grad = grad.clone()
        eager.step()

    lr = torch.tensor(learning_rate(0), device="cuda")
    captured = cls(static_params, lr=lr, impl="compiled", capturable=True, **settings)
    for param in static_params:
        param.grad = torch.zeros_like(param)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for step in range(warmup):
            lr.fill_(learning_rate(step))
            torch._foreach_copy_([p.grad for p in static_params], grads[step])
            captured.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured.step()
    for step in range(warmup, warmup + replays):
        lr.fill_(learning_rate(step))
        torch._foreach_copy_([p.grad for p in static_params], grads[step])
        graph.replay()
    torch.cuda.synchronize()
    for expected, actual in zip(eager_params, static_params):
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-7)
    assert float(captured.state[static_params[0]]["step"]) == warmup + replays
