"""The release's files agree on the version and say what they must."""

from pathlib import Path

import pytest
import yaml

import danastar

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_is_the_same_everywhere_it_is_written():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert project["version"] == danastar.__version__ == citation["version"]
    assert f"## {danastar.__version__}\n" in (ROOT / "CHANGELOG.md").read_text()


def test_the_citation_names_the_paper_and_the_license_is_mit():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    paper = citation["preferred-citation"]
    assert paper["title"] == "Logarithmic-time Schedules for Scaling Language Models with Momentum"
    assert paper["url"] == "https://arxiv.org/abs/2602.05298"
    assert citation["cff-version"] == "1.2.0" and citation["license"] == "MIT"
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License\n\nCopyright (c) 2026 the danastar authors\n")
