"""The optimizers at their edges: a run too short for its log-time weight decay (the factor stays
in [0, 1] on every path, and one warning names the fix), complex and integer parameters (refused
in one sentence), another optimizer's state (refused at load_state_dict, naming where it comes
from), and a learning rate that is not a number."""

import warnings

import pytest
import torch

from danastar.hparams import (
    SHORT_RUN_MAX_SHARE,
    SHORT_RUN_STEPS,
    decay_multiplier,
    early_decay_share,
    short_run_warning,
)
from danastar.optim import (
    AdamW,
    AdamWDecayingWD,
    ADana,
    AdEMAMix,
    DanaStar,
    ShortRunWeightDecayWarning,
    build_optimizer,
    log_time_weight_decay,
)
from danastar.optim.group_scalars import decay_multiplier as torch_decay_multiplier
from danastar.optim.runners import compiled_available

# Every constructor with the independent, decaying weight decay.
DECAYING = {
    "adana": ADana,
    "dana-star": DanaStar,
    "adamw-decaying-wd": AdamWDecayingWD,
    "ademamix-decaying-wd": lambda params, **kw: AdEMAMix(params, decaying_wd=True, **kw),
}
# The paths a group can step on, as constructor options.
PATHS = {
    "reference": {"impl": "reference"},
    "flat": {"impl": "reference", "flat": True},
    "capturable": {"impl": "reference", "capturable": True},
    "bf16-state": {"impl": "reference", "state_dtype": torch.bfloat16},
}


def supports(build, options) -> bool:
    """Whether the optimizer ``build`` makes has the path ``options`` ask for."""
    probe = quiet(build, [torch.zeros(1, requires_grad=True)])
    return options.get("impl") in type(probe).supported_impls()


def quiet(build, *args, **kwargs):
    """Build an optimizer without the short-run warning (tested on its own below)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShortRunWeightDecayWarning)
        return build(*args, **kwargs)


def decay_only(optimizer, params, steps):
    """Weights after each of ``steps`` steps with zero gradients: the decay alone moves them."""
    trace = []
    for _ in range(steps):
        for param in params:
            param.grad = torch.zeros_like(param)
        optimizer.step()
        trace.append([param.detach().clone() for param in params])
    return trace


# -- 1. a run too short for its log-time weight decay --------------------------------------------

def test_the_factor_is_clamped_to_zero_and_one_for_numbers_and_tensors():
    # omega 4 over wd_ts 1 (T = 10): the paper's factors are 1 - 4/(1 + k) = -1, -1/3, 0, 0.2
    assert [decay_multiplier(4.0, 1.0, k, 1) for k in (1, 2, 3, 4)] == pytest.approx(
        [0.0, 0.0, 0.0, 0.2])
    assert decay_multiplier(2.0, 1.0, 1, None) == 0.0  # a constant decay over 1 too
    assert decay_multiplier(0.5, -1.0, 1, None) == 1.0  # and never above 1
    ks = torch.tensor([1.0, 2.0, 3.0, 4.0, 100.0], dtype=torch.float64)  # the capturable path
    factors = torch_decay_multiplier(4.0, 1.0, ks, 1)
    assert factors.tolist() == [decay_multiplier(4.0, 1.0, float(k), 1) for k in ks.tolist()]
    assert factors.min() >= 0 and factors.max() <= 1


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("name", list(DECAYING))
def test_a_short_run_zeroes_a_weight_instead_of_flipping_it_on_every_path(name, path):
    """ADana(lr=1e-9, omega=4, total_steps=10) with zero gradients took a weight 1 -> -1 ->
    0.33 -> 0; now the factor of the first three steps is 0, then 0.2, on every path."""
    if not supports(DECAYING[name], PATHS[path]):
        pytest.skip(f"{name} has no {path} path")
    params = [torch.ones(3, requires_grad=True), torch.full((2, 2), 2.0, requires_grad=True)]
    optimizer = quiet(DECAYING[name], params, lr=1e-9, omega=4.0, total_steps=10,
                      **PATHS[path])
    trace = decay_only(optimizer, params, 4)
    for step in trace:
        for value in step:
            assert value.min() >= 0, (path, step)
    assert all(torch.equal(value, torch.zeros_like(value)) for value in trace[0])


@pytest.mark.parametrize("name", list(DECAYING))
def test_every_path_gives_the_same_clamped_weights(name):
    """Gradients and a decay whose factors cross 0 (omega 4 over wd_ts 3: 1 - 4/4 = 0, then
    positive; and wd_ts 2 with a schedule factor of 0.6 on the first step): every path agrees
    with the reference loop."""
    results = {}
    for path, options in PATHS.items():
        if not supports(DECAYING[name], options):
            continue
        torch.manual_seed(0)
        params = [torch.randn(5, requires_grad=True), torch.randn(3, 4, requires_grad=True)]
        optimizer = quiet(DECAYING[name], params, lr=1e-2, weight_decay=2.0, wd_ts=2,
                          **options)
        generator = torch.Generator().manual_seed(1)
        for step in range(6):
            for group in optimizer.param_groups:
                group["lr"] = group["initial_lr"] * (0.6 if step == 0 else 1.0)
            for param in params:
                param.grad = torch.randn(param.shape, generator=generator)
            optimizer.step()
        results[path] = [param.detach().clone() for param in params]
    reference = results.pop("reference")
    for path, values in results.items():
        tolerance = 1e-2 if path == "bf16-state" else 1e-6
        for got, want in zip(values, reference):
            torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance, msg=path)


@pytest.mark.slow
@pytest.mark.process  # torch.compile starts its compiler
@pytest.mark.skipif(not compiled_available(), reason="torch.compile is unavailable here")
def test_the_compiled_path_clamps_as_the_reference_does():
    params = {path: [torch.ones(4, requires_grad=True)] for path in ("reference", "compiled")}
    trace = {}
    for path, group in params.items():
        optimizer = quiet(ADana, group, lr=1e-9, omega=4.0, total_steps=10, impl=path)
        trace[path] = decay_only(optimizer, group, 4)
    for got, want in zip(trace["compiled"], trace["reference"]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert torch.equal(trace["compiled"][0][0], torch.zeros(4))


def test_the_early_share_and_its_threshold():
    """The share removed in the first 5 steps at the schedule's peak, for the paper's omega 4:
    over half under 280 steps, under half from 280 (the CPU preset's 300 included)."""
    def share(total_steps):
        return early_decay_share(*log_time_weight_decay(4.0, total_steps))

    assert SHORT_RUN_STEPS == 5 and SHORT_RUN_MAX_SHARE == 0.5
    assert share(10) == share(20) == 1.0  # the factor is 0 at the first step
    assert share(100) == pytest.approx(1 - (7 * 8 * 9 * 10 * 11) / (11 * 12 * 13 * 14 * 15))
    assert share(279) > SHORT_RUN_MAX_SHARE > share(280) > share(300)
    assert share(1000) < 0.2 and share(5000) < 0.05
    assert short_run_warning(*log_time_weight_decay(4.0, 300), fix="x") is None
    assert short_run_warning(0.0, 1, fix="x") is None and short_run_warning(0.1, None, "x") is None


@pytest.mark.parametrize("name", list(DECAYING))
def test_a_short_run_is_warned_of_once_per_construction_naming_the_fix(name):
    params = [{"params": [torch.zeros(3, requires_grad=True)]},
              {"params": [torch.zeros(3, requires_grad=True)]}]
    with pytest.warns(ShortRunWeightDecayWarning) as caught:
        DECAYING[name](params, lr=1e-3, omega=4.0, total_steps=20)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert caught[0].filename == __file__  # it points at the caller's line
    assert "\n" not in message
    for fragment in ("omega 4 over wd_ts = 2 steps", "removes all of every decaying weight in "
                     "its first 5 steps", "a longer total_steps, a smaller omega, or omega=0"):
        assert fragment in message
    with pytest.warns(ShortRunWeightDecayWarning, match="weight_decay=0 for a smoke test"):
        DECAYING[name]([torch.zeros(3, requires_grad=True)], weight_decay=4.0, wd_ts=1)


def test_what_is_not_warned_of():
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShortRunWeightDecayWarning)
        ADana([torch.zeros(3, requires_grad=True)], lr=1e-3, omega=4.0, total_steps=1000)
        ADana([torch.zeros(3, requires_grad=True)], lr=1e-3, omega=0.0, total_steps=10)
        ADana([{"params": [torch.zeros(3, requires_grad=True)], "weight_decay": 0.0}],
              lr=1e-3, omega=4.0, total_steps=10)  # no group decays
        AdEMAMix([torch.zeros(3, requires_grad=True)], weight_decay=0.1)  # coupled decay
        build_optimizer("adamw", [torch.zeros(3, requires_grad=True)], lr=1e-3)


# -- 2. complex and integer parameters ------------------------------------------------------------

EVERY = {
    "ADana": ADana, "DanaStar": DanaStar, "AdamW": AdamW, "AdamWDecayingWD": AdamWDecayingWD,
    "AdEMAMix": AdEMAMix,
}


@pytest.mark.parametrize("name", list(EVERY))
@pytest.mark.parametrize("dtype, fragment", [
    (torch.complex64, "update real parameters only"),
    (torch.complex128, "torch.view_as_complex"),
    (torch.int64, "floating-point parameters only"),
    (torch.bool, "floating-point parameters only"),
])
def test_a_parameter_the_update_would_get_wrong_is_refused(name, dtype, fragment):
    param = torch.zeros(3, dtype=dtype)
    with pytest.raises(ValueError, match=fragment) as error:
        EVERY[name]([torch.zeros(2, requires_grad=True), param])
    assert "\n" not in str(error.value)
    assert f"a parameter of dtype {str(dtype).removeprefix('torch.')} and shape (3,)" in str(
        error.value)
    optimizer = EVERY[name]([torch.zeros(2, requires_grad=True)])
    with pytest.raises(ValueError, match=fragment):
        optimizer.add_param_group({"params": [param]})
    assert len(optimizer.param_groups) == 1  # the refused group is not kept


def test_a_complex_parameter_is_refused_where_it_took_a_wrong_step():
    """ADana moved a complex64 parameter along the real axis for a gradient of 1j (torch's Adam
    moves it to 1 - 0.5j); DanaStar failed inside clamp. Both now refuse it when built."""
    for build in (ADana, DanaStar, lambda p: build_optimizer("dana-star-mk4", p, lr=0.5)):
        with pytest.raises(ValueError, match="complex64"):
            build([torch.ones(1, dtype=torch.complex64, requires_grad=True)])


# -- 3. another optimizer's state ----------------------------------------------------------------

def stepped(build, **kwargs):
    param = torch.ones(4, requires_grad=True)
    optimizer = quiet(build, [param], **kwargs)
    param.grad = torch.full((4,), 0.5)
    optimizer.step()
    return optimizer


FOREIGN = [
    # (loading into, the state's optimizer, what the refusal says it came from)
    (ADana, DanaStar, "DanaStar"),
    (ADana, torch.optim.AdamW, "torch.optim.AdamW"),
    (ADana, torch.optim.Adam, "torch.optim.Adam"),
    (ADana, AdEMAMix, "AdEMAMix"),
    (DanaStar, ADana, "ADana"),
    (DanaStar, torch.optim.SGD, "torch.optim.SGD"),
    (AdamWDecayingWD, ADana, "ADana"),
    (AdamWDecayingWD, torch.optim.AdamW, "torch.optim.AdamW"),
    (AdamW, AdamWDecayingWD, "AdamWDecayingWD"),
    (AdEMAMix, AdamW, "AdamW"),
    (AdEMAMix, torch.optim.RMSprop, "another optimizer (its param groups hold"),
]


@pytest.mark.parametrize("target, source, origin", FOREIGN,
                         ids=[f"{t.__name__}<-{s.__name__}" for t, s, _ in FOREIGN])
def test_another_optimizers_state_is_refused_at_load_naming_where_it_comes_from(target, source,
                                                                               origin):
    saved = stepped(source, lr=0.1).state_dict()
    optimizer = stepped(target, lr=0.1)
    before = {key: value.clone() for key, value in
              optimizer.state[optimizer.param_groups[0]["params"][0]].items()}
    with pytest.raises(ValueError) as error:
        optimizer.load_state_dict(saved)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{target.__name__}.load_state_dict: this state dict comes from "
                              f"{origin}")
    assert f"not from {target.__name__}" in message
    # nothing was loaded: the optimizer steps on with its own state and hyperparameters
    state = optimizer.state[optimizer.param_groups[0]["params"][0]]
    assert all(torch.equal(state[key], value) for key, value in before.items())
    optimizer.param_groups[0]["params"][0].grad = torch.ones(4)
    optimizer.step()


@pytest.mark.parametrize("build", [ADana, DanaStar, AdamW, AdamWDecayingWD, AdEMAMix,
                                   lambda p, **kw: AdEMAMix(p, decaying_wd=True, **kw)])
@pytest.mark.parametrize("options", [{}, {"flat": True}, {"state_dtype": torch.bfloat16}],
                         ids=["plain", "flat", "bf16-state"])
def test_an_optimizers_own_state_still_loads(build, options):
    saved = stepped(build, lr=0.1, **options).state_dict()
    fresh = stepped(build, lr=0.1, **options)
    fresh.load_state_dict(saved)
    fresh.param_groups[0]["params"][0].grad = torch.ones(4)
    fresh.step()


def test_a_state_saved_before_the_first_step_loads_into_either_dana_optimizer():
    """Before a step ADana's and DanaStar's state dicts hold the same keys: nothing to refuse."""
    ADana([torch.ones(2, requires_grad=True)]).load_state_dict(
        DanaStar([torch.ones(2, requires_grad=True)]).state_dict())


# -- 6. the learning rate ------------------------------------------------------------------------

@pytest.mark.parametrize("lr, message", [
    ("1e-3", "lr must be >= 0 (a number), got '1e-3'"),
    (-1e-3, "lr must be >= 0, got -0.001"),
    (None, "lr must be >= 0 (a number), got None"),
])
def test_a_learning_rate_that_is_not_a_number_at_least_zero_is_refused(lr, message):
    for build in EVERY.values():
        with pytest.raises(ValueError) as error:
            build([torch.zeros(2, requires_grad=True)], lr=lr)
        assert str(error.value) == message
    optimizer = ADana([torch.zeros(2, requires_grad=True)])
    with pytest.raises(ValueError, match="lr must be"):
        optimizer.add_param_group({"params": [torch.zeros(2, requires_grad=True)], "lr": lr})
