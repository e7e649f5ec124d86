"""The compatibility matrix of docs/optimizers.md names, in every row with a ✓, tests that exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# `tests/x.py::name`, or `::name` for another test of the file named before it
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)?::(\w+)`")


def matrix_rows() -> list[str]:
    text = (ROOT / "docs" / "optimizers.md").read_text()
    section = text.split("## Compatibility", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and "✓" in line]


def test_every_test_the_matrix_names_exists():
    rows = matrix_rows()
    assert len(rows) == 14  # single device ... JAX / optax
    for row in rows:
        references, current = [], None
        for path, name in REFERENCE.findall(row):
            current = path or current
            assert current is not None, row
            references.append((current, name))
        assert references, f"a row with a ✓ names no test: {row[:60]}"
        for path, name in references:
            source = ROOT / path
            assert source.exists(), path
            assert re.search(rf"^def {name}\(", source.read_text(), re.MULTILINE), (
                f"{path}::{name}")
