"""A start is decided once: `danastar train` decides the plan and the run directory, and under
`--nproc N` writes that decision into the run directory for its workers, which take it instead
of deciding again (and refuse one made for other settings); the file goes when they end."""

import subprocess

import pytest

from danastar.cli import main as danastar_main
from danastar.config import default_run_dir, load_config
from danastar.errors import UserError
from danastar.rundir.files import START_FILE
from danastar.train.decision import (
    START_FILE_VARIABLE,
    decide,
    read_for_worker,
    write_for_workers,
)

from train_helpers import TINY, command, environment


def test_a_worker_takes_the_decision_its_launcher_wrote(tmp_path, monkeypatch):
    config, _ = load_config([*TINY, "--iterations", "3", "--run_dir", str(tmp_path / "run"),
                             "--nproc", "2"])
    decision = decide(config, world_size=2)
    path = write_for_workers(decision, config)
    assert path == tmp_path / "run" / START_FILE
    monkeypatch.setenv(START_FILE_VARIABLE, str(path))
    taken = read_for_worker(config, world_size=2)
    assert (taken.plan, taken.run_dir) == (decision.plan, decision.run_dir)

    other, _ = load_config([*TINY, "--iterations", "3", "--run_dir", str(tmp_path / "run"),
                            "--nproc", "2", "--lr", "1e-3"])
    with pytest.raises(UserError, match="settings differ from those its launching process"):
        read_for_worker(other, world_size=2)
    monkeypatch.delenv(START_FILE_VARIABLE)
    assert read_for_worker(config, world_size=2) is None  # another launcher's worker: its own


@pytest.mark.slow
def test_the_workers_train_where_the_launcher_chose_and_its_file_goes(tmp_path, monkeypatch,
                                                                    capsys):
    monkeypatch.chdir(tmp_path)
    base = default_run_dir(load_config([*TINY, "--iterations", "6"])[0])
    assert danastar_main(["train", *TINY, "--iterations", "6"]) == 0  # base holds this run
    capsys.readouterr()

    # another run of these settings (shorter on cos_inf) goes beside it, as the launcher chose
    argv = [arg for arg in command(["--iterations", "3", "--nproc", "2"], "x", 0)
            if arg not in ("--run_dir", "x")]
    result = subprocess.run(argv, cwd=tmp_path, env=environment(), capture_output=True,
                            text=True, timeout=300)
    said = result.stdout + result.stderr
    shorter = base.with_name(f"{base.name}-it3")
    assert result.returncode == 0, said
    assert said.count(f"so this one goes to its own directory, {shorter}") == 1, said
    assert (shorter / "checkpoints").is_dir() and not (shorter / START_FILE).exists()
    assert sorted(path.name for path in base.parent.iterdir()) == [base.name, shorter.name]
