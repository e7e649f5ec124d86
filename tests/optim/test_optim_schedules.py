"""LR schedules: pure functions of the step."""

import math

import pytest
import torch

from danastar.optim import ADana, apply_schedule, get_schedule
from danastar.optim.schedules import DECAY_TYPES, SCHEDULES


def test_cos_inf_warms_up_from_start_then_cosines_to_the_floor():
    factor = get_schedule("cos_inf", warmup_steps=10, total_steps=110)
    assert factor(0) == pytest.approx(0.01)
    assert factor(5) == pytest.approx(0.01 + 0.99 * 0.5)
    assert factor(10) == pytest.approx(1.0)
    assert factor(60) == pytest.approx(0.1 + 0.9 * 0.5)
    assert factor(110) == pytest.approx(0.1)
    assert factor(500) == pytest.approx(0.1)
    custom = get_schedule("cos_inf", 10, 110, floor=0.0, start=0.5)
    assert (custom(0), custom(110)) == (pytest.approx(0.5), pytest.approx(0.0))


def test_cos_and_linear_final_alias_sets_the_end_factor():
    cos = get_schedule("cos", 4, 104, final=0.0)
    linear = get_schedule("linear", 4, 104, final=0.2)
    assert cos(0) == pytest.approx(0.01) and linear(0) == pytest.approx(0.01)
    assert cos(3) == pytest.approx(1.0) and linear(3) == pytest.approx(1.0)  # peak at W - 1
    assert cos(103) == pytest.approx(0.0) and linear(103) == pytest.approx(0.2)


@pytest.mark.parametrize("decay_type", list(DECAY_TYPES))
def test_wsd_holds_then_decays_to_its_final_scale(decay_type):
    factor = get_schedule("wsd", 10, 200, decay_type=decay_type, wsd_final_lr_scale=0.1)
    assert factor(10) == factor(100) == factor(179) == factor(180) == 1.0
    assert factor(200) == factor(500) == 0.1
    values = [factor(step) for step in range(180, 201)]
    assert all(a >= b - 1e-12 for a, b in zip(values, values[1:]))
    assert 0.1 < factor(190) < 1
    assert get_schedule("wsd", 0, 100, decay_fraction=0.5, shape=decay_type)(75) == pytest.approx(
        DECAY_TYPES[decay_type](0.5, 0.0))


def test_powerlaw_warms_up_from_zero_then_decays_as_a_power():
    factor = get_schedule("powerlaw", 10, 1000, tau=20)
    assert factor(0) == 0.0 and factor(5) == pytest.approx(0.5)
    assert factor(10) == 1.0
    assert factor(90) == pytest.approx((1 + 80 / 20) ** -0.5)
    assert get_schedule("powerlaw", 10, 1000, rho=-1.0, tau=10)(30) == pytest.approx(1 / 3)


def test_none_is_constant():
    assert {get_schedule("none", 10, 100)(step) for step in (0, 5, 50, 1000)} == {1.0}


def test_schedules_are_pure():
    for name in SCHEDULES:
        factor = get_schedule(name, 5, 50)
        forward = [factor(step) for step in range(60)]
        backward = [factor(step) for step in reversed(range(60))][::-1]
        assert forward == backward and all(math.isfinite(v) and v >= 0 for v in forward)


@pytest.mark.parametrize("name, options, message", [
    ("cosine", {}, "valid schedules: cos_inf, cos, linear, wsd, powerlaw, none"),
    ("wsd", {"shape": "cubic"}, "valid decay types: linear, cosine, exp, miror_cosine, square"),
    ("cos_inf", {"flor": 0.1}, "bad option for schedule 'cos_inf'"),
])
def test_bad_names_and_options_raise_value_error(name, options, message):
    with pytest.raises(ValueError) as error:
        get_schedule(name, 10, 100, **options)
    assert message in str(error.value)


def test_apply_schedule_scales_every_groups_peak_lr():
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    optimizer = ADana([{"params": [a], "lr": 0.1}, {"params": [b]}], lr=0.02)
    apply_schedule(optimizer, 0.25)
    assert [g["lr"] for g in optimizer.param_groups] == [pytest.approx(0.025),
                                                         pytest.approx(0.005)]
    assert [g["initial_lr"] for g in optimizer.param_groups] == [0.1, 0.02]
