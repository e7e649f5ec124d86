"""`danastar results` with the scores of `danastar eval`: the newest `eval/<step>.json` of each
run as one column per task metric beside the losses ("-" where a run has none), in the table,
--csv and --json; the table unchanged when no run was evaluated. The files are written here in
the documented format (tests/export/test_eval_command.py reads one the real command wrote)."""

from __future__ import annotations

import csv
import json

from fake_runs import write_run

from danastar.analysis import table
from danastar.cli import main


def write_eval(run_dir, step, tasks, name=None) -> None:
    """``eval/<step>.json`` as `danastar eval` writes it (danastar.export.evaluate)."""
    folder = run_dir / "eval"
    folder.mkdir(exist_ok=True)
    record = {"step": step, "checkpoint": f"{run_dir}/checkpoints/latest-{step or 0:08d}",
              "architecture": "LlamaForCausalLM", "lm_eval_version": "0.4", "limit": None,
              "num_fewshot": None, "samples": {task: 4 for task in tasks}, "tasks": tasks}
    (folder / f"{name or step}.json").write_text(json.dumps(record))


def test_the_newest_scores_of_each_run_are_columns_beside_the_loss(tmp_path, capsys):
    scored = write_run(tmp_path, "adamw", 4, iterations=100)
    plain = write_run(tmp_path, "adana", 4, iterations=100)
    write_eval(scored, 50, {"hellaswag": {"acc": 0.25, "acc_stderr": 0.01}})
    write_eval(scored, 100, {"hellaswag": {"acc": 0.3, "acc_stderr": 0.02, "acc_norm": 0.31},
                             "lambada_openai": {"perplexity": 40.5, "acc": 0.2}})
    write_eval(scored, None, {"hellaswag": {"acc": 0.9}}, name="export")  # step unknown: oldest

    capsys.readouterr()
    assert main(["results", str(tmp_path), "--json", "-"]) == 0
    rows = {row["run"]: row for row in json.loads(capsys.readouterr().out)}
    columns = ("hellaswag acc", "hellaswag acc_norm", "lambada_openai acc",
               "lambada_openai perplexity")
    at = list(rows[scored.name]).index("best_loss") + 1
    assert tuple(rows[scored.name])[at:at + 4] == columns  # beside the loss, no stderr
    assert [rows[scored.name][c] for c in columns] == [0.3, 0.31, 0.2, 40.5]
    assert [rows[plain.name][c] for c in columns] == [None] * 4

    assert main(["results", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "hellaswag acc  hellaswag acc_norm" in lines[0]
    assert "0.3000" in next(line for line in lines if line.startswith(scored.name))
    plain_line = next(line for line in lines if line.startswith(plain.name))
    assert plain_line.split().count("-") >= 4

    out = tmp_path / "table.csv"
    assert main(["results", str(tmp_path), "--csv", str(out)]) == 0
    by_run = {row["run"]: row for row in csv.DictReader(out.open())}
    assert by_run[scored.name]["lambada_openai perplexity"] == "40.5"
    assert by_run[plain.name]["hellaswag acc"] == ""


def test_without_eval_files_the_table_is_unchanged(tmp_path, capsys):
    write_run(tmp_path, "adamw", 4, iterations=100)
    capsys.readouterr()
    assert main(["results", str(tmp_path), "--json", "-"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert tuple(row) == table.COLUMNS
    assert table.run_columns(table.eval_columns([])) == table.COLUMNS


def test_an_unreadable_eval_file_is_named_and_the_older_one_used(tmp_path, capsys):
    run_dir = write_run(tmp_path, "adamw", 4, iterations=100)
    write_eval(run_dir, 50, {"piqa": {"acc": 0.6}})
    (run_dir / "eval" / "100.json").write_text("{cut short")
    capsys.readouterr()
    assert main(["results", str(tmp_path), "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)[0]["piqa acc"] == 0.6
    assert "100.json is not valid JSON" in captured.err and "scores are left out" in captured.err
