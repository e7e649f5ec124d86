"""The package as users install it: the wheel and sdist that `python -m build` makes pass
`twine check`, and the wheel installs into a fresh venv that holds torch alone, where every
optimizer steps and every model runs without importing anything else, and a command without
its extra says which one to install. The JAX distribution, danastar-optax
(`python -m build distributions/danastar-optax`), ships danastar's own files for
`danastar.optax` and installs into a venv that holds jax and optax but no torch, where the
optax example of docs/optimizers.md trains."""

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
from doc_blocks import parse

# One process builds the wheel once for all of them.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("packaging")]

ROOT = Path(__file__).resolve().parents[1]
# What the sdist is built from: the files pyproject.toml and MANIFEST.in name; and the JAX
# distribution's folder, whose symbolic links point into src/danastar.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "CITATION.cff", "MANIFEST.in",
           "src/danastar")
OPTAX_PROJECT = "distributions/danastar-optax"


def run(command: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(part) for part in command], capture_output=True, text=True,
                          timeout=300, **kwargs)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the sources that the distributions are built from (their links kept as links)."""
    pytest.importorskip("build")
    tree = tmp_path_factory.mktemp("tree")
    for name in (*SOURCES, OPTAX_PROJECT):
        source, target = ROOT / name, tree / name
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, target)
    return tree


def build(project: Path, out: Path) -> Path:
    """``python -m build`` of ``project`` (the sdist, then the wheel from it) without build
    isolation: the installed setuptools, no download."""
    result = run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, project])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def dist(tree, tmp_path_factory) -> Path:
    """danastar's wheel and sdist, built once."""
    return build(tree, tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def optax_dist(tree, tmp_path_factory) -> Path:
    """danastar-optax's wheel and sdist, built once."""
    return build(tree / OPTAX_PROJECT, tmp_path_factory.mktemp("optax-dist"))


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
    assert {"train", "analysis", "plots", "theory", "hf-trainer", "lightning", "integrations",
            "jax", "all", "dev"} <= set(metadata.get_all("Provides-Extra"))
    with tarfile.open(only(dist, f"danastar-{danastar.__version__}.tar.gz")) as sdist:
        names = {Path(name).name for name in sdist.getnames()}
    assert {"LICENSE", "CHANGELOG.md", "CITATION.cff", "README.md"} <= names


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def link_installed(site: Path, *names: str) -> None:
    """Make ``site`` hold the distributions ``names`` and those they require (recursively), as
    symbolic links to the installed ones: a site-packages with them alone, at no copying cost."""
    from packaging.requirements import Requirement

    site.mkdir()
    todo, seen = list(names), set()
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


def venv_with(root: Path, wheel: Path, *installed: str) -> Path:
    """A venv without the system's packages whose only packages are the distributions
    ``installed`` with theirs (a .pth file points at the linked site) and ``wheel``, installed by
    pip from nothing but that wheel: pip finds the wheel's requirements already there."""
    link_installed(root / "linked_site", *installed)
    venv = root / "venv"
    result = run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert result.returncode == 0, result.stderr
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "linked.pth").write_text(f"{root / 'linked_site'}\n")
    result = run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install",
                  "--no-index", "--no-cache-dir", "--quiet", wheel], env=clean_environment())
    assert result.returncode == 0, result.stdout + result.stderr
    return venv


@pytest.fixture(scope="module")
def torch_only_venv(dist, tmp_path_factory) -> Path:
    """danastar's wheel in a venv that holds torch alone."""
    return venv_with(tmp_path_factory.mktemp("fresh"), only(dist, "*.whl"), "torch")


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


def wheel_files(wheel: Path) -> dict[str, bytes]:
    """The package's files in ``wheel`` (not its .dist-info), by name."""
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()
                if not name.split("/")[0].endswith(".dist-info")}


def test_the_optax_distribution_is_danastars_own_jax_files_and_needs_no_torch(dist, optax_dist):
    pytest.importorskip("twine")
    result = run([sys.executable, "-m", "twine", "check", "--strict", *optax_dist.iterdir()])
    assert result.returncode == 0, result.stdout + result.stderr
    wheel = only(optax_dist, f"danastar_optax-{danastar.__version__}-py3-none-any.whl")
    files = wheel_files(wheel)
    optax_modules = {f"danastar/optax/{path.name}"
                     for path in (Path(danastar.__file__).parent / "optax").glob("*.py")}
    # danastar.optax and what it imports of danastar, nothing else (no danastar.optim, no torch)
    assert set(files) == {"danastar/__init__.py", "danastar/hparams.py", *optax_modules}
    # the same bytes as in danastar's wheel: one package, two ways to install it
    torch_files = wheel_files(only(dist, "*.whl"))
    assert {name: torch_files[name] for name in files} == files
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(f"danastar_optax-{danastar.__version__}.dist-info/METADATA").decode()
        assert any(name.endswith("licenses/LICENSE") for name in archive.namelist())
    metadata = email.parser.Parser().parsestr(text)
    assert metadata["Name"] == "danastar-optax" and metadata["Version"] == danastar.__version__
    # its requirements are danastar's 'jax' extra
    with zipfile.ZipFile(only(dist, "*.whl")) as archive:
        torch_metadata = email.parser.Parser().parsestr(
            archive.read(f"danastar-{danastar.__version__}.dist-info/METADATA").decode())
    jax_extra = [r.split(";")[0].strip() for r in torch_metadata.get_all("Requires-Dist")
                 if r.endswith('extra == "jax"')]
    assert sorted(metadata.get_all("Requires-Dist")) == sorted(jax_extra) != []
    with tarfile.open(only(optax_dist, f"danastar_optax-{danastar.__version__}.tar.gz")) as sdist:
        members = {Path(member.name).name: member for member in sdist.getmembers()}
    # the sdist holds the files themselves, not the links of the repository
    assert {"LICENSE", "README.md", "hparams.py", "alias.py"} <= set(members)
    assert not any(member.issym() for member in members.values())


@pytest.fixture(scope="module")
def jax_only_venv(optax_dist, tmp_path_factory) -> Path:
    """danastar-optax's wheel in a venv that holds jax and optax, and no torch."""
    pytest.importorskip("optax")
    return venv_with(tmp_path_factory.mktemp("fresh-jax"), only(optax_dist, "*.whl"),
                     "jax", "optax")


def test_the_optax_example_trains_in_a_venv_without_torch(jax_only_venv, tmp_path):
    python = jax_only_venv / "bin" / "python"
    present = run([python, "-c", "import importlib.util as u; print([m for m in ('torch', "
                   "'danastar.optim', 'yaml') if u.find_spec(m)])"], cwd=tmp_path,
                  env=clean_environment())
    assert present.stdout.strip() == "[]", present.stderr  # no torch, no danastar.optim
    where = run([python, "-c", "import danastar.optax; print(danastar.optax.__file__)"],
                cwd=tmp_path, env=clean_environment())
    assert str(jax_only_venv) in where.stdout, where.stderr
    # The complete JAX training loop of docs/optimizers.md, as a reader would run it.
    (example,) = [block for block in parse("docs/optimizers.md")[0]
                  if block.language == "python" and block.not_run is None
                  and "from danastar.optax import" in block.text]
    (tmp_path / "example.py").write_text(example.text)
    result = run([python, "example.py"], cwd=tmp_path, env=clean_environment())
    assert result.returncode == 0, result.stdout + result.stderr  # it asserts the loss fell
    assert "loss on all the data:" in result.stdout, result.stdout
