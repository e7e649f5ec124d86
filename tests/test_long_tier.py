"""The long tier's list names tests that exist: a renamed or removed test would otherwise leave a
key that marks nothing, and its replacement would run in the default tier unnoticed."""

import ast
from pathlib import Path

import pytest

from doc_blocks import parse

from long_tier import LONG_TESTS, is_long

ROOT = Path(__file__).resolve().parent.parent


def functions_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("key", sorted(LONG_TESTS))
def test_every_key_names_a_test_function_that_exists(key):
    path, name = key.split("::")
    assert (ROOT / path).is_file(), key
    assert name.split("[")[0] in functions_in(ROOT / path), key
    assert LONG_TESTS[key], f"{key}: say what covers its ground in the default tier"


def test_a_key_ending_inside_brackets_marks_each_case_it_starts():
    key = next(k for k in LONG_TESTS if "[" in k and not k.endswith("]"))
    assert is_long(key + ": 0.85 → 0.9]")
    assert not is_long(key.split("[")[0] + "[flags0-lr: 0.003 → 0.001]")
    assert not is_long("tests/test_docs.py::test_page_commands[docs/training.md]")


@pytest.mark.parametrize("key", sorted(k for k in LONG_TESTS if k.startswith("tests/test_docs.py")))
def test_every_docs_key_names_a_page_or_block_that_is_there(key):
    """A docs block's id holds its line, which `long_tier.python_block` finds by a line of its
    code: a block edited so that none or two have that line leaves a key marking nothing."""
    case = key.split("[", 1)[1].rstrip("]")
    if "::test_python_block[" in key:
        page, line = case.rsplit(":", 1)
        assert line.isdigit(), f"{key}: no one python block has that line"
        blocks = parse(page)[0]
        assert any(b.line == int(line) and b.language == "python" for b in blocks), \
            f"{key}: no python block opens at {page}:{line}"
    else:
        assert (ROOT / case).is_file(), key
