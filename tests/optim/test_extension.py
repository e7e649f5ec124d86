"""Continuing a run past its planned T: the LR schedules (`extended_schedule`), the log-time
weight decay (`extended_weight_decay`, `extend_to`), and a plain loop across the join."""

import copy
import io
import math

import pytest
import torch

from danastar.hparams import (
    decay_multiplier,
    extended_coupled_weight_decay,
    extended_weight_decay,
)
from danastar.optim import (
    AdamW,
    ADana,
    AdEMAMix,
    DanaStar,
    apply_schedule,
    extend_optimizer,
    extended_schedule,
    get_schedule,
    param_groups,
)

W, T1, T2 = 10, 100, 400
DECAYING = ("cos_inf", "cos", "linear", "wsd")
ULP_OF_ONE = 2.0 ** -52


def largest_step(factor, steps) -> float:
    return max(abs(factor(n + 1) - factor(n)) for n in steps)


# -- the LR schedule -----------------------------------------------------------------------------

@pytest.mark.parametrize("rule", ["stretch", "reanchor", "rewarm"])
@pytest.mark.parametrize("name", DECAYING)
def test_an_extended_schedule_is_the_old_one_up_to_the_join_then_has_no_jump(name, rule):
    join = 60
    old = get_schedule(name, W, T1)
    new = extended_schedule(name, W, T1, T2, join, rule)
    assert [new(n) for n in range(join + 1)] == [old(n) for n in range(join + 1)]
    if rule == "rewarm":  # up to the peak by (1 - factor)/W a step, then the restarted decay
        restarted = get_schedule(name, W, T2 - join)
        bound = max((1 - old(join)) / W, largest_step(restarted, range(W, T2 - join)))
    else:  # never a step larger than the old schedule's largest
        bound = largest_step(old, range(W, T1 + 1))
    assert largest_step(new, range(join, T2 + 5)) <= bound + 1e-12
    assert new(T2) == new(T2 + 100) == old(T1 + 100)  # the old end factor, at the new end


def test_stretch_and_reanchor_by_hand_in_float64():
    # cos_inf, warm-up 10, planned 110, continued at 60 (factor 0.55) to 210
    stretched = extended_schedule("cos_inf", 10, 110, 210, 60, "stretch")
    # step 160 reads the old schedule at 60 + 100·50/150: 5/6 of its cosine
    assert stretched(160) == pytest.approx(0.1 + 0.45 * (1 - math.sqrt(3) / 2), rel=1e-15)
    reanchored = extended_schedule("cos_inf", 10, 110, 210, 60, "reanchor")
    # the planned cosine from 50/200 to 150/200 of its way, scaled to start at 0.55
    assert reanchored(160) == pytest.approx(0.1 + 0.45 * (3 - 2 * math.sqrt(2)), rel=1e-15)
    rewarmed = extended_schedule("cos_inf", 10, 110, 210, 60, "rewarm", rewarm_steps=20,
                                 peak=0.5)
    assert rewarmed(70) == pytest.approx(0.55 - 0.05 / 2, rel=1e-15)
    assert rewarmed(80) == 0.5 and rewarmed(210) == pytest.approx(0.5 * 0.1, rel=1e-15)


def test_a_warm_up_still_running_at_the_join_is_kept_as_planned():
    for rule in ("stretch", "reanchor"):
        new = extended_schedule("cos_inf", 50, T1, T2, 20, rule)
        assert [new(n) for n in range(51)] == [get_schedule("cos_inf", 50, T1)(n)
                                               for n in range(51)]
    # before its decay, wsd re-anchored is the schedule planned for the new total
    reanchored = extended_schedule("wsd", W, T1, T2, 50, "reanchor")
    assert [reanchored(n) for n in range(T2 + 1)] == [get_schedule("wsd", W, T2)(n)
                                                      for n in range(T2 + 1)]


def test_a_finished_cos_inf_run_stays_at_its_floor_unless_rewarmed():
    old = get_schedule("cos_inf", W, T1)
    for rule in ("stretch", "reanchor"):
        new = extended_schedule("cos_inf", W, T1, T2, T1, rule)
        assert [new(n) for n in range(T2 + 1)] == [old(n) for n in range(T2 + 1)]
    rewarmed = extended_schedule("cos_inf", W, T1, T2, T1, "rewarm")
    assert rewarmed(T1) == old(T1) == 1 / 100 / 0.1 and rewarmed(T1 + W) == 1.0
    assert rewarmed(T2) == old(T1)


@pytest.mark.parametrize("rule", ["stretch", "reanchor"])
@pytest.mark.parametrize("name", ["cos", "linear", "wsd"])
def test_a_finished_decay_is_not_continued_at_its_end_but_rewarmed(name, rule):
    with pytest.raises(ValueError, match=f"has finished its decay .* nothing left to {rule}; "
                                         "use rule 'rewarm'"):
        extended_schedule(name, W, T1, T2, T1, rule)
    old = get_schedule(name, W, T1)
    rewarmed = extended_schedule(name, W, T1, T2, T1, "rewarm", rewarm_steps=20)
    assert rewarmed(T1) == old(T1)
    assert rewarmed(T1 + 10) == pytest.approx(old(T1) + (1 - old(T1)) / 2, rel=1e-15)
    assert rewarmed(T2) == old(T1)


@pytest.mark.parametrize("name", ["none", "powerlaw"])
def test_a_schedule_free_of_the_total_goes_on_as_it_is(name):
    old = get_schedule(name, W, T1)
    for rule in ("stretch", "reanchor"):
        new = extended_schedule(name, W, T1, T2, T1, rule)
        assert [new(n) for n in range(T2 + 1)] == [old(n) for n in range(T2 + 1)]
    with pytest.raises(ValueError, match="does not depend on the total steps"):
        extended_schedule(name, W, T1, T2, T1, "rewarm")


@pytest.mark.parametrize("arguments, message", [
    ((T1, T1, T1), r"new_total_steps must be a whole number of optimizer steps greater than "
                   r"total_steps \(100\)"),
    ((T1, T2, T1 + 1), r"from_step must be at most total_steps \(100\)"),
    ((T1, T2, -1), "from_step must be a whole number of optimizer steps >= 0"),
    ((T1, 150.5, 50), "new_total_steps must be a whole number"),
])
def test_impossible_extensions_are_refused_in_one_sentence(arguments, message):
    with pytest.raises(ValueError, match=message):
        extended_schedule("cos_inf", W, *arguments)


def test_bad_rules_and_rewarms_are_refused():
    with pytest.raises(ValueError, match="rule must be one of stretch, reanchor, rewarm"):
        extended_schedule("cos_inf", W, T1, T2, 50, "restart")
    with pytest.raises(ValueError, match=r"rewarm_steps must be in 1 .. 300 \(the steps left\), "
                                         r"got 0 \(the run's warm-up"):
        extended_schedule("cos_inf", 0, T1, T2, T1, "rewarm")
    with pytest.raises(ValueError, match="peak must be > 0"):
        extended_schedule("cos_inf", W, T1, T2, T1, "rewarm", peak=0)


# -- the log-time weight decay -------------------------------------------------------------------

def test_the_decay_rules_by_hand_in_float64():
    # ADana(omega=4, total_steps=1000): wd_ts 100, weight_decay 0.04; finished, on to 4000
    weight_decay, wd_ts = 0.04, 100
    assert extended_weight_decay(weight_decay, wd_ts, 4000, 1000, "keep") == (0.04, 100)
    # reanchor: wd_ts 400 and ω' = 4·(400 + 1001)/(100 + 1001), so that at k = 1001 the decay
    # ω'/(400 + k) is the old 4/(100 + k)
    reanchored, new_wd_ts = extended_weight_decay(weight_decay, wd_ts, 4000, 1000, "reanchor")
    assert new_wd_ts == 400
    assert reanchored == pytest.approx(4 * 1401 / 1101 / 400, rel=1e-15)
    for factor in (1.0, 0.1):
        before = decay_multiplier(weight_decay, factor, 1001, wd_ts)
        assert before == pytest.approx(1 - 4 * factor / 1101, rel=1e-15)
        assert abs(decay_multiplier(reanchored, factor, 1001, 400) - before) <= ULP_OF_ONE
    # planned: the decay of a run planned for 4000 steps, ω kept: a jump down at the join
    assert extended_weight_decay(weight_decay, wd_ts, 4000, 1000, "planned") == (0.01, 400)
    assert 1 - decay_multiplier(0.01, 1.0, 1001, 400) == pytest.approx(4 / 1401, rel=1e-12)


def test_extending_twice_to_the_same_total_changes_nothing_and_no_time_scale_is_kept():
    once = extended_weight_decay(0.04, 100, 4000, 1000, "reanchor")
    assert extended_weight_decay(*once, 4000, 1500, "reanchor") == once
    assert extended_weight_decay(*once, 4000, 1500, "planned") == once
    assert extended_weight_decay(4e-4, None, 4000, 1000, "reanchor") == (4e-4, None)
    assert extended_weight_decay(0.0, 100, 4000, 1000, "planned") == (0.0, 100)


def test_a_coupled_decay_is_kept_or_takes_the_planned_runs():
    assert extended_coupled_weight_decay(0.1, 1000, 4000, "keep") == 0.1
    assert extended_coupled_weight_decay(0.1, 1000, 4000, "planned") == pytest.approx(0.025)
    with pytest.raises(ValueError, match="no time scale to re-anchor: use decay_rule 'keep'"):
        extended_coupled_weight_decay(0.1, 1000, 4000, "reanchor")
    with pytest.raises(ValueError, match="decay_rule must be one of keep, reanchor, planned"):
        extended_weight_decay(0.04, 100, 4000, 1000, "stretch")


# -- the optimizers ------------------------------------------------------------------------------

def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    inputs = torch.randn(16, 8, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True).sin()


def train(model, optimizer, schedule, steps) -> float:
    for step in steps:
        apply_schedule(optimizer, schedule(step))
        inputs, targets = batch(step)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


@pytest.mark.filterwarnings("ignore::danastar.optim.ShortRunWeightDecayWarning")
def test_a_plain_loop_extends_a_finished_adana_run_and_resumes_bitwise():
    planned, longer, warmup = 60, 100, 6  # short: the decay's warning is expected
    model = tiny_model()
    optimizer = ADana(param_groups(model), lr=1e-2, omega=4.0, total_steps=planned)
    first = train(model, optimizer, get_schedule("cos_inf", warmup, planned), range(planned))
    decaying = optimizer.param_groups[0]
    at_join = optimizer.scalars_for(decaying, planned + 1)["decay"]

    optimizer.extend_to(longer, decay_rule="reanchor")  # from the 300 steps taken
    schedule = extended_schedule("cos_inf", warmup, planned, longer, planned, "rewarm",
                                 rewarm_steps=10, peak=0.25)
    assert (decaying["wd_ts"], optimizer.param_groups[1]["weight_decay"]) == (10, 0.0)
    assert abs(optimizer.scalars_for(decaying, planned + 1)["decay"] - at_join) <= ULP_OF_ONE
    assert schedule(planned) == get_schedule("cos_inf", warmup, planned)(planned)
    train(model, optimizer, schedule, range(planned, planned + 5))

    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, saved)
    saved.seek(0)
    checkpoint = torch.load(saved, weights_only=True)
    resumed_model = tiny_model()
    resumed_model.load_state_dict(checkpoint["model"])
    resumed = ADana(param_groups(resumed_model), lr=1e-2, omega=4.0, total_steps=planned)
    resumed.load_state_dict(checkpoint["optimizer"])
    assert resumed.param_groups[0]["wd_ts"] == 10  # the extension travels with the state

    last = train(model, optimizer, schedule, range(planned + 5, longer))
    train(resumed_model, resumed, schedule, range(planned + 5, longer))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(),
                                                 resumed_model.parameters()))
    assert math.isfinite(last) and last < first * 2


def test_extend_to_changes_only_the_log_time_decay_of_each_optimizer():
    params = [torch.nn.Parameter(torch.ones(3, 3))]
    ademamix = AdEMAMix(params, lr=1e-3, betas=(0.9, 0.999, 0.992), alpha=2.0,
                        alpha_warmup=1000, beta3_warmup=1000, decaying_wd=True, omega=4.0,
                        total_steps=1000)
    before = dict(ademamix.param_groups[0])
    ademamix.extend_to(4000, from_step=1000, decay_rule="planned")
    after = ademamix.param_groups[0]
    assert (after["weight_decay"], after["wd_ts"]) == (0.01, 400)
    assert {k: v for k, v in after.items() if k not in ("weight_decay", "wd_ts")} == \
        {k: v for k, v in before.items() if k not in ("weight_decay", "wd_ts")}
    star = DanaStar([{"params": params, "weight_decay": 0.0}], lr=1e-3, wd_ts=100)
    star.extend_to(4000, decay_rule="reanchor")  # no decay in its one group: nothing to change
    assert (star.param_groups[0]["weight_decay"], star.param_groups[0]["wd_ts"]) == (0.0, 100)


@pytest.mark.parametrize("build", [
    lambda params: AdamW(params, lr=1e-3, weight_decay=0.1),
    lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1),
    lambda params: AdEMAMix(params, lr=1e-3, weight_decay=0.1),
])
def test_a_coupled_decay_is_kept_or_planned_and_cannot_be_reanchored(build):
    optimizer = build([torch.nn.Parameter(torch.ones(2, 2))])
    extend_optimizer(optimizer, 4000, from_step=1000)
    assert optimizer.param_groups[0]["weight_decay"] == 0.1
    with pytest.raises(ValueError, match=r"has no log-time weight decay \(wd_ts\) to re-anchor, "
                                         "so decay_rule 'reanchor' has nothing to change"):
        extend_optimizer(optimizer, 4000, from_step=1000, decay_rule="reanchor")
    with pytest.raises(ValueError, match="was set from a planned total that the optimizer does "
                                         "not know: pass planned_steps=T1"):
        extend_optimizer(optimizer, 4000, from_step=1000, decay_rule="planned")
    extend_optimizer(optimizer, 4000, from_step=1000, decay_rule="planned", planned_steps=1000)
    assert optimizer.param_groups[0]["weight_decay"] == 0.1 * 1000 / 4000
    assert optimizer.param_groups[0]["weight_decay"] == extended_coupled_weight_decay(
        0.1, 1000, 4000, "planned")


def test_a_planned_coupled_decay_is_set_once_across_a_resume_and_scaled_again_further_on():
    """The total a coupled decay is planned for travels with the param group: extending a
    resumed optimizer to the same T2 again (as a resumed loop or the Trainer's callback does)
    leaves λ·T1/T2, and extending it to T3 later gives λ·T1/T3 (the run planned for T3)."""
    param = torch.nn.Parameter(torch.ones(2, 2))
    optimizer = AdamW([param], lr=1e-3, weight_decay=4.0 / (1e-3 * 1000))  # ω/(γ·T1)
    planned = optimizer.param_groups[0]["weight_decay"]
    for _ in range(3):
        param.grad = torch.ones(2, 2)
        optimizer.step()
    optimizer.extend_to(2000, decay_rule="planned", planned_steps=1000)
    saved = copy.deepcopy(optimizer.state_dict())
    resumed = AdamW([torch.nn.Parameter(param.detach().clone())], lr=1e-3,
                    weight_decay=4.0 / (1e-3 * 1000))
    resumed.load_state_dict(saved)
    resumed.extend_to(2000, decay_rule="planned", planned_steps=1000)
    optimizer.extend_to(2000, decay_rule="planned", planned_steps=1000)
    assert resumed.param_groups[0]["weight_decay"] == optimizer.param_groups[0]["weight_decay"] \
        == planned * 1000 / 2000
    resumed.extend_to(8000, decay_rule="planned")  # the group knows it is planned for 2000 now
    assert resumed.param_groups[0]["weight_decay"] == pytest.approx(planned * 1000 / 8000,
                                                                    rel=1e-15)
    assert resumed.param_groups[0]["coupled_decay_total_steps"] == 8000


def test_extend_to_refuses_a_total_it_has_reached():
    param = torch.nn.Parameter(torch.ones(2, 2))
    optimizer = ADana([param], lr=1e-3, omega=4.0, total_steps=300)
    for _ in range(3):
        param.grad = torch.ones(2, 2)
        optimizer.step()
    with pytest.raises(ValueError, match=r"new_total_steps must be a whole number of optimizer "
                                         r"steps greater than from_step \(3\)"):
        optimizer.extend_to(3)
    with pytest.raises(ValueError, match="decay_rule must be one of keep, reanchor, planned"):
        optimizer.extend_to(600, decay_rule="stretch")
