"""`--iterations T2 --extend RULE` continues a stopped or finished run past its planned total:
the LR schedule by `extended_schedule` (with the run's own warm-up), the weight decay by
`extend_optimizer`, the extension recorded in run.json so that a later resume continues it
bitwise; without --extend a longer run whose past depends on the total is refused, naming it."""

import json
import shutil

import pytest
import torch

from danastar.cli import main as danastar_main
from danastar.config import default_run_dir, load_config
from danastar.hparams import stretched_schedule
from danastar.optim import extended_schedule, get_schedule
from danastar.rundir.status import read_status

from train_helpers import (
    TINY,
    assert_ok,
    assert_stopped_with_work_left,
    compared,
    metrics,
    run_train,
)

PEAK = 3e-3  # TINY's --lr


def logged_lr(run_dir) -> dict[int, float]:
    return {m["step"]: m["lr"] for m in metrics(run_dir) if "lr" in m}


def extensions(run_dir) -> list[dict]:
    return json.loads((run_dir / "run.json").read_text()).get("extensions", [])


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """An ADana cos_inf run finished at its planned 10 steps."""
    run_dir = tmp_path_factory.mktemp("extend") / "finished"
    assert_ok(run_train(["--iterations", "10"], run_dir))
    return run_dir


@pytest.mark.slow
def test_a_finished_run_extended_to_twice_its_steps_completes_and_resumes_bitwise(
        finished, tmp_path):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    for copy in (whole, stopped):
        shutil.copytree(finished, copy)
    args = ["--iterations", "20", "--extend", "stretch"]
    assert_ok(run_train(args, whole))
    assert read_status(whole)["state"] == "complete"
    # the decay kept is recorded with the extension: the identity is a 20-step plan's
    planned = json.loads((finished / "run.json").read_text())["identity"]
    assert extensions(whole) == [{"from_step": 10, "from_iterations": 10, "iterations": 20,
                                  "schedule_rule": "stretch", "decay_rule": "keep",
                                  "warmup_steps": 0, "weight_decay": planned["weight_decay"],
                                  "wd_ts": planned["wd_ts"]}]
    identity = json.loads((whole / "run.json").read_text())["identity"]
    assert (identity["wd_ts"], planned["wd_ts"]) == (2, 1)
    # stopped mid-way, then the same command again: bitwise the uninterrupted extension
    assert_stopped_with_work_left(run_train([*args, "--iterations_to_run", "4"], stopped))
    resumed = run_train(args, stopped)
    assert_ok(resumed)
    assert compared(stopped) == compared(whole)
    assert extensions(stopped) == extensions(whole)  # recorded once
    # the LR is the library's extension of the planned schedule (a finished cos_inf run stays
    # at its floor): no jump at the join
    schedule = extended_schedule("cos_inf", 0, 10, 20, from_step=10, rule="stretch")
    lr = logged_lr(whole)
    assert sorted(lr) == list(range(1, 21))
    assert all(lr[step] == pytest.approx(PEAK * schedule(step - 1), rel=1e-12) for step in lr)
    assert lr[11] == pytest.approx(lr[12]) and lr[11] == pytest.approx(
        PEAK * get_schedule("cos_inf", 0, 10)(10))


@pytest.mark.slow
@pytest.mark.parametrize("schedule", [["--scheduler", "cos"], ["--scheduler", "linear"],
                                      ["--scheduler", "wsd", "--wsd_fract_decay", "0.5"]],
                         ids=["cos", "linear", "wsd"])
def test_a_finished_run_on_a_schedule_that_ends_low_is_rewarmed_and_resumes_bitwise(
        schedule, tmp_path):
    """`--extend` alone (rewarm) on a finished cos, linear or wsd run: the LR climbs from where
    the planned schedule ended, as the library's rewarm says, and a stop mid-way resumes to
    the uninterrupted extension bit for bit."""
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert_ok(run_train(["--iterations", "6", *schedule], whole))
    shutil.copytree(whole, stopped)
    args = ["--iterations", "12", *schedule, "--extend"]
    assert_ok(run_train(args, whole))
    assert_stopped_with_work_left(run_train([*args, "--iterations_to_run", "3"], stopped))
    assert_ok(run_train(args, stopped))
    assert compared(stopped) == compared(whole)
    [extension] = extensions(whole)
    assert (extension["schedule_rule"], extension["decay_rule"]) == ("rewarm", "keep")
    name, options = schedule[1], ({"wsd_fract_decay": 0.5} if schedule[1] == "wsd" else {})
    longer = extended_schedule(name, 0, 6, 12, from_step=6, rule="rewarm",
                               rewarm_steps=extension["rewarm_steps"], **options)
    lr = logged_lr(whole)
    assert sorted(lr) == list(range(1, 13))
    assert all(lr[step] == pytest.approx(PEAK * longer(step - 1), rel=1e-12, abs=1e-18)
               for step in lr)
    assert lr[7] == pytest.approx(PEAK * get_schedule(name, 0, 6, **options)(6), abs=1e-18)
    assert lr[8] > lr[7]  # the climb back up


@pytest.mark.slow
def test_without_extend_a_longer_run_is_refused_naming_the_flag(finished):
    before = (finished / "metrics.jsonl").read_text()
    result = run_train(["--iterations", "20"], finished)
    assert result.returncode == 2, result.stdout + result.stderr
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message, message
    assert "iterations: 10 → 20 (the cos_inf schedule" in message, message
    assert "pass --extend (rewarm: measured best for a run that finished" in message, message
    assert (finished / "metrics.jsonl").read_text() == before


@pytest.mark.slow
def test_stretching_a_finished_cos_run_is_refused_naming_rewarm(tmp_path):
    run_dir = tmp_path / "cos"
    assert_ok(run_train(["--iterations", "6", "--scheduler", "cos"], run_dir))
    before = (run_dir / "metrics.jsonl").read_text()
    result = run_train(["--iterations", "12", "--scheduler", "cos", "--extend", "stretch"],
                       run_dir)
    assert result.returncode == 2, result.stdout + result.stderr
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message, message
    assert "--extend stretch cannot continue this run from step 6 to 12 steps" in message
    assert "use --extend rewarm" in message, message
    assert (run_dir / "metrics.jsonl").read_text() == before


@pytest.mark.slow
def test_a_stopped_run_reanchored_keeps_its_warm_up_and_reanchors_its_decay(tmp_path):
    """Stopped at step 30 of 100 (warm-up 2 = 100 // 50), continued to 200 by reanchor: the
    warm-up stays 2 (not 200 // 50), the LR goes on without a jump, and the log-time decay
    takes the new time scale wd_ts = 20 at the same strength at the join; then extended again,
    to 300."""
    run_dir = tmp_path / "run"
    quiet = ["--eval_interval", "100", "--log_interval", "1"]
    assert_stopped_with_work_left(run_train(
        [*quiet, "--iterations", "100", "--iterations_to_run", "30"], run_dir))
    assert_stopped_with_work_left(run_train(
        [*quiet, "--iterations", "200", "--extend", "reanchor", "--extend_decay", "reanchor",
         "--iterations_to_run", "6"], run_dir))
    schedule = extended_schedule("cos_inf", 2, 100, 200, from_step=30, rule="reanchor")
    lr = logged_lr(run_dir)
    assert sorted(lr) == list(range(1, 37))
    assert all(lr[step] == pytest.approx(PEAK * schedule(step - 1), rel=1e-12) for step in lr)
    assert lr[31] == pytest.approx(PEAK * get_schedule("cos_inf", 2, 100)(30), rel=1e-12)
    state = torch.load(next((run_dir / "checkpoints").glob("latest-00000036")) / "state.pt",
                       map_location="cpu", weights_only=False)
    group = next(g for g in state["optimizer"]["param_groups"] if g["weight_decay"])
    planned = json.loads((run_dir / "run.json").read_text())
    assert group["wd_ts"] == 20 and planned["identity"]["wd_ts"] == 20
    (recorded,) = planned["extensions"]  # the decay the optimizer holds, as run.json says it
    assert (recorded["weight_decay"], recorded["wd_ts"]) == (group["weight_decay"], 20)
    omega = planned["identity"]["omega"]
    before = omega / 10 / (1 + 31 / 10)  # ω/wd_ts over (1 + k/wd_ts) at the join's k = 31
    assert group["weight_decay"] / (1 + 31 / 20) == pytest.approx(before, rel=1e-12)

    # a second extension stacks on the first: 200 → 300 from step 36 by stretch, with the
    # warm-up still the first plan's (2, not 200 // 50 = 4 of the record's identity)
    assert_stopped_with_work_left(run_train(
        [*quiet, "--iterations", "300", "--extend", "stretch", "--iterations_to_run", "4"],
        run_dir))
    assert [(e["from_step"], e["iterations"], e["warmup_steps"])
            for e in extensions(run_dir)] == [(30, 200, 2), (36, 300, 2)]
    stacked = stretched_schedule(schedule, 36, 200, 300)
    lr = logged_lr(run_dir)
    assert sorted(lr) == list(range(1, 41))
    assert all(lr[step] == pytest.approx(PEAK * stacked(step - 1), rel=1e-12) for step in lr)
    assert lr[37] == pytest.approx(PEAK * schedule(36), rel=1e-12)


@pytest.mark.slow
def test_an_automatic_run_directory_finds_the_run_it_extends(tmp_path, monkeypatch, capsys):
    """Without --run_dir: the dry run plans the extension there, the extended run continues in
    its own `-it<T>` directory, and the same command (or --iterations without --extend) finds
    it again."""
    monkeypatch.chdir(tmp_path)

    def train(*argv):
        code = danastar_main(["train", *TINY, *argv])
        out = capsys.readouterr()
        return code, out.out + out.err

    base = default_run_dir(load_config([*TINY, "--iterations", "6"])[0])
    assert train("--iterations", "6")[0] == 0
    first = base.with_name(f"{base.name}-it3")
    code, said = train("--iterations", "3")
    assert code == 0 and f"its own directory, {first}" in said, said
    assert "too short for it" in said  # the log-time decay's warning, about its first steps
    code, said = train("--iterations", "5", "--extend", "stretch", "--dry_run")
    assert code == 0 and "5 steps × 256 tokens" in said, said
    assert ("extension    extended past its planned total: from step 3, 3 → 5 steps, the LR "
            "schedule by --extend stretch" in said and f"run dir      {first} " in said), said
    assert "too short for it" not in said  # those steps are behind an extended run
    stretched = extended_schedule("cos_inf", 0, 3, 5, from_step=3, rule="stretch")
    assert ("the LR's factor of the peak: " + ", ".join(
        f"{stretched(step - 1):.3g} at step {step}" for step in (3, 4, 5))) in said, said
    for argv in (["--extend", "stretch"], ["--extend", "stretch"], []):
        code, said = train("--iterations", "5", *argv)
        assert code == 0 and f"run directory {first};" in said and "too short" not in said, said
    assert [e["iterations"] for e in extensions(first)] == [5]
    assert max(m["step"] for m in metrics(first)) == 5
    assert sorted(path.name for path in base.parent.iterdir()) == [base.name, first.name]


@pytest.mark.slow
def test_log_time_ademamix_keeps_its_planned_hyperparameters_when_extended(tmp_path, capsys):
    """β3 = 1 − δ/T, α = T^(1−κ) and their warm-ups follow from T: an extension keeps them as
    the checkpoint holds them (the library's rule); another --kappa is refused, naming it."""
    run_dir = str(tmp_path / "run")

    def train(*argv):
        code = danastar_main(["train", *TINY, "--opt", "ademamix", "--run_dir", run_dir, *argv])
        out = capsys.readouterr()
        return code, out.out + out.err

    assert train("--iterations", "10")[0] == 0
    code, said = train("--iterations", "20", "--extend", "stretch", "--kappa", "0.9")
    assert code == 2 and "alpha: " in said and "more than --iterations changed" in said, said
    code, said = train("--iterations", "20", "--extend", "stretch")
    assert code == 0, said
    state = torch.load(tmp_path / "run" / "checkpoints" / "latest-00000020" / "state.pt",
                       map_location="cpu", weights_only=False)
    group = state["optimizer"]["param_groups"][0]
    assert group["betas"][2] == pytest.approx(1 - 8 / 10, rel=1e-12)  # δ = 8 over T1 = 10
    assert (group["alpha_warmup"], group["beta3_warmup"]) == (10, 10)
    assert group["alpha"] == pytest.approx(10 ** (1 - 0.85), rel=1e-12)


def test_a_resume_from_before_the_join_is_refused_naming_the_checkpoint_to_put_back(tmp_path):
    """An extended run whose checkpoints from the join on are gone has only the planned run's
    older ones: resuming one would train the steps up to the join under the extension. Refused,
    nothing written."""
    run_dir = tmp_path / "run"
    keep = ["checkpoint.latest_every=2", "checkpoint.keep_latest=4"]
    assert_ok(run_train([*keep, "--iterations", "6"], run_dir))
    args = [*keep, "--iterations", "12", "--extend", "stretch"]
    assert_stopped_with_work_left(run_train([*args, "--iterations_to_run", "2"], run_dir))
    for step in (6, 8):  # the join's checkpoint and the extension's
        shutil.rmtree(run_dir / "checkpoints" / f"latest-{step:08d}")
    before = (run_dir / "metrics.jsonl").read_text()
    result = run_train(args, run_dir)  # (--dry_run checks the resume by the same function)
    assert result.returncode == 2, result.stdout + result.stderr
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message, message
    assert "the newest usable checkpoint is at step 4, before this run was extended at " \
           "step 6" in message, message
    assert "put a checkpoint from step 6 or later back" in message, message
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_adamw_takes_a_planned_runs_coupled_decay_and_refuses_to_reanchor_it(tmp_path, capsys):
    """AdamW's coupled λ = ω/(γ·T) has no time scale: `--extend_decay reanchor` is refused,
    naming keep and planned; `planned`, its default, holds λ·T1/T2 from the join on (recorded
    in run.json, held again, not scaled twice, by a resume after the join); a --weight_decay
    given is a constant that no rule changes (its default: keep)."""
    run_dir = str(tmp_path / "run")

    def train(*argv, directory=run_dir):
        code = danastar_main(["train", *TINY, "--opt", "adamw", "--run_dir", directory, *argv])
        out = capsys.readouterr()
        return code, out.out + out.err

    def held_decay(step):
        state = torch.load(tmp_path / "run" / "checkpoints" / f"latest-{step:08d}" / "state.pt",
                           map_location="cpu", weights_only=False)
        return {g["weight_decay"] for g in state["optimizer"]["param_groups"]} - {0}

    assert train("--iterations", "6")[0] == 0
    (planned_for_t1,) = held_decay(6)
    code, said = train("--iterations", "12", "--extend", "rewarm", "--extend_decay", "reanchor")
    assert code == 2 and len(said.strip().splitlines()) == 1, said
    assert "adamw's coupled decay ω/(γ·T) has none; use --extend_decay keep" in said, said
    code, said = train("--iterations", "12", "--extend", "rewarm", "--dry_run")
    assert code == 0 and "the weight decay by --extend_decay planned" in said, said  # default
    extend = ["--iterations", "12", "--extend", "rewarm", "--extend_decay", "planned"]
    code, said = train(*extend, "--iterations_to_run", "2")
    assert code == 75, said
    (held,) = held_decay(8)
    assert held == pytest.approx(planned_for_t1 * 6 / 12, rel=1e-15)
    (extension,) = extensions(tmp_path / "run")
    assert (extension["weight_decay"], extension["wd_ts"]) == (held, None)
    identity = json.loads((tmp_path / "run" / "run.json").read_text())["identity"]
    assert identity["weight_decay"] == pytest.approx(extension["weight_decay"], rel=1e-12)
    code, said = train(*extend, "--dry_run")
    assert code == 0 and (f"the run's own goes on at {held:.3g} by --extend_decay planned"
                          in said), said
    assert train(*extend)[0] == 0
    assert held_decay(12) == held_decay(8)

    given = str(tmp_path / "given")
    assert train("--iterations", "6", "optim.weight_decay=0.1", directory=given)[0] == 0
    code, said = train(*extend, "optim.weight_decay=0.1", directory=given)
    assert code == 2 and "adamw's is a constant (given by optim.weight_decay)" in said, said
    code, said = train(*extend[:4], "optim.weight_decay=0.1", "--dry_run", directory=given)
    assert code == 0 and "the weight decay by --extend_decay keep" in said, said  # its default


def test_extend_rewarm_sets_the_climbs_length(tmp_path, capsys):
    """`--extend_rewarm N` climbs back to the peak over N steps (the library's rewarm_steps),
    is recorded, and is refused without `--extend rewarm`, past the steps left, or changed on a
    resume of the extended run."""
    run_dir = str(tmp_path / "run")

    def train(*argv):
        code = danastar_main(["train", *TINY, "--run_dir", run_dir, "--log_interval", "1",
                              *argv])
        out = capsys.readouterr()
        return code, out.out + out.err

    assert train("--iterations", "6")[0] == 0
    for argv, says in [(["--extend", "stretch", "--extend_rewarm", "4"],
                        "this run continues by --extend stretch; pass --extend rewarm"),
                       (["--extend", "rewarm", "--extend_rewarm", "7"],
                        "--extend_rewarm must be in 1 .. 6 (the steps left), got 7")]:
        code, said = train("--iterations", "12", *argv)
        assert code == 2 and says in said and len(said.strip().splitlines()) == 1, said
    rewarm = ["--iterations", "12", "--extend", "rewarm", "--extend_rewarm", "4"]
    assert train(*rewarm, "--iterations_to_run", "2")[0] == 75
    assert extensions(tmp_path / "run")[0]["rewarm_steps"] == 4
    code, said = train(*rewarm[:-1], "3")
    assert code == 2 and "--extend rewarm --extend_decay keep --extend_rewarm 4; resume it " \
                         "with those" in said, said
    assert train(*rewarm)[0] == 0
    schedule = extended_schedule("cos_inf", 0, 6, 12, from_step=6, rule="rewarm",
                                 rewarm_steps=4)
    lr = logged_lr(tmp_path / "run")
    assert sorted(lr) == list(range(1, 13))
    assert all(lr[step] == pytest.approx(PEAK * schedule(step - 1), rel=1e-12) for step in lr)
    assert lr[11] == pytest.approx(PEAK) and lr[10] < PEAK  # the peak again 4 steps on


def test_rewarm_climbs_over_the_runs_own_warm_up_but_never_past_the_steps_left(tmp_path,
                                                                               capsys):
    """Without `--extend_rewarm`, rewarm climbs over the run's own warm-up (3 steps here), or
    over the steps left where the extension is shorter than that."""
    def train(*argv):
        code = danastar_main(["train", *TINY, "--warmup_steps", "3", "--run_dir",
                              str(tmp_path / "run"), *argv])
        out = capsys.readouterr()
        return code, out.out + out.err

    assert train("--iterations", "10")[0] == 0
    for total, climb in ((40, 3), (12, 2)):
        code, said = train("--iterations", str(total), "--extend", "--dry_run")
        assert code == 0 and (f"planned with its warm-up of 3 steps, back up to the peak over "
                              f"{climb} steps" in said), said
