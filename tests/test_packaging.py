"""The package as users install it: the wheel and sdist that `python -m build` makes pass
`twine check`, and the wheel installs into a fresh venv that holds torch alone, where every
optimizer steps and every model runs without importing anything else, and a command without
its extra says which one to install."""

from __future__ import annotations

import email.parser
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import danastar

# One process builds the wheel once for all of them.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("packaging")]

ROOT = Path(__file__).resolve().parents[1]
# What the sdist is built from: the files pyproject.toml and MANIFEST.in name.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "CITATION.cff", "MANIFEST.in",
           "src/danastar")


def run(command: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(part) for part in command], capture_output=True, text=True,
                          timeout=300, **kwargs)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The wheel and the sdist, built once from a copy of the sources (no build isolation: the
    installed setuptools, no download)."""
    pytest.importorskip("build")
    tree = tmp_path_factory.mktemp("tree")
    for name in SOURCES:
        source, target = ROOT / name, tree / name
        if source.is_dir():
            shutil.copytree(source, target,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, target)
    out = tmp_path_factory.mktemp("dist")
    result = run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, tree])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def package_data_files() -> list[str]:
    package = Path(danastar.__file__).resolve().parent
    return [f"danastar/{path.relative_to(package).as_posix()}" for path in package.rglob("*")
            if path.is_file() and path.suffix not in (".py", ".pyc")]


def only(directory: Path, pattern: str) -> Path:
    (found,) = directory.glob(pattern)
    return found


def test_twine_check_passes_and_metadata_says_torch_alone(dist):
    pytest.importorskip("twine")
    result = run([sys.executable, "-m", "twine", "check", "--strict", *dist.iterdir()])
    assert result.returncode == 0, result.stdout + result.stderr
    wheel = only(dist, f"danastar-{danastar.__version__}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(f"danastar-{danastar.__version__}.dist-info/METADATA").decode()
        assert any(name.endswith("licenses/LICENSE") for name in archive.namelist())
        assert "danastar/scaling_rules.yaml" in archive.namelist()
        # every data file of the package (presets, tables, the SLURM job template) ships
        assert set(package_data_files()) <= set(archive.namelist())
    metadata = email.parser.Parser().parsestr(text)
    unconditional = [r for r in metadata.get_all("Requires-Dist") if "extra ==" not in r]
    assert unconditional == ["torch>=2.9"]
    assert metadata["License-Expression"] == "MIT"
    assert {"train", "analysis", "plots", "theory", "integrations", "all", "dev"} <= set(
        metadata.get_all("Provides-Extra"))
    with tarfile.open(only(dist, f"danastar-{danastar.__version__}.tar.gz")) as sdist:
        names = {Path(name).name for name in sdist.getnames()}
    assert {"LICENSE", "CHANGELOG.md", "CITATION.cff", "README.md"} <= names


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def link_torch(site: Path) -> None:
    """Make ``site`` hold torch and the distributions it requires (recursively), as symbolic
    links to the installed ones: a site-packages with torch alone, at no copying cost."""
    from packaging.requirements import Requirement

    site.mkdir()
    todo, seen = ["torch"], set()
    while todo:
        name = todo.pop()
        if normalized(name) in seen:
            continue
        seen.add(normalized(name))
        distribution = importlib.metadata.distribution(name)
        for requirement in map(Requirement, distribution.requires or []):
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
        base = Path(distribution.locate_file(""))
        tops = {Path(file).parts[0] for file in distribution.files
                if not str(file).startswith("..")} - {"__pycache__"}
        for top in tops:
            if (base / top).exists() and not (site / top).exists():
                (site / top).symlink_to(base / top)


@pytest.fixture(scope="module")
def torch_only_venv(dist, tmp_path_factory) -> Path:
    """A venv without the system's packages whose only packages are torch's (a .pth file
    points at the linked site) and the wheel, installed by pip from nothing but that wheel:
    pip finds its one requirement, torch, already there."""
    root = tmp_path_factory.mktemp("fresh")
    link_torch(root / "torch_site")
    venv = root / "venv"
    result = run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert result.returncode == 0, result.stderr
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "torch_only.pth").write_text(f"{root / 'torch_site'}\n")
    wheel = only(dist, "*.whl")
    result = run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install",
                  "--no-index", "--no-cache-dir", "--quiet", wheel], env=clean_environment())
    assert result.returncode == 0, result.stdout + result.stderr
    return venv


def clean_environment() -> dict:
    """The environment without anything that would reach this checkout's or the user's
    packages."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**environment, "PYTHONNOUSERSITE": "1", "OMP_NUM_THREADS": "1"}


def test_wheel_in_a_venv_with_torch_alone_runs_every_optimizer(torch_only_venv, tmp_path):
    python = torch_only_venv / "bin" / "python"
    present = run([python, "-c", "import importlib.util as u; print([m for m in ('numpy', "
                   "'yaml', 'omegaconf', 'scipy', 'tqdm', 'tiktoken', 'transformers') "
                   "if u.find_spec(m)])"], cwd=tmp_path, env=clean_environment())
    assert present.stdout.strip() == "[]", present.stderr  # the venv holds torch alone
    where = run([python, "-c", "import danastar; print(danastar.__file__, danastar.__version__)"],
                cwd=tmp_path, env=clean_environment())
    assert str(torch_only_venv) in where.stdout and danastar.__version__ in where.stdout
    # Every model runs and every registered optimizer steps; nothing but torch is imported.
    result = run([python, ROOT / "scripts" / "check_core.py"], cwd=tmp_path,
                 env=clean_environment())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("core:"), result.stdout


def test_a_command_without_its_extra_says_which_to_install(torch_only_venv, tmp_path):
    danastar_command = torch_only_venv / "bin" / "danastar"
    for command, extra in (("train", "train"), ("results", "analysis")):
        result = run([danastar_command, command], cwd=tmp_path, env=clean_environment())
        assert result.returncode == 2
        assert result.stderr.strip().splitlines()[-1] == (
            f"danastar {command} needs the {extra!r} extra: pip install 'danastar[{extra}]'")
        assert "Traceback" not in result.stderr
    help_text = run([danastar_command, "--help"], cwd=tmp_path, env=clean_environment())
    assert help_text.returncode == 0 and "usage: danastar" in help_text.stdout
