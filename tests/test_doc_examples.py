"""The files the pages' commands use: the sweep file they name is in the repository and is the
one the page shows, and the scripts under docs/ say what they do in a few lines (the pages' own
commands run them for real in tests/test_docs.py; here their training is a stand-in, so that
what they print is checked in a second)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from danastar.launch.sweep_spec import load_sweep
from doc_blocks import commands, parse

ROOT = Path(__file__).resolve().parents[1]


def test_the_sweep_file_of_the_analysis_page_is_shipped_as_shown_and_parses():
    blocks, _ = parse("docs/analysis.md")
    shown = next(block for block in blocks if block.file_path == "sweeps/lr.yaml")
    shipped = ROOT / "sweeps" / "lr.yaml"
    assert shipped.read_text() == shown.text  # one file: what the page shows is what runs
    sweep = load_sweep(shipped)
    assert sweep.name == "lr-sweep-cpu" and len(sweep.points()) == 3 * 3 * 5
    run = [words for block in blocks if block.is_shell and block.not_run is None
           for words in commands(block)]
    assert ["danastar", "sweep", "sweeps/lr.yaml", "--dry_run"] in run


def load_script(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_train(opt, heads, lr, run_dir, iterations):
    """What a run leaves that the script reads (its final validation loss), and a transcript."""
    run_dir.mkdir(parents=True)
    final = {"step": iterations, "val_loss": 6.5 + heads / 100, "final": True}
    (run_dir / "metrics.jsonl").write_text(json.dumps(final) + "\n")
    return 0, "step 1/2: train_loss 7.1\n" * 50 + "next: danastar results ...\n"


def test_make_runs_prints_a_line_per_run_and_what_to_do_with_the_grid(tmp_path, capsys,
                                                                      monkeypatch):
    make_runs = load_script("docs/analysis/make_runs.py")
    monkeypatch.setattr(make_runs, "train", fake_train)
    root = tmp_path / "example"
    assert make_runs.main([str(root), "--iterations", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("12 runs of 2 steps on Shakespeare") and str(root) in lines[0]
    runs = lines[1:-1]
    assert len(runs) == 12 and "step 1/2" not in "\n".join(lines)  # no transcript
    assert runs[0].startswith("[1/12] adamw, 2 heads, lr ")
    assert f" in {root}/adamw_h2_lr" in runs[0] and runs[0].endswith(" s)")
    assert "final validation loss 6.5200" in runs[0]
    assert lines[-1] == (f"next: danastar results {root} --best  |  danastar plot curves {root} "
                         f"--best --out scratch/curves_best  |  danastar plot lr-sweep {root} "
                         f"--out scratch/lr_sweep")
    # a second time, every run is there already
    assert make_runs.main([str(root)]) == 0
    again = capsys.readouterr().out.splitlines()[1:-1]
    assert all(line.endswith("already trained, skipped") for line in again)


def test_make_runs_shows_the_output_of_a_run_that_fails(tmp_path, capsys, monkeypatch):
    make_runs = load_script("docs/analysis/make_runs.py")
    monkeypatch.setattr(make_runs, "train", lambda *run: (2, "danastar train: no data.\n"))
    assert make_runs.main([str(tmp_path)]) == 2
    last = capsys.readouterr().out.splitlines()[-2:]
    assert last[0].endswith("failed (exit code 2); its output:")
    assert last[1] == "danastar train: no data."
