"""`danastar results` on run directories written from synthetic numbers, and bad input."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
from fake_runs import write_run

from danastar.analysis import records, seeds
from danastar.cli import main


def results_json(capsys, *args):
    assert main(["results", *args, "--json", "-"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_run_is_listed_with_its_state(sweep, capsys):
    rows = results_json(capsys, str(sweep))
    assert len(rows) == 2 * 3 * 6 + 1
    partial = [r for r in rows if r["state"] == "partial"]
    assert len(partial) == 1 and partial[0]["final_loss"] is None
    done, total = partial[0]["steps"].split("/")
    assert int(done) < int(total)
    complete = rows[0]
    assert complete["state"] == "complete" and complete["final_loss"] > 2
    # compute = 6 · 12·d²·L · tokens, in PFH
    run = records.read_run(sweep / complete["run"])
    assert complete["pfh"] == pytest.approx(6 * run.plan["non_embedding_params"]
                                            * complete["tokens"] / 3.6e18)


def test_best_keeps_the_best_lr_per_size_with_seed_statistics(sweep, capsys):
    rows = results_json(capsys, str(sweep), "--best")
    assert [(r["optimizer"].split()[0], r["heads"]) for r in rows] == [
        ("adamw", 4), ("adamw", 6), ("adamw", 8),
        ("dana-star-mk4", 4), ("dana-star-mk4", 6), ("dana-star-mk4", 8)]
    for row in rows:
        assert row["seeds"] == 2  # the law's LR wins, and it has two seeds
        assert row["runs_at_size"] == 6  # the partial run is left out
    first = rows[0]
    finals = [r.final_loss for r in records.find_runs([sweep])
              if r.optimizer == "adamw" and r.heads == 4 and r.complete
              and f"{r.lr:.4g}" == f"{first['lr']:.4g}"]
    expected = seeds.mean_se(finals)
    assert first["final_loss"] == pytest.approx(expected.mean)
    assert first["final_loss_se"] == pytest.approx(expected.se)


def test_vs_adamw_adds_the_multiplier_and_csv_writes_a_file(sweep, capsys, tmp_path):
    rows = results_json(capsys, str(sweep), "--vs", "adamw")
    for row in rows:
        if row["optimizer"] == "adamw":
            assert row["multiplier"] == 1.0 and row["saved_fraction"] is None
        else:  # the synthetic Dana-Star-MK4 has the lower loss at every size
            assert row["multiplier"] > 1.0 and row["multiplier_kind"] != "baseline"
            # it reaches AdamW's final loss early: the saving goes with the multiplier
            assert row["saved_fraction"] == pytest.approx(1 - 1 / row["multiplier"], abs=0.2)
    out = tmp_path / "best.csv"
    assert main(["results", str(sweep), "--vs", "adamw", "--csv", str(out)]) == 0
    with out.open() as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == 6 and "multiplier" in table[0]


def test_plain_table_when_not_a_terminal(sweep, capsys):
    assert main(["results", str(sweep), "--vs", "adamw"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["optimizer", "arch", "heads"]
    assert "multiplier" in lines[0] and len(lines) >= 7
    assert "± " in lines[1]  # two seeds: mean ± standard error
    assert lines[-1] == "(1 partial run(s) left out)"


def test_a_run_is_complete_only_with_its_final_record_at_the_last_step(tmp_path):
    done = write_run(tmp_path, "adamw", 4, iterations=100)
    cut = write_run(tmp_path, "adamw", 6, iterations=100, stop_at=60)
    with (cut / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 80, "val_lo')  # a line cut short by a kill
    run, partial = records.read_run(done), records.read_run(cut)
    assert run.complete and run.state == "complete" and run.steps_done == 100
    assert not partial.complete and partial.state == "partial" and partial.steps_done == 60
    assert partial.final_loss is None and partial.best_loss is not None


def cli(*args):
    return subprocess.run([sys.executable, "-m", "danastar", *args], capture_output=True,
                          text=True, timeout=120)


def test_bad_input_is_one_sentence_and_exit_2(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    partial = tmp_path / "partial"
    write_run(partial, "adamw", 4, iterations=100, stop_at=40)
    write_run(partial, "adamw", 6, iterations=100, stop_at=40)
    no_baseline = tmp_path / "no_baseline"
    for heads in (4, 6):
        write_run(no_baseline, "dana-star-mk4", heads, iterations=100)
    rising = tmp_path / "rising"  # the larger baseline is worse: no multiplier can be read
    write_run(rising, "adamw", 4, iterations=100)
    write_run(rising, "adamw", 6, iterations=100, lr_ratio=8.0)
    cases = [
        (["results", str(empty)], "no run directories"),
        (["results", str(rising), "--vs", "adamw"], "do not decrease with compute"),
        (["results", str(partial), "--best"], "are partial"),
        (["plot", "scaling", str(partial), "--out", str(tmp_path / "f")], "are partial"),
        (["plot", "scaling", str(no_baseline), "--out", str(tmp_path / "f")],
         "needs complete adamw runs at two or more sizes"),
    ]
    for args, message in cases:
        result = cli(*args)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "f.png").exists()
