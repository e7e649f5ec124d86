"""Bad input to `danastar train`: each is refused at configuration time with one sentence that
names the fix (exit code 2, no traceback), before anything is started or written, and the dry run
refuses exactly what training would.

Most cases run in-process through the checks `danastar train` makes before it trains or launches
(`load_config`, then the dry run's plan); a few go through the real command line."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import danastar
from danastar.cli import main as danastar_main
from danastar.config import load_config
from danastar.errors import UserError
from danastar.train.plan import dry_run

# A tiny run on the synthetic source: planning it takes milliseconds and needs no data.
BASE = ["--dataset", "synthetic", "--heads", "2", "--batch_size", "4", "--sequence_length", "32",
        "--iterations", "3"]


def refusal(argv: list[str]) -> str:
    """The UserError that the checks before training raise for `argv` (BASE first)."""
    with pytest.raises(UserError) as raised:
        config, _ = load_config([*BASE, *argv])
        dry_run(config)
    return str(raised.value)


# (flags or dotted overrides, a fragment of the sentence that refuses them)
REFUSED = [
    # the learning rate: `--lr inf` used to train NaN and save a NaN checkpoint
    (["--lr", "inf"], "optim.lr (--lr) must be a finite number (got inf); e.g. --lr 3e-4"),
    (["--lr", "nan"], "optim.lr (--lr) must be a finite number (got nan)"),
    (["--lr", "1e400"], "optim.lr (--lr) must be a finite number (got inf)"),
    (["--lr", "0"], "optim.lr (--lr) must be greater than 0"),
    (["--lr", "-1"], "optim.lr (--lr) must be greater than 0"),
    (["optim.weight_decay=-1"], "optim.weight_decay must be at least 0"),
    (["--omega", "-1"], "optim.omega (--omega) must be at least 0 (got -1.0)"),
    (["--omega", "nan"], "optim.omega (--omega) must be a finite number"),
    (["--kappa", "-1"], "optim.kappa (--kappa) must be in (0, 1]"),
    (["--delta", "0"], "optim.delta (--delta) must be greater than 0"),
    (["--opt", "dana-mk4", "--clipsnr", "-1"], "optim.clipsnr (--clipsnr) must be greater than 0"),
    # clipping: -1 used to disable it silently
    (["--grad_clip", "-1"], "optim.grad_clip (--grad_clip) must be at least 0 (got -1.0); 0 turns"),
    (["--grad_clip", "inf"], "optim.grad_clip (--grad_clip) must be a finite number"),
    # settings an optimizer would ignore
    (["--opt", "adamw", "--kappa", "0.5"], "kappa applies only to adana, dana-mk4"),
    (["--opt", "adamw", "--delta", "5"], "delta applies only to adana"),
    (["--opt", "sgd", "--lr", "0.1", "--kappa", "0.5"], "not sgd; drop it or choose one"),
    (["--clipsnr", "1"], "clipsnr applies only to dana-mk4, dana-star-mk4, not adana"),
    # names
    (["--opt", "adamm"], "optim.name (--opt) 'adamm' is not known; did you mean 'adamw'?"),
    (["--scheduler", "bogus"], "optim.scheduler 'bogus' is not known; choose one of: cos_inf"),
    (["model.init=Bogus"], "model.init 'Bogus' is not known; choose one of: ScaledGPT"),
    (["--dataset", ""], "data.dataset (--dataset) is empty"),
    # the model
    (["model.z_loss=-1"], "model.z_loss must be at least 0"),
    (["model.n_layer=0"], "model.n_layer must be at least 1 (got 0); leave it unset"),
    (["model.n_embd=0"], "model.n_embd must be at least 1"),
    (["model.n_head=0"], "model.n_head must be at least 1"),
    (["model.residual_scale=0"], "model.residual_scale must be greater than 0"),
    (["--heads", "0"], "model.heads (--heads) must be at least 1"),
    # the loop: final_eval_batches=0 used to crash before the final save
    (["train.final_eval_batches=0"], "train.final_eval_batches must be at least 1 (got 0); leave"),
    (["train.eval_batches=0"], "train.eval_batches must be at least 1"),
    (["--seed", "-1"], "train.seed (--seed) must be between 0 and 2**63 - 1 (got -1)"),
    (["data.data_seed=-1"], "data.data_seed must be between 0 and 2**63 - 1"),
    (["--iterations", "0"], "train.iterations (--iterations) must be at least 1"),
    (["--iterations_to_run", "0"], "train.iterations_to_run (--iterations_to_run) must be at"),
    (["--eval_interval", "0"], "train.eval_interval (--eval_interval) must be at least 1"),
    (["--log_interval", "0"], "train.log_interval (--log_interval) must be at least 1"),
    (["--warmup_steps", "-1"], "optim.warmup_steps (--warmup_steps) must be at least 0"),
    (["--warmup_steps", "10"], "(--warmup_steps) 10 is longer than the run's 3 iterations"),
    (["train.sample_tokens=-1"], "train.sample_tokens must be at least 0"),
    (["train.peak_flops=-1"], "train.peak_flops must be greater than 0"),
    (["checkpoint.permanent_every=-1"], "checkpoint.permanent_every must be at least 0"),
    # distribution
    (["parallel.activation_checkpointing=-1"], "parallel.activation_checkpointing must be at"),
    (["--nproc", "3", "--distributed_backend", "fsdp", "parallel.tp_size=3", "--batch_size", "3"],
     "parallel.tp_size 3 does not divide the model's 2 attention heads"),
    (["--nproc", "2", "--batch_size", "5"], "--batch_size 5 (global sequences per micro-step) "
     "does not split over 2 data-parallel ranks; use a multiple of 2"),
    (["--nproc", "0"], "parallel.nproc (--nproc) must be at least 1"),
    (["--nproc", "2", "--distributed_backend", "single"], "single cannot run 2 processes"),
    # the command line itself: no usage dump, a suggestion, and no abbreviations
    (["--iteratons", "5"], "unknown flag --iteratons; did you mean --iterations?"),
    (["--dry-run"], "unknown flag --dry-run; did you mean --dry_run?"),
    (["--batch-size", "4"], "unknown flag --batch-size; did you mean --batch_size?"),
    (["--seq", "64"], "unknown flag --seq; flags are written in full, e.g. --sequence_length."),
    (["--train.seed=3"], "--train.seed is a config key, not a flag; write it as train.seed=VALUE"),
    (["--lr"], "--lr needs a value"),
    (["--lr", "abc"], "--lr takes a number (e.g. 0.5 or 3e-4), not 'abc'"),
    (["--dry_run=1"], "--dry_run takes no value"),
    (["hello"], "cannot read 'hello'; overrides are written section.key=value"),
    # dotted overrides are read by the field's type with YAML 1.2 rules (1:2 was 62 in YAML 1.1)
    (["train.seed=1:2"], "train.seed takes a whole number in decimal (e.g. 100), not '1:2'"),
    (["train.seed=1.5"], "train.seed takes a whole number"),
    (["train.iterations=1e3"], "train.iterations takes a whole number in decimal (e.g. 100) or"),
    (["logging.progress=no"], "logging.progress takes true or false, not 'no'"),
    (["optim.lr=fast"], "optim.lr takes a number"),
]


@pytest.mark.parametrize("argv, fragment", REFUSED, ids=[" ".join(argv) for argv, _ in REFUSED])
def test_bad_input_is_refused_with_one_sentence_naming_the_fix(argv, fragment):
    message = refusal(argv)
    assert fragment in message
    assert "\n" not in message and message.endswith((".", "?"))


def test_config_files_that_cannot_be_read_are_refused(tmp_path):
    (tmp_path / "latin.yaml").write_bytes("train:\n  seed: 1 # caf\xe9\n".encode("latin-1"))
    (tmp_path / "twice.yaml").write_text("train:\n  seed: 1\n  seed: 2\n")
    (tmp_path / "sexagesimal.yaml").write_text("train:\n  seed: 1:2\n")
    cases = {
        str(tmp_path): "is a directory; pass a YAML file in it",
        str(tmp_path / "latin.yaml"): "is not UTF-8 text (byte 0xe9 at offset 22); save it as",
        str(tmp_path / "twice.yaml"): "key 'seed' is given twice at line 3",
        str(tmp_path / "sexagesimal.yaml"): "train.seed in " + str(tmp_path / "sexagesimal.yaml")
        + " takes a whole number",
    }
    for path, fragment in cases.items():
        assert fragment in refusal(["--config", path])


def test_run_directories_that_cannot_hold_a_run_are_refused(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("kept")
    assert refusal(["--run_dir", str(a_file)]) == (
        f"run directory {a_file} is a file; pass another --run_dir or move the file away.")
    under = a_file / "run"
    assert refusal(["--run_dir", str(under)]) == (
        f"run directory {under} cannot be created because {a_file} is a file; pass another "
        "--run_dir.")
    assert refusal(["--run_dir", ""]).startswith("logging.run_dir (--run_dir) is empty")
    assert a_file.read_text() == "kept"


def test_a_run_directory_that_is_not_writable_is_refused(tmp_path):
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
    else:  # chmod does not stop root; a read-only file system does
        locked = next((path for path in map(os.path.realpath, ("/proc/sys",))
                       if os.path.isdir(path) and not os.access(path, os.W_OK)), None)
        if locked is None:
            pytest.skip("running as root and no read-only file system to write into")
    message = refusal(["--run_dir", os.path.join(locked, "run")])
    assert f"cannot be created in {locked}, which is not writable" in message


def test_a_checkpoints_folder_that_takes_no_files_is_refused_before_training(tmp_path):
    # Before, it was found at the first save, and the steps trained until then were lost.
    run = tmp_path / "run"
    run.mkdir()
    if os.geteuid() != 0:
        (run / "checkpoints").mkdir(mode=0o555)
    else:  # chmod does not stop root: the folder is a link to a read-only file system
        locked = next((path for path in map(os.path.realpath, ("/proc/sys",))
                       if os.path.isdir(path) and not os.access(path, os.W_OK)), None)
        if locked is None:
            pytest.skip("running as root and no read-only file system to write into")
        (run / "checkpoints").symlink_to(locked)
    assert refusal(["--run_dir", str(run)]) == (
        f"{run / 'checkpoints'} is not writable, so no checkpoint could be saved; make it "
        "writable or pass another --run_dir.")


def test_a_run_directory_name_longer_than_the_file_system_allows(tmp_path):
    long = tmp_path / ("r" * 300)
    assert refusal(["--run_dir", str(long / "run")]) == (
        f"run directory {long / 'run'} has a name of 300 bytes ({'r' * 24}...), longer than the "
        "255 its file system allows; pass another --run_dir with shorter names.")
    # A default name made long by a long dataset name is shortened, the same way each time (a
    # resume finds it), and differently for other settings. Before, os.stat raised.
    from danastar.config import default_run_dir

    dataset = str(tmp_path / ("d" * 250))
    names = [default_run_dir(load_config([*BASE, "--dataset", dataset, *more])[0]).name
             for more in ([], [], ["--seed", "1"])]
    assert all(len(name.encode()) == 255 and name.startswith("d" * 200) for name in names)
    assert names[0] == names[1] != names[2]
    (tmp_path / ("d" * 250)).mkdir()  # prepared, as the original release's raw files
    for name in ("train.bin", "val.bin"):
        (tmp_path / ("d" * 250) / name).write_bytes(bytes(2 * 64))
    config, _ = load_config([*BASE, "--dataset", dataset])
    dry_run(config)  # accepted


# What must still be accepted, and how values given as text are read.
def test_text_values_are_read_by_the_fields_type_with_yaml_1_2_rules(tmp_path):
    config, _ = load_config([*BASE, "logging.run_dir=010", "train.seed=010", "optim.lr=.5e-3",
                             "train.final_eval_batches=null", "logging.progress=False",
                             "train.sample_prompt= To be"])
    assert config.logging.run_dir == "010"  # a text field keeps its text (YAML 1.1: octal 8)
    assert config.train.seed == 10  # decimal, not octal
    assert config.optim.lr == 5e-4 and config.train.final_eval_batches is None
    assert config.logging.progress is False and config.train.sample_prompt == " To be"
    path = tmp_path / "run.yaml"
    path.write_text("logging:\n  run_dir: 010\noptim:\n  lr: 3e-4\n  grad_clip: 0\n")
    config, _ = load_config([*BASE, "--config", str(path)])
    assert (config.logging.run_dir, config.optim.lr, config.optim.grad_clip) == ("010", 3e-4, 0.0)


@pytest.mark.parametrize("argv", [
    ["--opt", "ademamix", "--kappa", "0.75", "--iterations", "20"],  # AdEMAMix uses κ and δ
    ["--opt", "dana-star-mk4", "--kappa", "0.75", "--delta", "6", "--clipsnr", "1.5"],
    ["--grad_clip", "0"],  # the documented "off"
    ["--opt", "adamw", "--config", "fineweb_enoki"],  # the preset does not pin κ and δ
    ["--warmup_steps", "3", "--seed", "0", "parallel.activation_checkpointing=0"],
])
def test_good_input_is_accepted(argv):
    config, _ = load_config([*BASE, *argv])
    dry_run(config)


def test_the_plan_shows_the_kappa_and_delta_used_when_they_are_not_given():
    config, _ = load_config(BASE)
    assert (config.optim.kappa, config.optim.delta) == (None, None)  # not given
    plan = dry_run(config)["plan"]
    assert (plan["kappa"], plan["delta"]) == (0.85, 8.0)
    assert plan["optimizer_hparams"]["kappa"] == 0.85


@pytest.mark.parametrize("argv", [
    ["--lr", "inf"],
    ["--opt", "adamw", "--kappa", "0.5"],
    ["--nproc", "3", "--distributed_backend", "fsdp", "parallel.tp_size=3", "--batch_size", "3"],
    ["train.final_eval_batches=0"],
    ["--run_dir", "{file}/run"],
])
def test_training_and_the_dry_run_refuse_the_same_things(argv, tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    run_dir = str(tmp_path / "run")
    argv = [arg.replace("{file}", str(a_file)) for arg in argv]
    messages = []
    for mode in (["--dry_run"], []):
        assert danastar_main(["train", *BASE, "--run_dir", run_dir, *argv, *mode]) == 2
        messages.append(capsys.readouterr().err)
    assert messages[0] == messages[1] and messages[0].count("\n") == 1
    assert not os.path.exists(run_dir)  # nothing was written


def test_what_this_machine_lacks_is_refused_before_launching_workers(tmp_path, capsys):
    # A dry run plans for any machine; `--nproc N` checks this one once, in the launcher.
    cases = [(["--dataset", str(tmp_path / "no-data")], "is neither a prepared directory")]
    if not torch.cuda.is_available():
        cases.append((["train.device=cuda"], "no CUDA device is visible; use train.device=cpu"))
    if importlib.util.find_spec("wandb") is None:
        cases.append((["--wandb"], "wandb is not installed; pip install"))
    if importlib.util.find_spec("tensorboard") is None:
        cases.append((["logging.tensorboard=true"], "TensorBoard is not installed; pip install"))
    for argv, fragment in cases:
        run_dir = tmp_path / "run"
        assert danastar_main(["train", *BASE, "--nproc", "2", "--run_dir", str(run_dir),
                              *argv]) == 2
        error = capsys.readouterr().err
        assert fragment in error and error.count("\n") == 1 and not run_dir.exists()


# Through the real command line, in fresh processes.
def run_cli(*argv: str, cwd) -> subprocess.CompletedProcess:
    # Run from an empty directory (nothing may appear in it), importing this checkout's package.
    source = os.path.dirname(os.path.dirname(danastar.__file__))
    path = os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "danastar", "train", *BASE, *argv],
                          capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path})


@pytest.mark.parametrize("argv, fragment", [
    (["--lr", "inf"], "optim.lr (--lr) must be a finite number"),
    (["--iteratons", "5", "--dry_run"], "did you mean --iterations?"),
    (["--run_dir", "{file}/run"], "cannot be created because"),
    # the parent refuses once, before torchrun starts N workers that would each print it
    (["--nproc", "2", "--batch_size", "5"], "does not split over 2 data-parallel ranks"),
])
def test_the_command_line_exits_2_with_one_line_and_no_traceback(argv, fragment, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("kept")
    result = run_cli(*[arg.replace("{file}", str(a_file)) for arg in argv], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("danastar train: ") and result.stderr.count("\n") == 1
    assert fragment in result.stderr and "Traceback" not in result.stderr
    assert "torch.distributed" not in result.stderr and result.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["a-file"] and a_file.read_text() == "kept"
