"""The files the pages' commands use: the sweep file they name is in the repository and is the
one the page shows."""

from __future__ import annotations

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
