"""Flat buffers (``flat=True``): one update over a group's flat tensors gives the per-tensor
path's values bit for bit, the parameters stay views of the flat tensor while the model trains,
and the layout survives what users do to a model and an optimizer (a None gradient, replaced
parameter data, a saved and loaded state dict)."""

import copy
import io

import pytest
import torch
from optim_variants import DECAY, OPTIMIZERS

from danastar.optim import ADana, AdEMAMix, DanaStar
from danastar.optim import flat as flat_module
from danastar.optim.flat import ALIGNMENT

OPTIMIZERS = {**OPTIMIZERS,
              "ademamix-decaying-wd": (AdEMAMix, {"decaying_wd": True, **DECAY})}
SHAPES = [(7, 5), (13,), (3, 4, 5), (1,), (33, 17)]  # none a multiple of the alignment


def make_params(dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).to(dtype).requires_grad_()
            for shape in SHAPES]


def set_grads(params, step, skip=()):
    generator = torch.Generator().manual_seed(100 + step)
    for i, param in enumerate(params):
        grad = torch.randn(param.shape, generator=generator).to(param.dtype)
        param.grad = None if i in skip else grad


def train(name, flat, impl="reference", steps=6, dtype=torch.float32, skip=None):
    """``steps`` steps of optimizer ``name``; ``skip``: step -> indices whose grad is None."""
    cls, settings = OPTIMIZERS[name]
    params = make_params(dtype)
    optimizer = cls(params, lr=1e-2, impl=impl, flat=flat, **settings)
    for step in range(steps):
        set_grads(params, step, (skip or {}).get(step, ()))
        optimizer.step()
    return params, optimizer


def assert_same(a_params, a_opt, b_params, b_opt):
    for a, b in zip(a_params, b_params):
        assert torch.equal(a, b)
        for key, value in a_opt.state[a].items():
            assert torch.equal(value, b_opt.state[b][key]), key


def flat_tensor(optimizer, group_index=0):
    return optimizer.runner(group_index).layout.param


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flat_step_equals_the_per_tensor_step_bitwise(name, dtype):
    """float32 parameters, and bf16 ones (float32 state, rounded to nearest on the write)."""
    per_tensor = train(name, flat=False, dtype=dtype)
    flat = train(name, flat=True, dtype=dtype)
    assert_same(*per_tensor, *flat)
    buffer = flat_tensor(flat[1])
    assert all(p.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
               for p in flat[0])


@pytest.mark.parametrize("name", ["adana", "dana-star-mk4", "ademamix"])
def test_large_tensors_keep_their_memory_and_step_beside_the_flat_one(name, monkeypatch):
    """Tensors above FLAT_MAX_NUMEL (here 40 elements: (3, 4, 5) and (33, 17)) are not copied
    into the flat buffer; the update runs over the flat tensor and them at once, equal to the
    per-tensor path."""
    monkeypatch.setattr(flat_module, "FLAT_MAX_NUMEL", 40)
    per_tensor = train(name, flat=False)
    params, optimizer = train(name, flat=True)
    assert_same(*per_tensor, params, optimizer)
    storage = flat_tensor(optimizer).untyped_storage().data_ptr()
    shares = [p.untyped_storage().data_ptr() == storage for p in params]
    assert shares == [True, True, False, True, False]


def test_compiled_flat_step_equals_the_compiled_per_tensor_step(monkeypatch):
    """One kernel over the flat tensor and a large one rounds as the per-tensor kernels do,
    the power T_eff^(1 - kappa) included (its vector and scalar-tail code alike)."""
    monkeypatch.setattr(flat_module, "FLAT_MAX_NUMEL", 100)
    assert_same(*train("dana-star-mk4", flat=False, impl="compiled"),
                *train("dana-star-mk4", flat=True, impl="compiled"))


def test_parameters_are_aligned_views_and_the_padding_stays_zero():
    params, optimizer = train("dana-star", flat=True)
    buffer = flat_tensor(optimizer)
    offsets = [(p.data_ptr() - buffer.data_ptr()) // buffer.element_size() for p in params]
    assert all(offset % ALIGNMENT == 0 for offset in offsets)
    used = torch.zeros(buffer.numel(), dtype=torch.bool)
    for param, offset in zip(params, offsets):
        used[offset:offset + param.numel()] = True
    layout = optimizer.runner(0).layout
    for flat in [buffer, layout.grad, *layout.buffers]:
        assert torch.count_nonzero(flat[~used]) == 0


def test_a_module_trains_on_the_flat_views_as_without_them():
    """The model's forward reads the flat tensor the update writes: losses equal bitwise."""
    def losses(flat):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.GELU(),
                                    torch.nn.Linear(9, 3))
        optimizer = ADana(model.parameters(), lr=1e-2, flat=flat, **DECAY)
        data = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
        out = []
        for _ in range(5):
            loss = model(data).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            out.append(loss.item())
        return out, model

    plain, flat = losses(False), losses(True)
    assert plain[0] == flat[0]
    for a, b in zip(plain[1].state_dict().values(), flat[1].state_dict().values()):
        assert torch.equal(a, b)


def test_a_none_gradient_and_the_counts_it_leaves_behind_step_per_tensor():
    """A step with a None grad skips that tensor (its count stays behind); later steps, whose
    counts then differ, run per tensor over the views; both equal the per-tensor path."""
    skip = {2: (1, 3)}
    assert_same(*train("adana", flat=False, skip=skip), *train("adana", flat=True, skip=skip))


def test_replaced_parameter_data_rebuilds_the_layout():
    """``p.data = ...`` (as ``module.to`` does) leaves the flat tensor: the next step lays the
    group out again, with the new values, and continues as the per-tensor path does."""
    runs = []
    for flat in (False, True):
        cls, settings = OPTIMIZERS["dana-star-mk4"]
        params = make_params()
        optimizer = cls(params, lr=1e-2, flat=flat, **settings)
        for step in range(4):
            if step == 2:
                params[2].data = params[2].data * 0.5
            set_grads(params, step)
            optimizer.step()
        runs.append((params, optimizer))
    assert_same(*runs[0], *runs[1])
    assert params[2].data_ptr() != params[3].data_ptr()
    assert params[2].untyped_storage().data_ptr() == flat_tensor(runs[1][1]).data_ptr()


@pytest.mark.parametrize("name", ["dana-star-mk4", "adamw"])
def test_a_saved_state_dict_resumes_bitwise(name):
    """Saved after 3 steps (through torch.save: views of one storage), loaded into a fresh
    flat optimizer over fresh parameters, 3 more steps equal 6 uninterrupted ones."""
    reference_params, reference = train(name, flat=True, steps=6)
    params, optimizer = train(name, flat=True, steps=3)
    saved = io.BytesIO()
    torch.save({"params": [p.detach() for p in params], "optimizer": optimizer.state_dict()},
               saved)
    saved.seek(0)
    loaded = torch.load(saved)
    cls, settings = OPTIMIZERS[name]
    resumed = [p.clone().requires_grad_() for p in loaded["params"]]
    resumed_optimizer = cls(resumed, lr=1e-2, flat=True, **settings)
    resumed_optimizer.load_state_dict(loaded["optimizer"])
    for step in range(3, 6):
        set_grads(resumed, step)
        resumed_optimizer.step()
    assert_same(reference_params, reference, resumed, resumed_optimizer)
    # A flat state dict loads into a per-tensor optimizer too (and the other way).
    plain = cls([p.clone().requires_grad_() for p in loaded["params"]], lr=1e-2, **settings)
    plain.load_state_dict(loaded["optimizer"])
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict()["state"][0].values(),
                                                 loaded["optimizer"]["state"][0].values()))


def test_refusals():
    with pytest.raises(ValueError, match="flat=True keeps float32 state"):
        ADana(make_params(), lr=1e-3, flat=True, state_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="flat=True keeps float32 state"):
        DanaStar(make_params(), lr=1e-3, flat=True, stochastic_rounding=True)
    mixed = make_params()[:2] + make_params(torch.bfloat16)[2:]
    optimizer = ADana(mixed, lr=1e-3, flat=True)
    set_grads(mixed, 0)
    with pytest.raises(ValueError, match="one device and dtype per param group"):
        optimizer.step()
    # A group of its own per dtype works.
    optimizer = ADana([{"params": mixed[:2]}, {"params": mixed[2:]}], lr=1e-3, flat=True)
    optimizer.step()
    assert all(optimizer.runner(i).layout is not None for i in (0, 1))


def test_a_state_dict_loaded_into_the_same_optimizer_lays_it_out_again():
    """Loading replaces the state tensors: the layout is forgotten and built from them, so the
    run continues from the loaded state, as the per-tensor optimizer does."""
    runs = []
    for flat in (False, True):
        params, optimizer = train("dana-star", flat=flat, steps=3)
        saved = copy.deepcopy(optimizer.state_dict())
        values = [p.detach().clone() for p in params]
        for step in range(3, 5):  # two steps that the load takes back
            set_grads(params, step)
            optimizer.step()
        optimizer.load_state_dict(saved)
        with torch.no_grad():
            for param, value in zip(params, values):
                param.copy_(value)
        for step in range(5, 7):
            set_grads(params, step)
            optimizer.step()
        runs.append((params, optimizer))
    assert_same(*runs[0], *runs[1])
