"""The plan of a run too short for its log-time weight decay says so in one line, in the
command's words (`danastar train --iterations 20 --dry_run`), once: not also as the optimizer's
own Python warning."""

import json
import warnings

import pytest

from danastar.commands.train import main
from danastar.hparams import ShortRunWeightDecayWarning

SENTENCE = ("warning: the log-time weight decay (omega 4 over wd_ts = 2 steps: weight_decay 2) "
            "removes all of every decaying weight in its first 5 steps at the schedule's peak, "
            "more than the 50% a run can spare there, so this run is too short for it; use a "
            "longer --iterations, a smaller --omega, or --omega 0 (no decay) for a smoke test.")


def dry_run(capsys, *flags):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShortRunWeightDecayWarning)  # the plan's line only
        assert main(["--dataset", "synthetic", "--dry_run", "--json", *flags]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_a_twenty_step_plan_says_its_decay_is_too_strong(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    planned, err = dry_run(capsys, "--iterations", "20")
    assert (planned["plan"]["weight_decay"], planned["plan"]["wd_ts"]) == (2.0, 2)
    assert err.strip().splitlines() == [SENTENCE]


@pytest.mark.parametrize("flags", [["--iterations", "300"], ["--iterations", "20", "--omega", "0"],
                                   ["--iterations", "20", "--opt", "adamw"]])
def test_no_word_where_the_run_is_long_enough_or_the_decay_is_off(capsys, tmp_path,
                                                                  monkeypatch, flags):
    monkeypatch.chdir(tmp_path)
    _, err = dry_run(capsys, *flags)
    assert "log-time weight decay" not in err
