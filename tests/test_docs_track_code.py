"""The user guide follows the code: every flag of `danastar train` is in docs/training.md, and no
page calls a command that exists "not built"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from danastar.cli import SUBCOMMANDS
from danastar.config import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def train_flags() -> list[str]:
    return sorted({option for action in build_parser()._actions
                   for option in action.option_strings if option.startswith("--")})


def mentions(text: str, flag: str) -> bool:
    # `--moe` must not count as found inside `--moe_routing`.
    return re.search(re.escape(flag) + r"(?![\w-])", text) is not None


def test_the_flags_come_from_the_parser():
    flags = train_flags()
    assert {"--heads", "--opt", "--dry_run", "--no_auto_resume", "--moe"} <= set(flags)


@pytest.mark.parametrize("flag", train_flags())
def test_every_train_flag_is_in_the_training_guide(flag):
    text = (ROOT / "docs" / "training.md").read_text()
    assert mentions(text, flag), (
        f"`danastar train {flag}` is not in docs/training.md: add it to the flags table there "
        "(or to the paragraph that names the flags documented on another page)")


def test_a_flag_is_found_only_whole():
    assert mentions("`--moe` and `--moe_routing`", "--moe")
    assert not mentions("`--moe_routing`", "--moe")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_no_page_calls_a_built_command_not_built(page):
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if re.search(r"not (?:built|implemented|yet available)", line, re.IGNORECASE):
            named = [c for c in SUBCOMMANDS if re.search(rf"`danastar {c}`", line)]
            assert not named, (f"{page.name}:{number} says `danastar {named[0]}` is not built, "
                               f"but it is a command: {line.strip()}")
