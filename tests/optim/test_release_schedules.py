"""The schedules against the original release's own formulas, step by step.

The reference functions below are written from the release's src/optim/schedule.py and main.py
(where `cos`/`linear` are torch's OneCycleLR): they are kept deliberately literal, with the
release's argument order and rounding, so that any drift in danastar's versions shows up.
"""

import json
import math

import pytest
import torch

from danastar.cli import main as danastar_main
from danastar.config import load_config, schedule_options
from danastar.errors import UserError
from danastar.optim import get_schedule
from danastar.optim.schedules import DECAY_TYPES, SCHEDULE_OPTIONS, SCHEDULES

# -- the release's formulas --------------------------------------------------------------------


def release_cos_inf(n_iterations, n_warmup, div_factor, final_div_factor, n_inf):
    max_lr = 1.0
    base_lr = max_lr / div_factor
    final_lr = base_lr / final_div_factor
    n_anneal_steps = n_iterations - n_inf

    def schedule(step):
        if step < n_warmup:
            return (step / n_warmup) + (1 - step / n_warmup) / div_factor
        elif step < n_anneal_steps:
            t = (step - n_warmup) / (n_anneal_steps - n_warmup)
            return final_lr + 0.5 * (max_lr - final_lr) * (1 + math.cos(math.pi * t))
        return final_lr
    return schedule


def release_wsd(n_iterations, final_lr_factor=0.0, n_warmup=1000, init_div_factor=100,
                fract_decay=0.1, decay_type="linear"):
    n_anneal_steps = int(fract_decay * n_iterations)
    n_hold = n_iterations - n_anneal_steps

    def schedule(step):
        if step < n_warmup:
            return (step / n_warmup) + (1 - step / n_warmup) / init_div_factor
        elif step < n_hold:
            return 1.0
        elif step < n_iterations:
            progress = (step - n_hold) / n_anneal_steps
            linear = final_lr_factor + (1 - final_lr_factor) * (1 - progress)
            cosine = final_lr_factor + (1 - final_lr_factor) * (
                1 + math.cos(math.pi * progress)) * 0.5
            return {
                "linear": linear,
                "exp": final_lr_factor ** progress,
                "cosine": cosine,
                "miror_cosine": linear * 2 - cosine,
                "square": final_lr_factor + (1 - final_lr_factor) * (1 - progress ** 2),
                "sqrt": final_lr_factor + (1 - final_lr_factor) * (1 - math.sqrt(progress)),
            }[decay_type]
        return final_lr_factor
    return schedule


def release_powerlaw(n_iterations, n_warmup, init_value=1.0, saturation_value=0.0, power=-0.5,
                     time_scale=1.0):
    def schedule(step):
        if step < n_warmup:
            return (step / n_warmup) * init_value
        value = init_value * ((1.0 + (step - n_warmup) / time_scale) ** power)
        return max(value, saturation_value) if power < 0 else min(value, saturation_value)
    return schedule


def torch_one_cycle(anneal, total, warmup, final_div_factor=1.0, max_lr=1.0):
    """The LR torch's OneCycleLR gives at steps 0 .. total-1, built as the release's main.py
    builds it."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=max_lr)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=[max_lr], total_steps=total, pct_start=warmup / total,
        anneal_strategy=anneal, cycle_momentum=False, div_factor=1e2,
        final_div_factor=final_div_factor)
    lrs = []
    for step in range(total):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        if step < total - 1:
            scheduler.step()
    return lrs


def ours(name, warmup, total, **options):
    factor = get_schedule(name, warmup, total, **options)
    return [factor(step) for step in range(total)]


# -- cos / linear ------------------------------------------------------------------------------

@pytest.mark.parametrize("anneal", ["cos", "linear"])
@pytest.mark.parametrize("total, warmup", [(40, 4), (40, 0), (37, 3), (10, 2), (7, 7), (1, 0),
                                           (100, 29), (1000, 20)])
@pytest.mark.parametrize("final_div_factor", [1.0, 0.1, 25.0])
def test_cos_and_linear_equal_torch_one_cycle_at_every_step(anneal, total, warmup,
                                                            final_div_factor):
    expected = torch_one_cycle(anneal, total, warmup, final_div_factor)
    assert ours(anneal, warmup, total, final_div_factor=final_div_factor) == expected


def test_one_cycle_scaled_by_a_peak_lr_matches_torch_to_rounding():
    expected = torch_one_cycle("cos", 40, 4, max_lr=3e-4)
    assert [3e-4 * f for f in ours("cos", 4, 40)] == pytest.approx(expected, rel=1e-14)


def test_one_cycle_defaults_end_at_a_hundredth_and_hold_there():
    for anneal in ("cos", "linear"):
        factor = get_schedule(anneal, 4, 40)
        assert factor(0) == pytest.approx(0.01) and factor(3) == pytest.approx(1.0)
        assert factor(39) == pytest.approx(0.01) and factor(40) == factor(1000) == factor(39)


def test_one_cycle_with_a_single_warmup_step_peaks_at_step_zero():
    # torch's OneCycleLR divides by zero here; the one warm-up step is the peak.
    factor = get_schedule("cos", 1, 10)
    assert factor(0) == 1.0 and factor(9) == pytest.approx(0.01)


# -- cos_inf -----------------------------------------------------------------------------------

@pytest.mark.parametrize("total, warmup, options", [
    (40, 4, {}),
    (40, 0, {}),
    (40, 4, {"div_factor": 10.0, "final_div_factor": 1.0, "cos_inf_steps": 8}),
    (40, 4, {"cos_inf_steps": 36}),  # the cosine phase is empty
    (37, 5, {"final_div_factor": 0.5}),
])
def test_cos_inf_follows_the_release(total, warmup, options):
    release = {"div_factor": 1e2, "final_div_factor": 0.1, "cos_inf_steps": 0} | options
    expected = release_cos_inf(total, warmup, release["div_factor"], release["final_div_factor"],
                               release["cos_inf_steps"])
    got = ours("cos_inf", warmup, total, **options)
    assert got[:total] == pytest.approx([expected(s) for s in range(total)], rel=1e-14)
    factor = get_schedule("cos_inf", warmup, total, **options)
    assert [factor(s) for s in range(total, total + 5)] == pytest.approx(
        [expected(s) for s in range(total, total + 5)], rel=1e-14)


# -- wsd ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("decay_type", list(DECAY_TYPES))
@pytest.mark.parametrize("total, warmup, fract, final", [
    (40, 4, 0.1, 0.0),
    (40, 0, 0.1, 0.0),
    (37, 3, 0.1, 0.0),  # 3.7 decay steps: rounded down to 3
    (100, 10, 0.29, 0.1),  # 0.29 * 100 is 28.999999999999996 in floats: 28 decay steps
    (20, 2, 0.0, 0.0),  # no decay at all
    (20, 12, 0.5, 0.2),  # the warm-up runs into the decay phase
    (10, 0, 1.0, 0.05),
])
def test_wsd_follows_the_release(decay_type, total, warmup, fract, final):
    expected = release_wsd(total, final_lr_factor=final, n_warmup=warmup, init_div_factor=1e2,
                           fract_decay=fract, decay_type=decay_type)
    factor = get_schedule("wsd", warmup, total, wsd_fract_decay=fract, wsd_final_lr_scale=final,
                          decay_type=decay_type)
    steps = range(total + 3)
    assert [factor(s) for s in steps] == pytest.approx([expected(s) for s in steps], rel=1e-14)


def test_wsd_decay_length_is_rounded_down():
    factor = get_schedule("wsd", 0, 100, wsd_fract_decay=0.29)
    assert factor(71) == 1.0 and factor(72) == 1.0 and factor(73) < 1.0  # 28 steps, not 29
    assert get_schedule("wsd", 0, 37)(33) == 1.0 and get_schedule("wsd", 0, 37)(34) == 1.0


def test_wsd_exp_is_the_final_factor_to_the_progress():
    factor = get_schedule("wsd", 0, 20, decay_type="exp", wsd_final_lr_scale=0.01)
    assert factor(18) == 1.0 and factor(19) == pytest.approx(0.01 ** 0.5)
    zero = get_schedule("wsd", 0, 20, decay_type="exp")  # 0 ** q: 1 at the decay's start, then 0
    assert (zero(18), zero(19), zero(20)) == (1.0, 0.0, 0.0)


# -- powerlaw ----------------------------------------------------------------------------------

@pytest.mark.parametrize("total, warmup, options", [
    (40, 4, {}),
    (40, 0, {}),
    (40, 4, {"powerlaw_init_value": 0.5, "powerlaw_saturation_value": 0.1,
             "powerlaw_power": -1.0, "powerlaw_time_scale": 3.0}),
    (40, 4, {"powerlaw_init_value": 0.1, "powerlaw_saturation_value": 1.0,
             "powerlaw_power": 0.5, "powerlaw_time_scale": 2.0}),  # growth up to a ceiling
])
def test_powerlaw_follows_the_release(total, warmup, options):
    release = {"init_value": 1.0, "saturation_value": 0.0, "power": -0.5, "time_scale": 1.0}
    release |= {key.removeprefix("powerlaw_"): value for key, value in options.items()}
    expected = release_powerlaw(total, warmup, **release)
    assert ours("powerlaw", warmup, total, **options) == pytest.approx(
        [expected(s) for s in range(total)], rel=1e-14)


# -- defaults and names ------------------------------------------------------------------------

def test_option_tables_list_each_schedules_signature_defaults():
    import inspect

    from danastar.optim import schedules
    for name, options in SCHEDULE_OPTIONS.items():
        function = schedules.one_cycle if name in ("cos", "linear") else SCHEDULES[name]
        parameters = inspect.signature(function).parameters
        assert {key: parameters[key].default for key in options} == options


def test_earlier_option_names_still_work():
    assert get_schedule("cos_inf", 4, 40, start=0.01, floor=0.1)(20) == pytest.approx(
        get_schedule("cos_inf", 4, 40)(20))
    assert ours("wsd", 4, 40, decay_fraction=0.2, shape="cosine") == ours(
        "wsd", 4, 40, wsd_fract_decay=0.2, decay_type="cosine")
    assert ours("powerlaw", 4, 40, rho=-1.0, tau=5.0) == ours(
        "powerlaw", 4, 40, powerlaw_power=-1.0, powerlaw_time_scale=5.0)


# -- the config: flags, dotted overrides, YAML, dry run ----------------------------------------

RELEASE_FLAGS = ["--scheduler", "wsd", "--wsd_fract_decay", "0.2", "--wsd_final_lr_scale", "0.1",
                 "--decay_type", "miror_cosine"]


def test_release_schedule_flags_dotted_overrides_and_yaml_agree(tmp_path):
    from_flags, _ = load_config(RELEASE_FLAGS)
    from_dotted, _ = load_config(["optim.scheduler=wsd", "optim.wsd_fract_decay=0.2",
                                  "optim.wsd_final_lr_scale=0.1", "optim.decay_type=miror_cosine"])
    path = tmp_path / "run.yaml"
    path.write_text("optim:\n  scheduler: wsd\n  wsd_fract_decay: 0.2\n  wsd_final_lr_scale: 0.1\n"
                    "  decay_type: miror_cosine\n")
    from_yaml, _ = load_config(["--config", str(path)])
    expected = {"wsd_fract_decay": 0.2, "wsd_final_lr_scale": 0.1, "decay_type": "miror_cosine"}
    for config in (from_flags, from_dotted, from_yaml):
        assert schedule_options(config) == expected


def test_final_div_factor_default_depends_on_the_schedule():
    for scheduler, value in (("cos_inf", 0.1), ("cos", 1.0), ("linear", 1.0)):
        config, _ = load_config(["--scheduler", scheduler])
        assert schedule_options(config)["final_div_factor"] == value
    config, _ = load_config(["--scheduler", "cos", "--final_div_factor", "10"])
    assert schedule_options(config) == {"div_factor": 100.0, "final_div_factor": 10.0}


@pytest.mark.parametrize("argv, message", [
    (["--scheduler", "cos", "--wsd_fract_decay", "0.2"],
     "optim.wsd_fract_decay (--wsd_fract_decay) applies to --scheduler wsd, not cos"),
    (["--powerlaw_power", "-1"], "applies to --scheduler powerlaw, not cos_inf"),
    (["--scheduler", "wsd", "--div_factor", "10"],
     "applies to --scheduler cos_inf or cos or linear, not wsd"),
    (["--scheduler", "wsd", "--decay_type", "cubic"], "optim.decay_type 'cubic' is not known"),
    (["--scheduler", "wsd", "--wsd_fract_decay", "1.5"], "must be between 0 and 1"),
    (["--final_div_factor", "0"], "must be greater than 0"),
    (["--scheduler", "powerlaw", "--powerlaw_power", "0.5"], "--powerlaw_saturation_value 1"),
])
def test_bad_schedule_options_are_one_sentence(argv, message):
    with pytest.raises(UserError, match="^.*" + message.replace("(", r"\(").replace(")", r"\)")):
        load_config(argv)


def test_dry_run_shows_the_schedule_options(capsys):
    assert danastar_main(["train", *RELEASE_FLAGS, "--dry_run", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["schedule"] == {"name": "wsd", "wsd_fract_decay": 0.2, "wsd_final_lr_scale": 0.1,
                                 "decay_type": "miror_cosine"}
    assert shown["config"]["optim"]["decay_type"] == "miror_cosine"
