"""Without --run_dir a run goes to runs/<name from its settings>, or to a directory of its own
beside it when that holds another run; the same command finds its directory again, and a longer
run on a schedule that allows it continues there. With --run_dir the refusal stays."""

import json

import pytest

from danastar.cli import main as danastar_main
from danastar.config import default_run_dir, load_config

from train_helpers import TINY


def train(capsys, *argv):
    code = danastar_main(["train", *TINY, *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def steps_logged(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if "train_loss" in line]


@pytest.mark.slow
def test_changing_a_setting_goes_to_its_own_directory_and_the_same_command_finds_it(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    base = default_run_dir(load_config([*TINY, "--iterations", "6"])[0])

    code, said = train(capsys, "--iterations", "6")
    assert code == 0, said
    assert "6 steps of 256 tokens (0.00384 epochs of synthetic's 400,000 training tokens)" in said
    assert said.splitlines()[-1] == f"next: danastar results {base}"  # no tokenizer: no sample
    before = (base / "metrics.jsonl").read_text()

    # shorter on the default cos_inf schedule: another run, which goes beside the first
    shorter = base.with_name(f"{base.name}-it3")
    code, said = train(capsys, "--iterations", "3")
    assert code == 0, said
    assert (f"{base} holds a run with other settings (" in said and "iterations" in said
            and f"so this one goes to its own directory, {shorter}" in said), said
    assert steps_logged(shorter)[-1] == 3 and (base / "metrics.jsonl").read_text() == before

    # the same command again finds it (finished, it says so and what to do next)
    code, said = train(capsys, "--iterations", "3")
    assert code == 0 and "this run already finished at step 3" in said, said
    assert said.splitlines()[-1] == f"next: danastar results {shorter}"

    # a difference the name does not carry, beside the iterations: a name with a hash
    code, said = train(capsys, "--iterations", "6", "--grad_clip", "1")
    assert code == 0, said
    hashed = [base.with_name(path.name) for path in base.parent.iterdir()
              if path.name not in (base.name, shorter.name)]
    assert len(hashed) == 1 and hashed[0].name.startswith(base.name + "-"), hashed
    assert "grad_clip" in said and f"its own directory, {hashed[0]}" in said, said
    code, said = train(capsys, "--iterations", "6", "--grad_clip", "1")
    assert code == 0 and f"run directory {hashed[0]};" in said and "already finished" in said

    # with --run_dir the run is refused as before, and nothing is written there
    code, said = train(capsys, "--iterations", "3", "--run_dir", str(base))
    assert code == 2 and f"{base} holds another run" in said, said
    assert (base / "metrics.jsonl").read_text() == before


@pytest.mark.slow
def test_a_longer_run_on_a_schedule_that_allows_it_continues_in_its_directory(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    fixed = ["--opt", "adamw", "--scheduler", "none", "--warmup_steps", "0",
             "optim.weight_decay=0.1"]
    code, said = train(capsys, *fixed, "--iterations", "4")
    assert code == 0, said
    run_dir = default_run_dir(load_config([*TINY, *fixed])[0])
    code, said = train(capsys, *fixed, "--iterations", "6")
    assert code == 0, said
    assert f"run directory {run_dir};" in said and "resumed from" in said
    assert "iterations: 4 → 6" in said
    assert steps_logged(run_dir) == [1, 2, 3, 4, 5, 6]
    assert [path.name for path in run_dir.parent.iterdir()] == [run_dir.name]
