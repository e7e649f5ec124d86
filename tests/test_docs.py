"""Every code block of README.md and docs/*.md runs as written, or is marked as an illustration.

* `test_python_block`: each ```python block as a script of its own, in an empty folder (all in
  one fresh Python, which imports torch once; a block headed `# run with: torchrun ...` runs so).
* `test_page_commands`: a page's shell blocks in order, in one folder per page (where the
  repository folders the commands name are copied, so nothing reaches the repository), on a
  small setting (`doc_blocks.small`: a couple of steps, a tiny batch, a small theory model),
  after writing the page's `# PATH` yaml files and stand-ins for its placeholders.
* `test_illustration`: each block after `<!-- not run: REASON -->` is listed as skipped, with
  its reason (`pytest -ra` prints them).
* The static checks below: every code block is run or marked, no command writes into docs/, and
  the files a command writes go under `scratch/` (git-ignored), so that a reader who runs the
  pages in a checkout leaves its root clean; `test_page_commands` checks that the root of the
  page's folder holds nothing else afterwards.

tests/doc_blocks.py reads the pages and runs a page's commands.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from doc_blocks import (
    PAGES,
    PROGRAMS,
    ROOT,
    commands,
    parse,
    small,
    split_environment,
    written_into_docs,
)

BLOCKS = [block for page in PAGES for block in parse(page)[0]]
PYTHON = [block for block in BLOCKS if block.language == "python" and block.not_run is None]
MARKED = [block for block in BLOCKS if block.not_run is not None]
SHELL_PAGES = sorted({block.page for block in BLOCKS if block.is_shell and block.not_run is None})
# Pages whose commands take more than about 20 s here (12 trainings, a 45-run sweep planned, a
# study's report, a corpus prepared again, the report of a study whose records grow).
SLOW_PAGES = {"README.md", "docs/analysis.md", "docs/export.md", "docs/moe.md",
              "docs/study-cpu.md", "docs/study-horizon.md", "docs/study-fair.md",
              "docs/study-extend.md"}
# Repository folders that a page's scripts and commands read or run (make_synthetic_runs.py
# imports tests/analysis/fake_runs.py; a study's report writes under docs/): copied into the
# page's folder when its commands name docs/ or studies/.
COPIED = ("docs", "studies", "tests/analysis")
# Where the pages' commands may write in the folder they run in: runs (train's default), prepared
# data, and everything else (figures, tables, exports, task files) under scratch/.
WRITABLE = ("scratch", "runs", "data")
OUTPUT_FLAGS = ("--out", "--json", "--csv")  # a file or folder a command writes


def environment() -> dict[str, str]:
    # One thread per process: the machine is small and shared.
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def write_texts(folder: Path) -> None:
    """A stand-in for `path/to/texts`: 400 short documents in one .jsonl file."""
    generator = random.Random(0)
    words = "the a cat dog sat ran on under mat log and then".split()
    folder.mkdir(parents=True)
    lines = [json.dumps({"text": " ".join(generator.choice(words) for _ in range(30))})
             for _ in range(400)]
    (folder / "notes.jsonl").write_text("\n".join(lines) + "\n")


STAND_INS = {"path/to/texts": write_texts}  # placeholders of the docs: made before the page runs


# A block that starts with `# run with: torchrun --nproc_per_node N FILE.py` runs that way.
TORCHRUN = re.compile(r"^# run with: torchrun (--nproc_per_node \d+) (\w+\.py)\n")


@pytest.fixture(scope="session")
def python_outcomes(tmp_path_factory, request) -> dict:
    """Every plain Python block that this session runs a test of (not those of the long tier
    left out, for one), each as a script of its own in an empty folder, all in one fresh Python
    (torch is imported once): {name: {ok, output}}."""
    folder = tmp_path_factory.mktemp("python-blocks")
    selected = {item.callspec.id for item in request.session.items
                if item.originalname == "test_python_block"}
    blocks = [{"name": block.name, "text": block.text}
              for block in PYTHON if not TORCHRUN.match(block.text) and block.name in selected]
    (folder / "blocks.json").write_text(json.dumps(blocks))
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("doc_blocks.py")), "--python",
         "blocks.json", "outcomes.json"],
        cwd=folder, env=environment(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((folder / "outcomes.json").read_text())


@pytest.mark.xdist_group("doc-python-blocks")  # one worker: the blocks share one Python
@pytest.mark.parametrize("block", [
    pytest.param(block, marks=[pytest.mark.slow] if TORCHRUN.match(block.text) else [])
    for block in PYTHON], ids=lambda block: block.name)
def test_python_block(block, tmp_path, request):
    if torchrun := TORCHRUN.match(block.text):
        nproc, file = torchrun.groups()
        (tmp_path / file).write_text(block.text)
        result = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", *nproc.split(), file],
            cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=300)
        ok, output = result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    else:
        outcome = request.getfixturevalue("python_outcomes")[block.name]
        ok, output = outcome["ok"], outcome["output"]
    assert ok, f"the python block at {block.name} failed:\n{output}"


@pytest.mark.parametrize(
    "page", [pytest.param(page, marks=[pytest.mark.slow] if page in SLOW_PAGES else [])
             for page in SHELL_PAGES])
def test_page_commands(page, tmp_path):
    blocks, _ = parse(page)
    planned, mentioned = [], set()
    for block in blocks:
        if block.file_path and block.not_run is None:  # a file the commands use
            path = tmp_path / block.file_path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.text)
        if block.is_shell and block.not_run is None:
            for words in commands(block):
                variables, command = split_environment(words)
                planned.append({"words": small(command), "environment": variables})
                mentioned.update(command)
    if any(word.startswith(("docs/", "studies/")) for word in mentioned):
        for folder in COPIED:
            shutil.copytree(ROOT / folder, tmp_path / folder)
    for placeholder, make in STAND_INS.items():
        if placeholder in mentioned:
            make(tmp_path / placeholder)
    (tmp_path / ".doc_commands.json").write_text(json.dumps(planned))
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("doc_blocks.py")), ".doc_commands.json"],
        cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, f"{page}:\n{result.stdout[-6000:]}{result.stderr[-3000:]}"
    stale = [str(path.relative_to(tmp_path)) for path in rebuilt_text_files(tmp_path)
             if path.read_bytes() != (ROOT / path.relative_to(tmp_path)).read_bytes()]
    assert not stale, (f"{page}: its commands rebuilt committed files differently: "
                       f"{', '.join(stale)}; run them here and commit what they write")
    made = {Path(block.file_path).parts[0] for block in blocks if block.file_path}
    expected = {*WRITABLE, *made, *(Path(folder).parts[0] for folder in COPIED),
                *(Path(placeholder).parts[0] for placeholder in STAND_INS), ".doc_commands.json"}
    stray = sorted(path.name for path in tmp_path.iterdir() if path.name not in expected)
    assert not stray, (f"{page}: its commands left {', '.join(stray)} in the folder they ran in; "
                       f"write under scratch/ instead")


def rebuilt_text_files(copy: Path) -> list[Path]:
    """The tables and summaries (not figures, whose bytes depend on matplotlib's version) that a
    page's commands wrote over the committed files copied into ``copy``."""
    if not (copy / "docs").is_dir():
        return []
    return [path for folder in ("docs", "studies") for path in (copy / folder).rglob("*")
            if path.suffix in (".md", ".json") and path.is_file()
            and (ROOT / path.relative_to(copy)).is_file()
            and path.stat().st_mtime > (copy / ".doc_commands.json").stat().st_mtime]


@pytest.mark.parametrize("block", MARKED, ids=lambda block: block.name)
def test_illustration(block):
    assert block.not_run, f"{block.name}: say why the block is not run"
    pytest.skip(f"{block.name} not run: {block.not_run}")


def test_every_code_block_is_run_or_marked():
    problems = []
    for page in PAGES:
        blocks, dangling = parse(page)
        problems += [f"{page}:{line}: a `not run` marker with no code block right after it"
                     for line in dangling]
        for block in blocks:
            if block.not_run is not None and not (block.is_code or block.file_path):
                problems.append(f"{block.name}: `not run` before a block that is not code")
            if block.is_shell and block.not_run is None:
                for words in commands(block):
                    _, command = split_environment(words)
                    if command[0] not in PROGRAMS or {"&&", "||", "|", ";"} & set(command):
                        problems.append(f"{block.name}: `{shlex.join(words)}` is neither "
                                        f"`danastar` nor `python` alone: mark the block as not run")
            if not block.language and any(re.match(r"^danastar [a-z-]+(\s|$)", line)
                                          for line in block.text.splitlines()):
                problems.append(f"{block.name}: commands in a block without a language: "
                                "label it ```bash")
    assert not problems, "\n".join(problems)


def every_doc_command():
    """(block, words) of every command of the docs' shell blocks, illustrations included."""
    for block in BLOCKS:
        if not block.is_shell:
            continue
        try:
            block_commands = commands(block)
        except ValueError:  # an illustration need not be valid shell
            continue
        for words in block_commands:
            yield block, words


def test_no_doc_command_writes_into_docs():
    """Figures and runs of the examples go to a working folder; the files committed under docs/
    are made by their own scripts."""
    problems = [f"{block.name}: `{shlex.join(words)}` writes into {inside}"
                for block, words in every_doc_command()
                if (inside := written_into_docs(split_environment(words)[1]))]
    assert not problems, "\n".join(problems)


def test_what_a_doc_command_writes_goes_under_scratch():
    """Figures, tables and exports of the examples go to one git-ignored folder (runs go to
    runs/, prepared data to data/, both ignored too)."""
    problems = []
    for block, words in every_doc_command():
        _, command = split_environment(words)
        for flag, value in zip(command, command[1:]):
            if flag in OUTPUT_FLAGS and value != "-" and not value.startswith(
                    tuple(f"{folder}/" for folder in WRITABLE)):
                problems.append(f"{block.name}: `{shlex.join(words)}` writes {value}")
    assert not problems, "write under scratch/:\n" + "\n".join(problems)
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert all(any(line.strip("/") == folder for line in ignored) for folder in WRITABLE)


def test_the_small_settings_keep_the_command_and_only_shrink_it():
    train = small(["danastar", "train", "--heads", "3"])
    assert train[:4] == ["danastar", "train", "--heads", "3"]
    assert train[4:6] == ["--iterations", "2"] and "--batch_size" in train
    kept = small(["danastar", "train", "--iterations", "161", "--batch_size", "4"])
    assert kept.count("--iterations") == 1 and kept.count("--batch_size") == 1
    assert small(["danastar", "train", "--heads", "12", "--dry_run"]) == [
        "danastar", "train", "--heads", "12", "--dry_run"]
    assert small(["danastar", "theory", "kappa"])[-2:] == ["--dtau", "1e-2"]
    assert small(["python", "docs/analysis/make_runs.py", "runs/example"])[-2:] == [
        "--iterations", "2"]
    assert written_into_docs(["danastar", "plot", "tau", "run", "--out", "docs/analysis/tau"]) \
        == ["docs/analysis/tau"]
    assert written_into_docs(["python", "docs/analysis/make_runs.py", "runs/example"]) == []


def test_setup_ends_by_saying_how_to_run_the_commands():
    script = (ROOT / "scripts" / "setup.sh").read_text()
    ending = script[script.rindex("cat <<'EOF'"):]  # what it prints last, run as it is
    printed = subprocess.run(["bash", "-c", ending], capture_output=True, text=True).stdout
    assert "source .venv/bin/activate" in printed and ".venv/bin/danastar" in printed


def test_each_page_with_commands_says_how_to_run_them_before_the_first():
    readme = (ROOT / "README.md").read_text()
    assert "`source .venv/bin/activate` once per shell" in readme
    missing = []
    for page in PAGES[1:]:
        blocks, _ = parse(page)
        first = next((block for block in blocks if block.is_shell), None)
        lines = (ROOT / page).read_text().splitlines()[: first.line if first else 0]
        if first and "source .venv/bin/activate" not in "\n".join(lines):
            missing.append(page)
    assert not missing, f"say how to run the commands at the top of: {missing}"


def test_the_extras_the_docs_name_exist():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    named = set()
    examples = sorted(path.relative_to(ROOT) for path in (ROOT / "docs" / "examples").glob("*.py"))
    for page in (*PAGES, *examples):
        text = (ROOT / page).read_text()
        named.update(re.findall(r"danastar\[([a-z,-]+)\]", text))
        named.update(re.findall(r"DANASTAR_EXTRAS=([a-z,-]+)", text))
    unknown = {name for group in named for name in group.split(",")} - set(extras)
    assert not unknown, f"the docs name extras that pyproject.toml does not define: {unknown}"
    # docs/analysis.md promises rich tables with the analysis extra
    assert any(requirement.startswith("rich") for requirement in extras["analysis"])
