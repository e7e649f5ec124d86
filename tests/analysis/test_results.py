"""`danastar results` on run directories written from synthetic numbers, and bad input."""

from __future__ import annotations

import csv
import json
import os
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
    assert capsys.readouterr().out == (f"wrote 6 rows of the best LRs with their multiplier "
                                       f"against adamw to {out}\n")


def test_a_written_file_is_said_in_one_line_and_standard_output_keeps_the_table_alone(
        sweep, capsys, tmp_path):
    out = tmp_path / "runs.json"
    assert main(["results", str(sweep), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert capsys.readouterr().out == f"wrote {len(rows)} rows of the run table to {out}\n"
    assert main(["results", str(sweep), "--best", "--json", "-", "--csv", str(tmp_path / "b")]) == 0
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)) == 6  # the JSON alone, parsed whole
    assert captured.err == (f"wrote 6 rows of the best LR per optimizer and size to "
                            f"{tmp_path / 'b'}\n")


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


def test_a_failed_run_or_one_whose_final_loss_is_not_finite_is_never_complete(tmp_path,
                                                                              capsys):
    """Training records a run whose every step was skipped (or that diverged) as failed in
    status.json; its final record may still be there, even with a finite loss."""
    failed = write_run(tmp_path, "adamw", 4, iterations=100)
    (failed / "status.json").write_text(json.dumps({"state": "failed", "step": 100}))
    nan = write_run(tmp_path, "adamw", 6, iterations=100)
    lines = (nan / "metrics.jsonl").read_text().splitlines()
    lines[-1] = json.dumps({**json.loads(lines[-1]), "val_loss": float("nan")})
    (nan / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    for run_dir in (failed, nan):
        run = records.read_run(run_dir)
        assert not run.complete and run.state == "failed" and run.final_loss is None
    rows = results_json(capsys, str(tmp_path))
    assert [row["state"] for row in rows] == ["failed", "failed"]


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


def refusal(capsys, *args):
    """The one line `danastar` says when it refuses ``args`` (exit 2)."""
    capsys.readouterr()
    assert main(list(args)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith(f"danastar {args[0]}: ")
    return lines[-1]


def test_best_never_pools_runs_on_different_data_as_seeds(tmp_path, capsys):
    # seeds 0 and 1 on one dataset, seed 0 on another, seed 0 on the same name prepared anew
    for seed in (0, 1):
        write_run(tmp_path / "a", "adamw", 4, iterations=100, seed=seed, dataset="shakespeare",
                  fingerprint="aaaa1111bbbb2222")
    write_run(tmp_path / "b", "adamw", 4, iterations=100, dataset="synthetic",
              fingerprint="cccc3333dddd4444")
    write_run(tmp_path / "c", "adamw", 4, iterations=100, dataset="shakespeare",
              fingerprint="eeee5555ffff6666")
    rows = results_json(capsys, str(tmp_path), "--best")
    assert [(r["dataset"], r["seeds"]) for r in rows] == [
        ("shakespeare (aaaa1111)", 2), ("shakespeare (eeee5555)", 1), ("synthetic", 1)]
    assert main(["results", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "dataset" in table[0].split() and sum("synthetic" in line for line in table) == 1


def test_the_same_seed_twice_at_one_lr_is_refused_naming_both_runs(tmp_path, capsys):
    first = write_run(tmp_path / "a", "adamw", 4, iterations=100)
    second = write_run(tmp_path / "b", "adamw", 4, iterations=100)
    for args in (["results", str(tmp_path), "--best"],
                 ["plot", "lr-sweep", str(tmp_path), "--out", str(tmp_path / "f")]):
        message = refusal(capsys, *args)
        assert f"{first} and {second} are both seed 0 of adamw" in message
        assert "a repeat of one run" in message and "another --seed" in message
    assert not (tmp_path / "f.png").exists()


def test_vs_finds_the_baseline_by_its_optimizer_name(sweep, capsys, tmp_path):
    assert main(["results", str(sweep), "--vs", "dana-star-mk4", "--json", "-"]) == 0
    captured = capsys.readouterr()
    label = next(r["optimizer"] for r in json.loads(captured.out)
                 if r["multiplier_kind"] == "baseline")
    assert label.startswith("dana-star-mk4 κ=")
    assert f"--vs dana-star-mk4 is {label}" in captured.err
    two = tmp_path / "two_kappas"
    for kappa in (0.5, 0.85):
        for heads in (4, 6):
            write_run(two, "adana", heads, iterations=100, kappa=kappa)
    assert refusal(capsys, "results", str(two), "--vs", "adana").endswith(
        "--vs adana matches 2 optimizers ('adana κ=0.5', 'adana κ=0.85'); name one of them, "
        "e.g. --vs 'adana κ=0.5'.")
    for name in ("adana κ=0.5", "adana kappa=0.5"):
        rows = results_json(capsys, str(two), "--vs", name)
        assert [r["multiplier"] for r in rows if r["optimizer"] == "adana κ=0.5"] == [1.0, 1.0]


def test_unreadable_lines_and_runs_are_reported_and_the_others_shown(tmp_path, capsys):
    good = write_run(tmp_path, "adamw", 4, iterations=100)
    lines = (good / "metrics.jsonl").read_text().splitlines()
    lines[2:2] = ["not json", '{"step": "ten", "val_loss": 3.0}']
    (good / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 100, "val_lo')
    total = len(lines) + 1
    corrupt = write_run(tmp_path, "adamw", 6, iterations=100)
    (corrupt / "plan.json").write_text('{"plan": {"arch": "enoki",')
    empty = write_run(tmp_path, "adamw", 8, iterations=100)
    (empty / "plan.json").write_text("{}")
    folder = tmp_path / "folder"
    (folder / "plan.json").mkdir(parents=True)
    assert main(["results", str(tmp_path), "--json", "-"]) == 0
    captured = capsys.readouterr()
    rows, err = json.loads(captured.out), captured.err.splitlines()
    assert [row["run"] for row in rows] == [good.name] and rows[0]["state"] == "complete"
    assert f"danastar results: 3 of the {total} lines of {good / 'metrics.jsonl'} could not be " \
           f"read and were left out (lines 3, 4, {total})" in err[0]
    assert err[1] == (f"danastar results: left out {corrupt}: {corrupt / 'plan.json'} is not "
                      "valid JSON (Expecting property name enclosed in double quotes at line 1); "
                      "restore the file or move the run directory away")
    assert f"left out {empty}: {empty / 'plan.json'} has no 'non_embedding_params'" in err[2]
    assert f"left out {folder}: {folder / 'plan.json'} cannot be read (Is a directory)" in err[3]
    # the figures read the same records
    assert main(["plot", "curves", str(tmp_path), "--out", str(tmp_path / "curves")]) == 0
    assert (tmp_path / "curves.png").exists()
    assert "left out" in capsys.readouterr().err


def test_a_run_moved_aside_by_train_is_not_a_seed_of_the_live_one(tmp_path, capsys):
    live = write_run(tmp_path, "adamw", 4, iterations=100)
    write_run(live / "previous-20250101T000000Z", "adamw", 4, iterations=100)
    assert main(["results", str(tmp_path), "--best", "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)[0]["seeds"] == 1
    assert "left out 1 earlier run(s) moved aside into previous-<time>/" in captured.err


def test_output_files_in_missing_or_unwritable_folders(sweep, tmp_path, capsys):
    # a missing folder is created, as train creates a run directory
    out = tmp_path / "new" / "deeper" / "best.csv"
    assert main(["results", str(sweep), "--best", "--csv", str(out)]) == 0
    assert out.read_text().startswith("optimizer,")
    assert main(["plot", "curves", str(sweep), "--out", str(tmp_path / "new2" / "c")]) == 0
    assert (tmp_path / "new2" / "c.pdf").exists()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("kept")
    cases = [(["results", str(sweep), "--json", str(a_file / "x.json")],
              f"--json {a_file / 'x.json'} cannot be written: {a_file} is a file, not a folder"),
             (["results", str(sweep), "--csv", str(tmp_path)],
              f"--csv {tmp_path} is a folder; give --csv a file name."),
             (["plot", "curves", str(sweep), "--out", str(a_file / "sub" / "c")],
              f"--out {a_file / 'sub' / 'c.png'} cannot be written: {a_file} is a file")]
    if os.geteuid() == 0:  # chmod does not stop root; a read-only file system does
        read_only = "/proc/sys" if not os.access("/proc/sys", os.W_OK) else None
    else:
        read_only = tmp_path / "locked"
        read_only.mkdir()
        read_only.chmod(0o555)
    if read_only is not None:
        cases.append((["results", str(sweep), "--csv", os.path.join(read_only, "r.csv")],
                      f"cannot be written: {read_only} does not take new files"))
        cases.append((["plot", "scaling", str(sweep), "--out", os.path.join(read_only, "s")],
                      f"cannot be written: {read_only} does not take new files"))
    for args, message in cases:
        assert message in refusal(capsys, *args)
    assert a_file.read_text() == "kept"


def test_best_shows_the_steps_and_names_the_runs_at_other_budgets(tmp_path, capsys):
    """A 50-step LR sweep and a longer run of one LR: --best compares the sweep's budget, shows
    its steps, and says which run it left out."""
    for ratio in (0.5, 1.0, 2.0):
        write_run(tmp_path, "adamw", 4, lr_ratio=ratio, iterations=50)
    write_run(tmp_path / "long", "adamw", 4, iterations=300)
    (row,) = results_json(capsys, str(tmp_path), "--best")
    assert row["steps"] == 50 and row["untuned"] is None  # the best LR is the middle one
    assert main(["results", str(tmp_path), "--best"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["optimizer", "arch", "heads", "dataset", "steps"]
    assert lines[1].split()[4] == "50"
    assert lines[-1] == ("(1 complete run(s) at other step budgets left out: adamw enoki h4 at "
                         "300 steps; each optimizer and size is compared at its steps with the "
                         "most LRs; --within_size compares budgets)")


def test_a_multiplier_from_untuned_lrs_is_marked_and_explained(tmp_path, capsys):
    """One LR per size (the defaults), and a sweep whose best LR is its largest: both marked."""
    for heads in (4, 6, 8):
        write_run(tmp_path, "adamw", heads, iterations=100)
        for ratio in (0.25, 0.5, 1.0) if heads == 4 else (1.0,):
            write_run(tmp_path, "adana", heads, iterations=100, lr_ratio=ratio)
    rows = {(r["optimizer"].split()[0], r["heads"]): r
            for r in results_json(capsys, str(tmp_path), "--vs", "adamw")}
    assert rows["adamw", 4]["untuned"] == "adamw: only one LR"
    assert rows["adana", 4]["untuned"] == ("adana κ=0.85: best LR the highest of 3; "
                                           "adamw: only one LR")
    assert rows["adana", 6]["untuned"] == "adana κ=0.85: only one LR; adamw: only one LR"
    assert main(["results", str(tmp_path), "--vs", "adamw"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(line.split()[-2].endswith("†") for line in lines[1:7])  # the multiplier column
    assert lines[-1].startswith("† untuned: an optimizer in this comparison has only one LR at "
                                "that size, or its best LR at the edge of its LRs")


def test_a_swept_best_lr_with_neighbours_on_both_sides_is_not_marked(sweep, capsys):
    rows = results_json(capsys, str(sweep), "--vs", "adamw")
    assert all(row["untuned"] is None for row in rows)
    assert main(["results", str(sweep), "--vs", "adamw"]) == 0
    assert "†" not in capsys.readouterr().out
