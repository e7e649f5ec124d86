"""What a PyTorch user expects of any torch.optim optimizer (the CPU items of torch's own suite)."""

import copy
import io

import pytest
import torch

from danastar.optim import AdamWDecayingWD, ADana, AdEMAMix, DanaStar, apply_schedule

OPTIMIZERS = {
    "adana": lambda params, **kw: ADana(params, **kw),
    "dana-mk4": lambda params, **kw: ADana(params, clipsnr=2.0, **kw),
    "dana-star": lambda params, **kw: DanaStar(params, **kw),
    "dana-star-mk4": lambda params, **kw: DanaStar(params, clipsnr=2.0, **kw),
    "adamw-decaying-wd": lambda params, **kw: AdamWDecayingWD(params, **kw),
    "ademamix": lambda params, **kw: AdEMAMix(params, alpha_warmup=20, beta3_warmup=20, **kw),
    "ademamix-decaying-wd": lambda params, **kw: AdEMAMix(params, alpha_warmup=20,
                                                          beta3_warmup=20, decaying_wd=True, **kw),
}
each_optimizer = pytest.mark.parametrize("name", list(OPTIMIZERS))


def problem(seed=0, dtype=torch.float32):
    """A small least-squares model: a weight matrix and a bias."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(64, 10, generator=generator)
    targets = inputs @ torch.randn(10, 3, generator=generator) + 0.5
    weight = torch.zeros(10, 3, dtype=dtype, requires_grad=True)
    bias = torch.zeros(3, dtype=dtype, requires_grad=True)

    def loss_fn():
        return ((inputs.to(dtype) @ weight + bias).float() - targets).square().mean()
    return [weight, bias], loss_fn


def run(optimizer, loss_fn, steps):
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@each_optimizer
def test_loss_decreases(name):
    params, loss_fn = problem()
    losses = run(OPTIMIZERS[name](params, lr=0.05), loss_fn, 60)
    assert losses[-1] < 0.2 * losses[0]


@each_optimizer
def test_state_dict_round_trip_continues_bitwise(name):
    params, loss_fn = problem()
    optimizer = OPTIMIZERS[name](params, lr=0.05, weight_decay=0.1, wd_ts=10)
    run(optimizer, loss_fn, 5)
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    twin_params, twin_loss_fn = problem()
    with torch.no_grad():
        for twin, param in zip(twin_params, params):
            twin.copy_(param)
    twin = OPTIMIZERS[name](twin_params, lr=0.05, weight_decay=0.1, wd_ts=10)
    twin.load_state_dict(saved)
    assert run(twin, twin_loss_fn, 5) == run(optimizer, loss_fn, 5)
    for a, b in zip(twin_params, params):
        assert torch.equal(a, b)


@each_optimizer
def test_param_groups_with_their_own_lr_and_weight_decay(name):
    """Each group behaves exactly as if it had an optimizer of its own with its settings."""
    settings = [{"lr": 0.05, "weight_decay": 0.2, "wd_ts": 10}, {"lr": 0.01, "weight_decay": 0.0}]

    def fresh():
        return [torch.linspace(-1, 1, 6).requires_grad_(), torch.linspace(0, 2, 4).requires_grad_()]

    def loss_of(tensor):  # one loss per tensor, so the groups do not interact
        return (tensor - 0.3).pow(4).sum()

    together = fresh()
    optimizer = OPTIMIZERS[name]([{"params": [p], **s} for p, s in zip(together, settings)],
                                 lr=0.5)
    for _ in range(5):
        optimizer.zero_grad()
        sum(loss_of(p) for p in together).backward()
        optimizer.step()
    for index, setting in enumerate(settings):
        alone = fresh()[index]
        single = OPTIMIZERS[name]([alone], **setting)
        for _ in range(5):
            single.zero_grad()
            loss_of(alone).backward()
            single.step()
        assert torch.equal(alone, together[index])
        assert optimizer.param_groups[index]["initial_lr"] == setting["lr"]


@each_optimizer
def test_none_grad_skips_the_tensor_and_its_step_count(name):
    first, second = torch.ones(4, requires_grad=True), torch.ones(4, requires_grad=True)
    optimizer = OPTIMIZERS[name]([first, second], lr=0.1, weight_decay=0.1, wd_ts=10)
    for _ in range(3):
        first.grad, second.grad = torch.full((4,), 0.5), None
        optimizer.step()
    assert torch.equal(second.detach(), torch.ones(4))
    assert second not in optimizer.state or not optimizer.state[second]
    assert optimizer.state[first]["step"].item() == 3
    # Its first real step is a first step (k = 1), as for a fresh optimizer.
    second.grad = torch.full((4,), 0.5)
    first.grad = None
    optimizer.step()
    fresh_param = torch.ones(4, requires_grad=True)
    fresh = OPTIMIZERS[name]([fresh_param], lr=0.1, weight_decay=0.1, wd_ts=10)
    fresh_param.grad = torch.full((4,), 0.5)
    fresh.step()
    assert torch.equal(second.detach(), fresh_param.detach())


@each_optimizer
def test_torch_lr_scheduler_matches_apply_schedule(name):
    """A torch scheduler and apply_schedule with the same factors give the same trajectory
    (the decaying weight decay reads the factor as lr / initial_lr)."""
    factors = [0.1, 0.55, 1.0, 0.8, 0.4, 0.2]
    with_scheduler, loss_a = problem()
    optimizer_a = OPTIMIZERS[name](with_scheduler, lr=0.05, weight_decay=0.3, wd_ts=10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer_a, lambda step: factors[step])
    with_helper, loss_b = problem()
    optimizer_b = OPTIMIZERS[name](with_helper, lr=0.05, weight_decay=0.3, wd_ts=10)
    for step in range(len(factors) - 1):
        run(optimizer_a, loss_a, 1)
        scheduler.step()
        apply_schedule(optimizer_b, factors[step])
        run(optimizer_b, loss_b, 1)
    for a, b in zip(with_scheduler, with_helper):
        assert torch.equal(a, b)
    assert optimizer_a.param_groups[0]["lr"] == pytest.approx(0.05 * factors[-1])


@pytest.mark.parametrize("make_scheduler", [
    lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
    lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10),
    lambda opt: torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=3),
        torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)], milestones=[3]),
], ids=["step", "cosine", "sequential"])
def test_works_with_torch_schedulers(make_scheduler):
    params, loss_fn = problem()
    optimizer = DanaStar(params, lr=0.05, weight_decay=0.1, wd_ts=10)
    scheduler = make_scheduler(optimizer)
    losses = []
    for _ in range(10):
        losses += run(optimizer, loss_fn, 1)
        scheduler.step()
    assert losses[-1] < losses[0]
    assert optimizer.param_groups[0]["initial_lr"] == 0.05


@each_optimizer
def test_closure_is_called_and_its_loss_returned(name):
    params, loss_fn = problem()
    optimizer = OPTIMIZERS[name](params, lr=0.05)
    calls = []

    def closure():
        calls.append(1)
        optimizer.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    assert calls == [1] and torch.is_tensor(loss) and loss.item() > 0
    assert optimizer.state[params[0]]["step"].item() == 1


@each_optimizer
def test_deepcopy_steps_identically(name):
    params, loss_fn = problem()
    optimizer = OPTIMIZERS[name](params, lr=0.05)
    run(optimizer, loss_fn, 3)
    twin = copy.deepcopy(optimizer)
    twin_params = twin.param_groups[0]["params"]
    assert twin_params[0] is not params[0]
    for param, twin_param in zip(params, twin_params):
        twin_param.grad = param.grad.clone()
    optimizer.step()
    twin.step()
    for param, twin_param in zip(params, twin_params):
        assert torch.equal(param, twin_param)


@each_optimizer
def test_repr_names_class_and_hyperparameters(name):
    optimizer = OPTIMIZERS[name](problem()[0], lr=0.05)
    text = repr(optimizer)
    assert type(optimizer).__name__ in text and "lr: 0.05" in text and "initial_lr" in text


@each_optimizer
def test_bf16_params_keep_float32_state(name):
    params, loss_fn = problem(dtype=torch.bfloat16)
    optimizer = OPTIMIZERS[name](params, lr=0.05)
    losses = run(optimizer, loss_fn, 30)
    assert losses[-1] < 0.5 * losses[0]
    assert all(p.dtype == torch.bfloat16 for p in params)
    for state in optimizer.state.values():
        buffers = {k: v for k, v in state.items() if k != "step"}
        assert buffers and all(v.dtype == torch.float32 for v in buffers.values())
    # Loading keeps float32 state too (torch would cast it to the parameter's dtype).
    twin = OPTIMIZERS[name](params, lr=0.05)
    twin.load_state_dict(optimizer.state_dict())
    for param in params:
        for key, value in optimizer.state[param].items():
            assert twin.state[param][key].dtype == value.dtype
            assert torch.equal(twin.state[param][key], value)


def test_step_hooks_run():
    params, loss_fn = problem()
    optimizer = ADana(params, lr=0.05)
    seen = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append("pre"))
    optimizer.register_step_post_hook(lambda opt, args, kwargs: seen.append("post"))
    run(optimizer, loss_fn, 1)
    assert seen == ["pre", "post"]
