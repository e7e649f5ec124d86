"""bf16 optimizer state with stochastic rounding: the rounding itself, one step against the
float32 state, the paths against each other, and a resume that continues bitwise."""

import io

import pytest
import torch
from optim_variants import DECAY, OPTIMIZERS

from danastar.optim import AdamW, ADana, build_optimizer
from danastar.optim.rounding import random_integers, shard_layout, stochastic_round

SHAPES = [(16, 8), (8,), (3, 5, 2)]


def bracket(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 values next to float32 ``x``, from its bits (independent of the rounding's
    arithmetic): lo truncates toward zero, hi is the next bf16 value away from zero."""
    bits = x.view(torch.int32)
    low = bits & -65536
    return low.view(torch.float32), (low + 65536).view(torch.float32)


def spacing(x: torch.Tensor) -> torch.Tensor:
    low, high = bracket(x)
    return (high - low).abs()


def draws_for(x, steps, salt=7):
    layout = shard_layout(x)
    return [random_integers(x, step, salt, 1, layout)[0] for step in range(steps)]


def test_stochastic_rounding_is_unbiased():
    """Each rounding of x gives lo or hi (its bf16 neighbours), hi with probability
    f = (x - lo) / (hi - lo): the error e has mean 0 and variance f (1 - f) u² <= u²/4
    (u = hi - lo). The mean of N independent roundings is then within u / (2 √N) of x per
    standard deviation, and averaged over M values the relative error (mean - x) / u is within
    1 / (2 √(N M)). Six standard deviations, per value and over all: the draws are a fixed hash,
    so the test is deterministic; round-to-nearest, biased by up to u/2, fails it."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(512, generator=generator) * torch.logspace(-20, 20, 512)
    steps = 2048
    rounded = torch.stack([stochastic_round(x, draw).float() for draw in draws_for(x, steps)])
    low, high = bracket(x)
    assert torch.all((rounded == low) | (rounded == high))
    unit = spacing(x)
    error = (rounded.mean(0, dtype=torch.float64) - x.double()) / unit.double()
    assert error.abs().max() <= 6 / (2 * steps ** 0.5)
    assert error.mean().abs() <= 6 / (2 * (steps * x.numel()) ** 0.5)

    nearest = x.to(torch.bfloat16).float()
    nearest_error = (nearest.double() - x.double()) / unit.double()
    assert nearest_error.abs().max() > 6 / (2 * steps ** 0.5)


def test_stochastic_rounding_keeps_exact_and_special_values():
    """bf16 values (zeros with their sign, the largest finite one, infinities) come back as
    they are whatever the draw; NaN stays NaN."""
    largest = torch.finfo(torch.bfloat16).max
    values = torch.tensor([0.0, -0.0, 1.0, -2.5, largest, -largest, float("inf"),
                           float("-inf")])
    for fill in (0.0, 65535.0):
        rounded = stochastic_round(values, torch.full_like(values, fill)).float()
        assert torch.equal(rounded, values)
        assert torch.equal(rounded.signbit(), values.signbit())
    assert stochastic_round(torch.tensor([float("nan")]), torch.zeros(1)).isnan().all()


def test_compiled_rounding_draws_the_same_bits():
    """The compiled path (with inductor's precision casts kept) rounds as eager does, bit for
    bit: same random integers, same choice."""
    x = torch.randn(3, 1000, generator=torch.Generator().manual_seed(1))

    def round_all(x, step):
        draws = random_integers(x, step, 99, 3, shard_layout(x))
        return [stochastic_round(x * 1.1, draw) for draw in draws]

    eager = round_all(x, 5.0)
    compiled = torch.compile(round_all, fullgraph=True,
                             options={"emulate_precision_casts": True})(x, torch.tensor(5.0))
    for got, want in zip(compiled, eager):
        assert torch.equal(got, want)


def test_rounding_keeps_a_slow_average_moving():
    """An EMA with a small coefficient stalls in bf16 with round-to-nearest once a·(g - m) is
    below half a step of m; stochastic rounding keeps it on the float32 path on average."""
    target, a, steps = 1.0, 1e-3, 3000
    values = torch.zeros(4096)
    nearest = torch.zeros(4096, dtype=torch.bfloat16)
    exact = 0.0
    for step in range(steps):
        exact += a * (target - exact)
        updated = values + a * (target - values)
        values = stochastic_round(updated, random_integers(values, step, 3, 1,
                                                           shard_layout(values))[0]).float()
        nearest = (nearest.float() + a * (target - nearest.float())).to(torch.bfloat16)
    assert nearest.float().mean() < 0.5 * exact  # stalled far below
    assert values.mean().item() == pytest.approx(exact, rel=2e-3)


def make_params(dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator).to(dtype).requires_grad_()
            for shape in SHAPES]


def set_grads(params, generator):
    for param in params:
        param.grad = (torch.randn(param.shape, generator=generator) + 0.3).to(param.dtype)


def train(name, params, steps, impl="reference", optimizer=None, generator=None, **settings):
    cls, hparams = OPTIMIZERS[name]
    if optimizer is None:
        optimizer = cls(params, lr=1e-2, impl=impl, **hparams, **settings)
    generator = generator or torch.Generator().manual_seed(1)
    for _ in range(steps):
        set_grads(params, generator)
        optimizer.step()
    return optimizer


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_one_step_is_the_float32_step_with_the_state_rounded(name):
    """From zero state the first step computes in float32 exactly as the float32 state does,
    so the parameters are equal, and each bf16 buffer is one of the two bf16 neighbours of the
    float32 buffer."""
    reference_params, params = make_params(), make_params()
    reference = train(name, reference_params, 1)
    optimizer = train(name, params, 1, state_dtype=torch.bfloat16)
    for want, got in zip(reference_params, params):
        assert torch.equal(want, got)
        for key, buffer in optimizer.state[got].items():
            if key == "step":
                continue
            assert buffer.dtype == torch.bfloat16
            exact = reference.state[want][key]
            low, high = bracket(exact)
            assert torch.all((buffer.float() == low) | (buffer.float() == high)), key


@pytest.mark.process  # the compiled path builds its kernel with a C++ compiler
@pytest.mark.parametrize("name", [
    "dana-star-mk4", *(pytest.param(name, marks=pytest.mark.slow)
                       for name in ("dana-mk4", "adamw-decaying-wd", "ademamix"))])
def test_compiled_path_matches_the_reference(name):
    """Ten steps with bf16 state (and bf16 parameters stochastically rounded): the paths draw
    the same random bits, so they agree to float32 rounding of the working values."""
    reference_params = make_params(torch.bfloat16)
    train(name, reference_params, 10, state_dtype="bfloat16", stochastic_rounding=True)
    for impl in ["compiled"]:
        params = make_params(torch.bfloat16)
        train(name, params, 10, impl, state_dtype="bfloat16", stochastic_rounding=True)
        for got, want in zip(params, reference_params):
            # A working value one float32 ulp away flips a rounding with probability 2⁻¹⁶.
            assert (got != want).float().mean() <= 0.01, impl
            torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("name", ["dana-star-mk4", "adana", "ademamix", "adamw"])
@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16])
def test_resume_continues_bitwise(name, param_dtype):
    """Three steps, a state_dict through torch.save / torch.load(weights_only=True) into a fresh
    optimizer, three more: bitwise the run that was never interrupted."""
    settings = dict(state_dtype=torch.bfloat16, stochastic_rounding=True)
    straight = make_params(param_dtype)
    train(name, straight, 6, **settings)

    params = make_params(param_dtype)
    generator = torch.Generator().manual_seed(1)
    first = train(name, params, 3, generator=generator, **settings)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert saved["param_groups"][0]["state_dtype"] == torch.bfloat16
    resumed_params = [p.detach().clone().requires_grad_() for p in params]
    cls, hparams = OPTIMIZERS[name]
    with torch.random.fork_rng():
        torch.manual_seed(12345)  # another run's default seed: the saved seed must win
        resumed = cls(resumed_params, lr=1e-2, **hparams, **settings)
    resumed.load_state_dict(saved)
    train(name, resumed_params, 3, optimizer=resumed, generator=generator)
    for got, want in zip(resumed_params, straight):
        assert torch.equal(got, want)


def test_seed_is_per_group_and_drawn_from_torch_without_drawing():
    """The rounding seed follows torch.manual_seed (without consuming random numbers), can be
    set per group, and changes the rounding."""
    torch.manual_seed(5)
    before = torch.random.get_rng_state()
    first = ADana(make_params(), lr=1e-2, state_dtype="bfloat16")
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(5)
    again = ADana(make_params(), lr=1e-2, state_dtype="bfloat16")
    assert first.param_groups[0]["rounding_seed"] == again.param_groups[0]["rounding_seed"]

    runs = []
    for seed in (1, 1, 2):
        params = make_params()
        optimizer = ADana([{"params": params, "rounding_seed": seed}], lr=1e-2,
                          state_dtype="bfloat16")
        train("adana", params, 3, optimizer=optimizer)
        runs.append(optimizer.state[params[0]]["exp_avg"])
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def test_state_bytes_and_settings():
    params = make_params(torch.bfloat16)
    optimizer = build_optimizer("dana-star-mk4", params, lr=1e-2, state_dtype="bfloat16")
    train("dana-star-mk4", params, 1, optimizer=optimizer)
    state_bytes = sum(buffer.nbytes for state in optimizer.state.values()
                      for key, buffer in state.items() if key != "step")
    assert state_bytes == 3 * 2 * sum(p.numel() for p in params)
    mixed = ADana([{"params": params[:1], "state_dtype": torch.float32},
                   {"params": params[1:]}], lr=1e-2, state_dtype=torch.bfloat16)
    train("adana", params, 1, optimizer=mixed)
    assert mixed.state[params[0]]["exp_avg"].dtype == torch.float32
    assert mixed.state[params[1]]["exp_avg"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="state_dtype must be one of"):
        ADana(make_params(), lr=1e-2, state_dtype=torch.float16)


def test_state_dict_from_before_the_rounding_settings_loads():
    """A checkpoint written before these settings existed resumes with the defaults."""
    params = make_params()
    optimizer = train("adana", params, 2)
    saved = optimizer.state_dict()
    for group in saved["param_groups"]:
        for key in ("state_dtype", "stochastic_rounding", "rounding_seed"):
            del group[key]
    fresh = ADana(params, lr=1e-2, **DECAY)
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["state_dtype"] == torch.float32
    train("adana", params, 1, optimizer=fresh)


def test_adamw_is_torchs_update_and_the_registry_builds_it_for_bf16_state():
    """`AdamW` with float32 state steps as torch.optim.AdamW does (to float32 rounding); the
    registry's "adamw" is torch's unless the state dtype or stochastic rounding asks for ours."""
    ours, theirs = make_params(), make_params()
    optimizer = train("adamw", ours, 10)
    reference = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1)
    train("adamw", theirs, 10, optimizer=reference)
    for got, want in zip(ours, theirs):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert optimizer.state[ours[0]]["exp_avg"].dtype == torch.float32
    assert type(build_optimizer("adamw", make_params(), lr=1e-3)) is torch.optim.AdamW
    assert type(build_optimizer("adamw", make_params(), lr=1e-3,
                                state_dtype="bfloat16")) is AdamW


def test_which_optimizers_take_a_state_dtype():
    """danastar's own optimizers (and "adamw", through `AdamW`); not Muon, SGD or torch's."""
    from danastar.optim import registry

    assert registry.state_dtype_optimizers() == [
        "adana", "dana-mk4", "dana-star", "dana-star-mk4", "adamw", "adamw-decaying-wd",
        "ademamix", "ademamix-decaying-wd"]
    assert not any(registry.takes_state_dtype(name) for name in ("muon", "sgd", "torch:Adam"))
