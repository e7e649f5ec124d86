"""The training command end to end: the default preset, the run directory, dry runs, failures."""

import json
import math

import pytest
import torch
import yaml

from danastar import scaling
from danastar.analysis import records
from danastar.cli import main as danastar_main
from danastar.config import load_config
from danastar.errors import UserError
from danastar.launch import sweep_spec
from danastar.rundir.status import read_status
from danastar.train import loop, parts
from danastar.train import optimizer as optimizer_module
from danastar.train import step as step_module

from train_helpers import TINY, assert_ok, metrics, run_train

RUN = ("--iterations", "40", "checkpoint.latest_every=3")  # the resume tests' reference run


def dry_run(capsys, *argv):
    assert danastar_main(["train", *argv, "--dry_run", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def prepared_fineweb(tmp_path, monkeypatch):
    """FineWeb as this machine would hold it prepared (a dry run refuses it otherwise, as the
    run does): the original release's raw GPT-2 files, as long as its 10B-token sample but
    sparse, so that no disk is used for their zeros."""
    directory = tmp_path / "data" / "fineweb"
    directory.mkdir(parents=True)
    for name, tokens in (("train.bin", 10**10), ("val.bin", 10**8)):
        with open(directory / name, "wb") as file:
            file.truncate(2 * tokens)  # uint16 tokens
    monkeypatch.setenv("DANASTAR_DATA_DIR", str(tmp_path / "data"))
    return directory


@pytest.mark.slow
def test_default_preset_shortened_learns_shakespeare_and_samples(tmp_path):
    result = run_train_preset(
        tmp_path, "--iterations", "60", "train.eval_interval=30", "train.final_eval_batches=8"
    )
    assert_ok(result)
    logged = metrics(tmp_path / "run")
    evaluations = [m for m in logged if "val_loss" in m]
    assert [m["step"] for m in evaluations] == [0, 30, 60] and evaluations[-1]["final"]
    assert evaluations[0]["val_loss"] > evaluations[-1]["val_loss"] + 1.5  # learning, clearly
    assert "final validation loss" in result.stdout and "sample:" in result.stdout


def run_train_preset(tmp_path, *args):
    """The preset as `danastar train` runs it (no TINY overrides), in a fresh run directory."""
    import subprocess
    import sys

    from train_helpers import environment

    return subprocess.run(
        [sys.executable, "-m", "danastar", "train", *args, "--run_dir", str(tmp_path / "run")],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_run_directory_holds_config_environment_logs_and_metrics(reference_runs):
    run_dir = reference_runs(RUN)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["train"]["iterations"] == 40 and config["data"]["dataset"] == "synthetic"
    environment = json.loads((run_dir / "environment.json").read_text())
    assert {"git_revision", "git_dirty", "torch", "python", "world_size"} <= set(environment)
    # which CPU and instruction set: runs on AVX2 and AVX512 machines round differently
    assert environment["cpu"]
    assert environment["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert json.loads((run_dir / "plan.json").read_text())["plan"]["iterations"] == 40
    assert "run directory" in (run_dir / "logs" / "rank0.log").read_text()
    logged = metrics(run_dir)
    assert logged[0]["step"] == 0 and logged[0]["loss/init"] == logged[0]["val_loss"]
    assert (
        abs(logged[0]["val_loss"] - math.log(512)) < 1.0
    )  # near uniform over the vocabulary at init
    train_lines = [m for m in logged if "train_loss" in m]
    assert [m["step"] for m in train_lines] == list(range(1, 41))
    for key in (
        "lr",
        "grad_norm",
        "tokens",
        "tokens_per_s",
        "step_time",
        "mfu",
        "optim/momentum_norm",
    ):
        assert key in train_lines[-1], key
    assert train_lines[-1]["tokens"] == 40 * 4 * 2 * 32
    assert train_lines[-1]["train_loss"] < train_lines[0]["train_loss"]


def test_a_finished_run_is_not_trained_again(tmp_path, reference_runs):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(reference_runs(RUN), run_dir)
    result = run_train(list(RUN), run_dir)
    assert_ok(result)
    assert "already finished at step 40" in result.stdout


def test_non_finite_steps_are_skipped_counted_and_stop_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(step_module, "clip_grad_norm",
                        lambda model, max_norm: torch.tensor(float("nan")))
    updates = []
    real_build = optimizer_module.build_optimizer

    def counting_build(*args, **kwargs):
        optimizer = real_build(*args, **kwargs)
        optimizer.step = lambda *a, **k: updates.append(1)
        return optimizer

    monkeypatch.setattr(optimizer_module, "build_optimizer", counting_build)
    config, _ = load_config(
        [*TINY, "--iterations", "20", "train.max_nonfinite_steps=3", "--run_dir", str(tmp_path)]
    )
    with pytest.raises(UserError, match="3 non-finite steps in a row at step 3"):
        loop.train(config)
    skipped = [m["skipped_steps"] for m in metrics(tmp_path) if "skipped_steps" in m]
    assert skipped == [1, 2, 3]  # logged every step; the third one stops the run
    assert updates == []  # a non-finite step never reaches the optimizer
    status = read_status(tmp_path)
    assert status["state"] == "failed" and status["exit_code"] == 2
    assert status["reason"].startswith("training diverged: 3 non-finite steps in a row")
    assert records.read_run(tmp_path).state == "failed"


def nan_gradients(monkeypatch):
    monkeypatch.setattr(step_module, "clip_grad_norm",
                        lambda model, max_norm: torch.tensor(float("nan")))


def test_a_run_whose_every_step_was_skipped_fails_and_is_never_complete(tmp_path, monkeypatch):
    """Fewer steps than train.max_nonfinite_steps, all skipped: the weights never changed, and
    the run is recorded failed (status.json, results, sweeps), with no final checkpoint that a
    second start would call finished."""
    nan_gradients(monkeypatch)
    config, _ = load_config([*TINY, "--iterations", "3", "--run_dir", str(tmp_path)])
    with pytest.raises(UserError) as refused:
        loop.train(config)
    said = str(refused.value)
    assert said.startswith("training failed: every one of its 3 steps had a non-finite loss")
    assert "--init_from" in said and "--lr" in said
    status = read_status(tmp_path)
    assert (status["state"], status["step"], status["exit_code"]) == ("failed", 3, 2)
    assert status["reason"] == said
    assert not list((tmp_path / "checkpoints").glob("*-00000003"))
    assert not records.read_run(tmp_path).complete
    assert records.read_run(tmp_path).state == "failed"
    assert sweep_spec.run_state(tmp_path)["state"] == "partial"  # a sweep trains it again


def test_a_run_whose_final_validation_loss_is_not_finite_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(parts, "evaluation", lambda *args: (float("nan"), {}))
    config, _ = load_config([*TINY, "--iterations", "3", "--run_dir", str(tmp_path)])
    with pytest.raises(UserError, match="its final validation loss is nan"):
        loop.train(config)
    assert read_status(tmp_path)["state"] == "failed"
    run = records.read_run(tmp_path)
    assert run.final_record is not None and not run.complete and run.state == "failed"


def test_dry_run_prints_the_scaling_plan_and_the_batch_layout(capsys, prepared_fineweb):
    printed = dry_run(
        capsys,
        "--arch",
        "enoki",
        "--opt",
        "adana",
        "--heads",
        "12",
        "--dataset",
        "fineweb",
        "--batch_size",
        "32",
        "--acc_steps",
        "1",
        "--sequence_length",
        "2048",
        "--nproc",
        "4",
    )
    expected = scaling.make_plan(
        "enoki",
        "adana",
        12,
        batch_size=32,
        acc_steps=1,
        seq_len=2048,
        vocab_size=50257,
        world_size=4,
    )
    assert printed["plan"] == json.loads(json.dumps(expected.to_dict()))
    assert printed["plan"]["padded_vocab_size"] == 50304
    assert (
        printed["batch_layout"]["micro_batch_per_rank"] == 8
        and printed["batch_layout"]["world_size"] == 4
    )
    assert printed["batch_layout"]["tokens_per_step"] == 32 * 2048


def test_dry_run_explicit_flags_override_the_plan(capsys, prepared_fineweb):
    printed = dry_run(
        capsys,
        "--heads",
        "6",
        "--dataset",
        "fineweb",
        "--lr",
        "1e-3",
        "--iterations",
        "500",
        "--warmup_steps",
        "7",
    )
    assert (
        printed["plan"]["lr"],
        printed["plan"]["iterations"],
        printed["plan"]["warmup_steps"],
    ) == (1e-3, 500, 7)
    assert printed["plan"]["n_embd"] == 6 * 64


def test_impossible_batch_layout_is_one_sentence_and_exit_2(capsys):
    assert danastar_main(["train", "--batch_size", "6", "--nproc", "4", "--dry_run"]) == 2
    error = capsys.readouterr().err
    assert "does not split over 4 data-parallel ranks" in error and error.count("\n") == 1


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--kappa", "1.5"], "optim.kappa (--kappa) must be in (0, 1]"),
        (["--opt", "dana-star-mk4", "--clipsnr", "0"], "(--clipsnr) must be greater than 0"),
        (["--lr", "-1"], "optim.lr (--lr) must be greater than 0"),
    ],
)
def test_dry_run_rejects_the_optimizer_settings_training_would_reject(capsys, flags, message):
    assert danastar_main(["train", *flags, "--dataset", "fineweb", "--dry_run"]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1


def test_dry_run_builds_the_muon_route_on_stand_in_parameters(capsys, prepared_fineweb):
    assert dry_run(capsys, "--opt", "muon", "--dataset", "fineweb")["plan"]["opt"] == "muon"


def test_dry_run_prints_a_summary_a_person_reads(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["--dataset", "synthetic", "--heads", "2", "--batch_size", "8", "--sequence_length",
            "32", "--iterations", "2000", "--nproc", "2"]
    assert danastar_main(["train", *argv, "--dry_run"]) == 0
    text = capsys.readouterr().out
    planned = dry_run(capsys, *argv)  # what --json prints: the same plan, whole
    plan = planned["plan"]
    assert 12 <= len(text.splitlines()) <= 22, text
    assert f"parameters   {plan['exact_total_params']:,} (" in text
    assert "tokens       512,000 = 2,000 steps × 256 tokens (iterations as configured)" in text
    assert "data         1.28 epochs of synthetic's 400,000 training tokens" in text
    assert ("batch        8 sequences × 32 tokens per step: 4 per process × 2 data-parallel "
            "processes × 1 accumulation step") in text
    assert f"LR           peak {plan['lr']:.3g} (the fitted law {plan['lr_rule']}); " in text
    assert f"weight decay {plan['weight_decay']:.3g} (ω 4 over wd_ts 200 steps)" in text
    assert f"compute      {planned['compute']['flops']:.3g} FLOPs" in text
    assert planned["compute"]["flops"] == planned["compute"]["flops_per_token"] * 512_000
    assert "time         about " in text and " on 2 processes, each on a " in text
    assert "measured just now on the model, with the machine's load average at " in text
    assert planned["run_dir"] == "runs/synthetic-enoki-h2-adana-b8x32-cos_inf-s0"
    assert f"run dir      {planned['run_dir']} (new)" in text
    assert planned["corpus"] == {"train_tokens": 400_000, "train_tokens_from":
                                 "the synthetic source", "epochs": 1.28}


def test_a_plan_says_its_epochs_and_warns_past_four(capsys):
    # the paper's budget on the embedded corpus reads it 108 times
    assert danastar_main(["train", "--heads", "6", "--dataset", "shakespeare", "--dry_run",
                          "--json"]) == 0
    out, err = capsys.readouterr()
    assert round(json.loads(out)["corpus"]["epochs"]) == 108
    assert err == ("warning: this run reads shakespeare 108 times over (204,472,320 tokens from "
                   "1,892,697); past about 4 epochs repeated tokens are worth much less than new "
                   "ones (docs/training.md, \"Epochs\"): use a larger corpus (--dataset fineweb) "
                   "or a shorter run (--iterations 115 reads 4 epochs).\n")
    # --heads alone stays in the CPU preset: a bigger model for the same short run
    planned = dry_run(capsys, "--heads", "6")
    assert (planned["plan"]["iterations"], planned["plan"]["seq_len"]) == (300, 128)
    assert planned["corpus"]["epochs"] < 1 and capsys.readouterr().err == ""


def test_json_without_a_dry_run_is_refused(capsys):
    assert danastar_main(["train", "--json"]) == 2
    assert capsys.readouterr().err == ("danastar train: --json prints the plan of --dry_run as "
                                       "JSON; add --dry_run or drop --json.\n")


def test_unknown_key_is_one_sentence_and_exit_2(capsys):
    assert danastar_main(["train", "train.sed=3"]) == 2
    assert "did you mean 'train.seed'" in capsys.readouterr().err


def test_optimizer_hyperparameters_it_rejects_are_a_user_error(tmp_path):
    # AdEMAMix's slow EMA β3 = 1 − δ/T is negative for a run shorter than δ steps.
    config, _ = load_config(
        [*TINY, "--opt", "ademamix", "--iterations", "3", "--run_dir", str(tmp_path)]
    )
    with pytest.raises(
        UserError, match="cannot run this plan.*change the optimizer settings or --iterations"
    ):
        loop.train(config)


@pytest.mark.slow
def test_compiled_blocks_train_like_eager(tmp_path, reference_runs):
    short = ("--iterations", "4", "checkpoint.latest_every=-1")
    compiled = tmp_path / "compiled"
    assert_ok(run_train([*short, "train.compile=true"], compiled))
    eager = metrics(reference_runs(short))
    assert len(metrics(compiled)) == len(eager)
    for got, expected in zip(metrics(compiled), eager):
        for key in ("train_loss", "val_loss"):
            if key in expected:
                assert got[key] == pytest.approx(expected[key], rel=1e-4), (expected["step"], key)
