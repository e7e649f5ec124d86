"""The generic checks of PyTorch's own optimizer suite (TestOptimRenewed in its test/test_optim.py)
that danastar's optimizers used to miss: an old-format ``step`` in a loaded state dict, torch's
list of invalid inputs with torch's exception types, construction from param groups that carry
their own lr, and load-state-dict hooks kept on load."""

import copy
import warnings

import pytest
import torch
from test_optim_conformance import OPTIMIZERS, each_optimizer, problem, run
from torch.nn import Parameter

from danastar.optim.base import DEFAULT_LR


def primed(name, steps=3, **kwargs):
    """An optimizer over two (2, 3) parameters with fixed gradients, stepped ``steps`` times."""
    generator = torch.Generator().manual_seed(0)
    params = [Parameter(torch.randn(2, 3, generator=generator)) for _ in range(2)]
    for param in params:
        param.grad = torch.rand(2, 3, generator=generator)
    optimizer = OPTIMIZERS[name](params, **kwargs)
    for _ in range(steps):
        optimizer.step()
    return optimizer, params


@each_optimizer
def test_load_nontensor_step(name):
    # torch's older format kept `step` as a plain number; it must load and keep stepping, exactly
    # as from the same state with tensor steps.
    optimizer, params = primed(name, lr=0.01)
    state_dict = optimizer.state_dict()
    old_format = copy.deepcopy(state_dict)
    for state in old_format["state"].values():
        state["step"] = state["step"].item()
    assert all(type(state["step"]) is float for state in old_format["state"].values())

    results = []
    for saved in (state_dict, old_format):
        fresh = [Parameter(p.detach().clone()) for p in params]
        for copy_, param in zip(fresh, params):
            copy_.grad = param.grad.clone()
        loaded = OPTIMIZERS[name](fresh, lr=0.01)
        loaded.load_state_dict(saved)
        for param in fresh:
            step = loaded.state[param]["step"]
            assert torch.is_tensor(step) and step.dtype == torch.float32 and step.item() == 3
        loaded.step()
        loaded.step()
        assert all(loaded.state[param]["step"].item() == 5 for param in fresh)
        results.append([p.detach().clone() for p in fresh])
    for tensor_steps, float_steps in zip(*results):
        assert torch.equal(tensor_steps, float_steps)


def torch_error_inputs():
    """torch's generic invalid inputs (common_optimizers.get_error_inputs_for_all_optims), plus
    the lr checks every torch optimizer makes: (params, kwargs, exception type, message)."""
    a, b = Parameter(torch.randn(1, 1)), Parameter(torch.randn(1, 1))
    return [
        (a, {}, TypeError, "params argument given to the optimizer should be an iterable"),
        ([a, a], {}, UserWarning, "a parameter group with duplicate parameters"),
        ([{"params": a}, {"params": a}], {}, ValueError,
         "some parameters appear in more than one parameter group"),
        ([a], {"lr": torch.tensor([0.001, 0.001])}, ValueError, "Tensor lr must be 1-element"),
        ([("weight", a), b], {}, ValueError,
         "all optimizer params should be with/without names"),
        ([{"params": [a], "lr": 1e-2}, {"params": [("weight", b)]}], {}, ValueError,
         "all optimizer param groups should be with/without names"),
        ([a], {"lr": -1e-2}, ValueError, "lr must be >= 0"),
        ([], {}, ValueError, "optimizer got an empty parameter list"),
        ([torch.randn(2, requires_grad=True) * 2], {}, ValueError,
         "can't optimize a non-leaf Tensor"),
    ]


@each_optimizer
def test_errors(name):
    for params, kwargs, error_type, message in torch_error_inputs():
        if issubclass(error_type, Warning):
            with pytest.warns(error_type, match=message):
                OPTIMIZERS[name](params, **kwargs)
        else:
            with pytest.raises(error_type, match=message):
                OPTIMIZERS[name](params, **kwargs)


@each_optimizer
def test_one_element_tensor_lr_is_accepted(name):
    params, loss_fn = problem()
    optimizer = OPTIMIZERS[name](params, lr=torch.tensor(0.05))
    losses = run(optimizer, loss_fn, 10)
    assert losses[-1] < 0.9 * losses[0]


@each_optimizer
def test_default_lr_is_torchs_1e_3(name):
    params, _ = problem()
    optimizer = OPTIMIZERS[name](params)
    assert [group["lr"] for group in optimizer.param_groups] == [DEFAULT_LR] == [1e-3]


@each_optimizer
def test_param_groups_weight_decay(name):
    # Every group carries its own lr (and the weight its own weight decay): no default needed.
    (weight, bias), loss_fn = problem()
    optimizer = OPTIMIZERS[name]([
        {"params": [weight], "lr": 0.05, "weight_decay": 0.1, "wd_ts": 10},
        {"params": [bias], "lr": 0.05, "weight_decay": 0.0}])
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    losses = run(optimizer, loss_fn, 15)
    assert losses[-1] < 0.8 * losses[0]


@each_optimizer
def test_param_group_with_lrscheduler_goes_right_direction(name):
    (weight, bias), loss_fn = problem()
    optimizer = OPTIMIZERS[name]([{"params": [weight], "lr": 0.05},
                                  {"params": [bias], "lr": 0.02}])
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    losses = []
    for _ in range(15):
        losses += run(optimizer, loss_fn, 1)
        scheduler.step()
    assert losses[-1] < 0.8 * losses[0]
    assert [g["lr"] for g in optimizer.param_groups] == [pytest.approx(0.05 / 8),
                                                         pytest.approx(0.02 / 8)]


@each_optimizer
def test_load_state_dict_keeps_what_the_hooks_did(name):
    optimizer, params = primed(name, lr=0.01)
    saved = optimizer.state_dict()
    target, _ = primed(name, steps=0, lr=0.01)

    def pre_hook(opt, state_dict):  # a pre-hook may rewrite the state dict it is given
        state_dict = copy.deepcopy(state_dict)
        for state in state_dict["state"].values():
            state["step"] = state["step"] + 10
        return state_dict

    def post_hook(opt):  # and a post-hook may change the optimizer after loading
        for state in opt.state.values():
            state["marked"] = True
        opt.param_groups[0]["lr"] = 0.5

    target.register_load_state_dict_pre_hook(pre_hook)
    target.register_load_state_dict_post_hook(post_hook)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        target.load_state_dict(saved)
    steps = [state["step"].item() for state in target.state.values()]
    assert steps == [13.0, 13.0]
    assert all(state["marked"] for state in target.state.values())
    assert target.param_groups[0]["lr"] == 0.5
    assert all(saved["state"][i]["step"].item() == 3 for i in saved["state"])  # input untouched
    target.step()
    assert [state["step"].item() for state in target.state.values()] == [14.0, 14.0]
