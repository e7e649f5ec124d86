"""scripts/setup.sh says first what it installs and how long it takes, and reports broken
requirements of what danastar needs only (scripts/check_requirements.py), not those of a
system's unrelated packages. CI runs the whole setup from nothing (.ci/run)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"


def load_check_requirements():
    path = ROOT / "scripts" / "check_requirements.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def announcement(extras: str | None) -> str:
    """What the setup prints before it creates or installs anything."""
    script = SETUP.read_text()
    head = script[:script.index("if [ ! -x .venv/bin/python ]")]
    environment = {"PATH": "/usr/bin:/bin", **({"DANASTAR_EXTRAS": extras} if extras else {})}
    result = subprocess.run(["bash", "-c", head], capture_output=True, text=True, cwd=ROOT,
                            env=environment, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_setup_says_what_it_installs_and_how_long_it_takes():
    plain, dev = announcement(None), announcement("dev")
    assert "with the extras train, into .venv" in plain and "about 4 minutes" in plain
    assert "with the extras train,dev, into .venv" in dev and "about 10 minutes" in dev
    assert "CPU build of torch" in plain


def test_the_setup_leaves_pips_conflict_report_to_the_filtered_check():
    script = SETUP.read_text()
    installs = [line for line in script.splitlines() if "pip install" in line
                and not line.lstrip().startswith("#")]
    assert installs and all("--no-warn-conflicts" in line for line in installs), installs
    assert "scripts/check_requirements.py" in script


def test_only_the_requirements_danastar_needs_are_reported():
    check = load_check_requirements()
    needed = check.needed("danastar", {"train"})
    assert {"danastar", "torch", "omegaconf", "pyyaml", "tiktoken"} <= needed
    assert "awscli" not in needed and "pytest" not in needed
    # an extra that names danastar's own extras (dev: danastar[train,...]) reaches theirs
    assert {"pytest", "omegaconf", "scipy"} <= check.needed("danastar", {"dev"})
    report = ("awscli 1.45.11 has requirement docutils<=0.19, but you have docutils 0.23.\n"
              "PyYAML 6.0 requires something, which is not installed.\n"
              "torch 2.13.0 has requirement sympy>=1.13.3, but you have sympy 1.12.\n")
    assert check.kept(report, needed) == report.splitlines()[1:]
