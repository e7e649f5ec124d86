"""`danastar submit` without a cluster: rendered scripts, sweep expansion, the segment helper, and
the refusals (one sentence, exit 2)."""

import subprocess
import sys
from pathlib import Path

import pytest

from danastar import cli
from danastar.config import default_run_dir, load_config
from danastar.errors import UserError
from danastar.launch import slurm
from danastar.launch.sweep_spec import expand, format_value, parse_sweep
from danastar.rundir.status import read_status, write_status

from train_helpers import TINY

SRC = str(Path(__file__).resolve().parents[2] / "src")


def danastar(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "danastar", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env={"PYTHONPATH": SRC,
                                                                "PATH": "/usr/bin:/bin"})


def test_dry_run_prints_a_script_with_the_chain_machinery_and_submits_nothing(tmp_path):
    run_dir = tmp_path / "run"
    result = danastar("submit", *TINY, "--iterations", "30", "--run_dir", str(run_dir),
                      "--batch_size", "16",
                      "--nodes", "2", "--gpus_per_node", "4", "--time", "2:00:00",
                      "--partition", "gpu", "--account", "lab", "--signal_lead", "120",
                      "--dry_run")
    assert result.returncode == 0, result.stderr
    script = result.stdout
    for line in ("#SBATCH --requeue", "#SBATCH --open-mode=append",
                 "#SBATCH --signal=B:USR1@120", "#SBATCH --nodes=2",
                 "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --time=2:00:00", "#SBATCH --partition=gpu", "#SBATCH --account=lab",
                 f"#SBATCH --output={run_dir}/logs/%x-%j.out",
                 f"RUN_DIR={run_dir}", 'scontrol requeue "$SLURM_JOB_ID"',
                 'touch "$RUN_DIR/STOP"', 'wait "$TRAIN_PID"',
                 'srun --kill-on-bad-exit=1 "$PYTHON" -m danastar train'):
        assert line in script, line
    assert "--run_dir" not in script.split("TRAIN_ARGS=(")[1].split(")")[0]
    assert not run_dir.exists()  # a dry run writes nothing
    bash = subprocess.run(["bash", "-n"], input=script.split("\n", 1)[1], capture_output=True,
                          text=True)
    assert bash.returncode == 0, bash.stderr  # the script is valid bash


def test_dependency_chain_and_torchrun_launch_render(tmp_path):
    job = slurm.Job(name="r", runs=[(tmp_path / "r", ["--heads", "2"])],
                    script_path=tmp_path / "r" / "slurm" / "submit.sbatch",
                    log_dir=tmp_path / "r" / "logs", workdir=tmp_path, chain="dependency",
                    launcher="torchrun", tasks_per_node=4, nodes=2)
    script = slurm.render_script(job)
    assert '--dependency=afterany:"$SLURM_JOB_ID"' in script and "DANASTAR_SEGMENT" in script
    assert 'scontrol requeue "$SLURM_JOB_ID"' not in script
    assert "--rdzv_backend=c10d" in script and '--rdzv_id="$SLURM_JOB_ID"' in script
    assert "--nproc_per_node=4" in script


def test_the_segment_helper_maps_torchruns_failure_to_75_and_records_crashes(tmp_path):
    write_status(tmp_path, "segment done", step=4, total=12)
    # torchrun reports a worker's 75 as its own 1: the status of this segment says 75
    assert slurm.segment_exit_code(tmp_path, 1, since="2000-01-01T00:00:00Z") == 75
    # an old status does not count
    assert slurm.segment_exit_code(tmp_path, 1, since="2999-01-01T00:00:00Z") == 1
    assert read_status(tmp_path)["state"] == "failed"
    assert slurm.segment_exit_code(tmp_path, 0, since="") == 0


def test_a_run_directory_is_named_from_the_meaning_not_the_layout():
    base = ["--heads", "3", "--batch_size", "32"]
    same = [default_run_dir(load_config(args)[0]) for args in (
        base, [*base, "--nproc", "4"], ["--heads", "3", "--batch_size", "16", "--acc_steps", "2"])]
    assert same[0] == same[1] == same[2]
    different = {default_run_dir(load_config(args)[0]) for args in (
        base, [*base, "--lr", "1e-3"], [*base, "--seed", "1"], [*base, "--opt", "adamw"],
        [*base, "--kappa", "0.9"], [*base, "--scheduler", "wsd"], ["--heads", "3",
                                                                    "--batch_size", "64"])}
    assert len(different) == 7


def test_sweeps_expand_in_order_with_readable_names():
    sweep = parse_sweep({"name": "lr", "base": {"preset": "cpu_shakespeare",
                                                "train.iterations": 900},
                         "grid": {"optim.name": ["adamw", "adana"], "lr_multiplier": [0.5, 2],
                                  "train.seed": [0]}})
    points = expand(sweep)
    assert [p.name for p in points] == ["adamw-lrx0.5-s0", "adamw-lrx2-s0", "adana-lrx0.5-s0",
                                        "adana-lrx2-s0"]
    assert points[1].lr_multiplier == 2.0 and points[1].preset == "cpu_shakespeare"
    assert points[1].train_argv() == ["--config", "cpu_shakespeare", "train.iterations=900",
                                      "optim.name=adamw", "train.seed=0"]
    assert format_value(1e-05) == "1.0e-05" and format_value(True) == "true"
    for bad in ({"grid": {"a": 1}}, {"name": "x y", "grid": {}}, {"name": "x", "axes": {}}):
        with pytest.raises(UserError):
            parse_sweep(bad)


@pytest.mark.parametrize("args, message", [
    (["--nproc", "2"], "instead of --nproc"),
    (["--batch_size", "3", "--tasks_per_node", "2"], "does not split over 2"),
    (["--cluster", "nowhere", "--clusters", "/nonexistent.yaml"], "no cluster registry"),
    (["--array", "/nonexistent.yaml"], "cannot read the sweep file"),
    (["--time", "5", "--signal_lead", "300"], "every segment would stop as it starts"),
    # Before: ignored without a word (one process per GPU).
    (["--gpus_per_node", "2", "--tasks_per_node", "3"],
     "--tasks_per_node 3 is for a job without GPUs; with GPUs (--gpus_per_node 2) each node runs "
     "one process per GPU, so remove --tasks_per_node (or ask for --gpus_per_node 0)."),
])
def test_refusals_are_one_sentence_and_exit_2(tmp_path, capsys, args, message):
    # In-process through the CLI's own entry point (the dry-run test above runs it as a process).
    code = cli.main(["submit", *TINY, "--run_dir", str(tmp_path / "r"), *args, "--dry_run"])
    stderr = capsys.readouterr().err
    assert code == 2 and message in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1


def test_submit_without_sbatch_says_where_to_run(tmp_path, capsys, monkeypatch):
    # Before: slurm/ and logs/ were left behind, and `danastar results` listed them as a run.
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without SLURM's commands
    assert cli.main(["submit", *TINY, "--run_dir", str(tmp_path / "runs" / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["danastar submit: sbatch is not installed here; run danastar submit on a SLURM "
                   "login node or give the cluster profile a login: host."]
    assert not (tmp_path / "runs").exists()


@pytest.mark.process  # a stand-in sbatch
def test_a_job_sbatch_refuses_leaves_the_run_directory_as_it_was(tmp_path, capsys, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: invalid partition' >&2\n"
                                    "exit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    run_dir = tmp_path / "r"
    (run_dir / "slurm").mkdir(parents=True)
    (run_dir / "slurm" / "plan.json").write_text("an earlier submission's")
    assert cli.main(["submit", *TINY, "--run_dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["danastar submit: sbatch refused the job (sbatch: error: invalid partition); "
                   "fix the flags or the cluster profile and submit again (--dry_run prints the "
                   "script without submitting it)."]
    assert [p.name for p in run_dir.rglob("*")] == ["slurm", "plan.json"]
    assert (run_dir / "slurm" / "plan.json").read_text() == "an earlier submission's"


def test_a_runs_root_that_is_a_file_is_refused_naming_runs_root(tmp_path, capsys):
    # Before: the dry run passed, and a sweep's answer was "pass another --run_dir".
    a_file = tmp_path / "a_file"
    a_file.write_text("kept")
    array = tmp_path / "grid.yaml"
    array.write_text("name: g\ngrid: {train.seed: [0, 1]}\n")
    for args in ([], ["--array", str(array)]):
        assert cli.main(["submit", *TINY, "--runs_root", str(a_file), *args, "--dry_run"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"danastar submit: --runs_root {a_file} is a file; give --runs_root a "
                       "folder."]
    assert a_file.read_text() == "kept"


def test_a_profile_fills_the_script_and_caps_the_micro_batch(tmp_path, capsys):
    registry = tmp_path / "clusters.yaml"
    registry.write_text(
        "clusters:\n"
        "  - name: big\n"
        "    partition: gpu\n"
        "    account: lab\n"
        "    gpu_type: a100\n"
        "    gpus_per_node: 2\n"
        "    cpus_per_gpu: 6\n"
        "    max_time: '12:00:00'\n"
        "    setup: ['module load python/3.12', 'source ~/venv/bin/activate']\n"
        "    sbatch_extra: ['--constraint=a100']\n"
        "    micro_batch_caps: {2: 1}\n"
        f"    results_dir: {tmp_path / 'results'}\n"
        "    scratch: /local/$USER\n")
    code = cli.main(["submit", *TINY, "--cluster", "big", "--clusters", str(registry),
                     "--dry_run"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("# cluster: big")
    assert f"RUN_DIR={tmp_path / 'results'}/synthetic-enoki-h2-adana-lr0.003-b8x32-" in out
    assert "export SLURM_TMPDIR=/local/$USER" in out
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=lab", "#SBATCH --time=12:00:00",
                 "#SBATCH --gpus-per-node=2", "#SBATCH --cpus-per-task=6",
                 "#SBATCH --constraint=a100", "module load python/3.12", "PYTHON=python"):
        assert line in out, line
    # --batch_size 4 over 2 GPUs is 2 per GPU, over the cap of 1: halved, accumulation doubled
    assert "--batch_size 2 --acc_steps 4)" in out
    assert cli.main(["submit", *TINY, "--run_dir", str(tmp_path / "r"), "--cluster", "big",
                     "--clusters", str(registry), "--batch_size", "6", "--dry_run"]) == 2
    assert "halving it does not split evenly" in capsys.readouterr().err


def test_slurm_time_limits_are_read_as_sbatch_reads_them():
    cases = {"30": 1800, "30:15": 1815, "2:00:00": 7200, "1-0": 86400, "1-2:30": 95400,
             "1-02:00:05": 93605, "0-04:00": 14400, "0-4": 14400, "2-": 172800,
             "infinite": None, "UNLIMITED": None, "-1": None, "0": None, "": None}
    assert {text: slurm.time_limit_seconds(text) for text in cases} == cases
    for bad in ("24h", "abc", "1:2:3:4", "1-2-3", "-5", "1.5", ":30", "1-:30"):
        with pytest.raises(UserError, match=f"--time '{bad}' is not a SLURM time limit; write it "
                                            "as minutes, minutes:seconds, hours:minutes:seconds"):
            slurm.time_limit_seconds(bad)
    for good in ("0", "64000", "64G", "64gb", "512K", "2T"):
        slurm.check_memory(good)


@pytest.mark.parametrize("args, message", [
    (["--time", "24h"], "--time '24h' is not a SLURM time limit"),
    (["--mem", "64Q"], "--mem '64Q' is not a SLURM memory size"),
    (["--max_restarts", "-1"], "--max_restarts -1 must be at least 0."),
    (["--tasks_per_node", "0"], "--tasks_per_node 0 must be at least 1."),
    (["--cpus_per_task", "0"], "--cpus_per_task 0 must be at least 1"),
    (["--gpus_per_node", "-4"], "--gpus_per_node -4 must be at least 0"),
    (["--partition", "gpu long"], "--partition 'gpu long' is not one word"),
    (["--no_auto_resume"], "--no_auto_resume would make every requeued segment of the job "
                           "start again from step 0"),
])
def test_slurm_values_are_refused_in_the_dry_run(tmp_path, capsys, args, message):
    code = cli.main(["submit", *TINY, "--run_dir", str(tmp_path / "r"), *args, "--dry_run"])
    stderr = capsys.readouterr().err
    assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "r").exists()


def test_days_hours_is_read_as_hours_not_minutes(tmp_path, capsys):
    # 0-04:00 is four hours: 300 s of signal lead fit (read as 4:00, 240 s, they did not)
    code = cli.main(["submit", *TINY, "--run_dir", str(tmp_path / "r"), "--time", "0-04:00",
                     "--dry_run"])
    assert code == 0 and "#SBATCH --time=0-04:00" in capsys.readouterr().out


def test_the_plan_says_its_epochs_and_warns_past_four(tmp_path, capsys):
    assert cli.main(["submit", "--heads", "6", "--dataset", "shakespeare", "--run_dir",
                     str(tmp_path / "r"), "--gpus_per_node", "4", "--dry_run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == ("# plan: enoki with 10.2M parameters, adana, 3,120 steps of 65,536 "
                        "tokens: 108 epochs of shakespeare's 1,892,697 training tokens")
    assert lines[2].startswith("# warning: this run reads shakespeare 108 times over")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_without_run_dir_a_job_goes_beside_a_run_with_other_settings(tmp_path, capsys):
    root = tmp_path / "runs"
    base = root / default_run_dir(load_config(TINY)[0]).name
    assert cli.main(["train", *TINY, "--iterations", "2", "--run_dir", str(base)]) == 0
    capsys.readouterr()
    assert cli.main(["submit", *TINY, "--iterations", "3", "--runs_root", str(root),
                     "--dry_run"]) == 0
    assert f"RUN_DIR={base}-it3\n" in capsys.readouterr().out


@pytest.mark.process  # a stand-in sbatch
def test_a_queued_job_is_not_listed_as_a_run_named_slurm(tmp_path, capsys, monkeypatch):
    # Before: `danastar results` read <run_dir>/slurm/plan.json, the plan the job was checked
    # against, as a run of its own named "slurm".
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho '123;here'\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert cli.main(["submit", *TINY, "--run_dir", str(tmp_path / "runs" / "r")]) == 0
    assert (tmp_path / "runs" / "r" / "slurm" / "plan.json").is_file()
    capsys.readouterr()
    assert cli.main(["results", str(tmp_path / "runs")]) == 2
    assert "no run directories (with a plan.json) under" in capsys.readouterr().err


def test_a_job_may_extend_a_finished_run_past_its_planned_steps(tmp_path, capsys):
    """`--extend` passes the check a job gets before it is submitted (the same as `train`'s)
    and goes into the job's arguments; without it the longer run is refused, naming it."""
    run_dir = str(tmp_path / "r")
    assert cli.main(["train", *TINY, "--iterations", "4", "--run_dir", run_dir]) == 0
    capsys.readouterr()
    longer = ["submit", *TINY, "--iterations", "8", "--run_dir", run_dir, "--dry_run"]
    assert cli.main(longer) == 2
    assert "pass --extend (rewarm" in capsys.readouterr().err
    assert cli.main([*longer, "--extend", "stretch"]) == 0
    script = capsys.readouterr().out
    assert "--iterations 8 --extend stretch)" in script, script
    assert cli.main([*longer, "--extend"]) == 0  # alone: rewarm, which the job's train reads
    script = capsys.readouterr().out
    assert "--iterations 8 --extend)" in script, script
