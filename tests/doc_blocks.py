"""The code blocks of README.md and docs/*.md, and how tests/test_docs.py runs them.

A fenced block is code when its language is `python` or a shell (`bash`, `sh`, `shell`); a block
right after a `<!-- not run: REASON -->` line (blank lines between are allowed) is an
illustration and is not run. A `yaml` block whose first line is `# PATH` is a file that the
page's commands use: it is written to PATH before they run.

Run as a script (`python doc_blocks.py COMMANDS.json`), it runs one page's shell commands in
order in the current folder, as a reader who followed the README's setup would type them:
`danastar ...` through `danastar.cli.main` (one Python for the page: torch is imported once, not
once per command) and `python FILE ...` with this Python. It stops at the first command that
does not end with exit code 0. `python doc_blocks.py --python BLOCKS.json RESULTS.json` runs
Python blocks, each as a script of its own, in one Python (again: one import of torch).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))
SHELLS = ("bash", "sh", "shell")
FENCE = re.compile(r"^\s*```(\S*)\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(.*?)\s*-->\s*$")
FILE_HEADER = re.compile(r"^#\s*(\S+\.ya?ml)\s*$")
PROGRAMS = ("danastar", "python")  # what a page's runnable commands may start with

# What would take minutes runs on a small setting: these flags are added to the command.
# `danastar train` (not a dry run): 2 steps unless the command sets --iterations, a tiny batch
# unless it sets its own layout, one batch per evaluation.
TRAIN_BATCH = ["--batch_size", "2", "--acc_steps", "1", "--sequence_length", "32"]
TRAIN_EVAL = ["train.eval_batches=1", "train.final_eval_batches=1", "logging.progress=false"]
THEORY = {  # danastar theory FIGURE: a small model and a coarse ODE step
    "compare": ["--d", "50", "--sim-steps", "200", "--seeds", "2", "--dtau", "1e-2"],
    "exponents": ["--d", "50", "--dtau", "1e-2"],
    "scaling": ["--ds", "20,40", "--dtau", "1e-2"],
    "kappa": ["--d", "50", "--T", "1e3", "--kappas", "0.3,0.6", "--dtau", "1e-2"],
}
SCRIPTS = {"docs/analysis/make_runs.py": ["--iterations", "2"]}  # python SCRIPT: added flags


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    not_run: str | None  # the reason, for an illustration

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def is_shell(self) -> bool:
        return self.language in SHELLS

    @property
    def is_code(self) -> bool:
        return self.language == "python" or self.is_shell

    @property
    def file_path(self) -> str | None:
        """PATH, for a yaml block whose first line is `# PATH`."""
        first = self.text.split("\n", 1)[0]
        match = FILE_HEADER.match(first) if self.language == "yaml" else None
        return match.group(1) if match else None


def parse(page: str) -> tuple[list[Block], list[int]]:
    """The page's fenced blocks, and the lines of `not run` markers that no block follows."""
    lines = (ROOT / page).read_text().splitlines()
    blocks: list[Block] = []
    dangling: list[int] = []
    reason, reason_line = None, 0
    index = 0
    while index < len(lines):
        line = lines[index]
        marker, fence = NOT_RUN.match(line), FENCE.match(line)
        if marker:
            if reason is not None:
                dangling.append(reason_line)
            reason, reason_line = marker.group(1), index + 1
        elif fence:
            start, body = index, []
            index += 1
            while index < len(lines) and not re.match(r"^\s*```\s*$", lines[index]):
                body.append(lines[index])
                index += 1
            blocks.append(Block(page, start + 1, fence.group(1), "\n".join(body) + "\n", reason))
            reason = None
        elif line.strip() and reason is not None:
            dangling.append(reason_line)
            reason = None
        index += 1
    if reason is not None:
        dangling.append(reason_line)
    return blocks, dangling


def commands(block: Block) -> list[list[str]]:
    """Each command of a shell block as words: continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", block.text)
    return [words for line in text.splitlines() if (words := shlex.split(line, comments=True))]


def split_environment(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """`NAME=value ... command`: the assignments and the command."""
    environment = {}
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        name, value = words[0].split("=", 1)
        environment[name] = value
        words = words[1:]
    return environment, words


def small(words: list[str]) -> list[str]:
    """The command on the small setting the tests run it at (see the constants above)."""
    if words[:1] == ["python"]:
        return words + SCRIPTS.get(words[1] if len(words) > 1 else "", [])
    if words[:1] != ["danastar"] or {"--dry_run", "--help", "-h"} & set(words):
        return words
    command = words[1] if len(words) > 1 else ""
    if command == "theory":
        return words + THEORY.get(words[2] if len(words) > 2 else "", [])
    if command in ("train", "sweep"):  # sweep: other arguments go to every run's train
        extra = [] if "--iterations" in words else ["--iterations", "2"]
        if not {"--batch_size", "--acc_steps", "--sequence_length"} & set(words):
            extra += TRAIN_BATCH
        return words + extra + TRAIN_EVAL
    return words


def written_into_docs(words: list[str]) -> list[str]:
    """The arguments of a command that name a place under docs/ (the script run excepted)."""
    arguments = words[2:] if words[:1] == ["python"] else words[1:]
    return [word for word in arguments
            if re.match(r"^(\./)?docs/", word.split("=", 1)[-1])]


def run(command_list: list[dict]) -> int:
    """Run [{"words": [...], "environment": {...}}, ...] in order; the first failure's code."""
    from danastar.cli import main as danastar

    for item in command_list:
        words, environment = item["words"], item["environment"]
        print(f"\n$ {shlex.join(words)}", flush=True)
        start = time.monotonic()
        saved = {name: os.environ.get(name) for name in environment}
        os.environ.update(environment)
        try:
            if words[0] == "danastar":
                try:
                    code = danastar(words[1:])
                except SystemExit as exit_:  # argparse's --help
                    code = exit_.code or 0
            else:
                code = subprocess.run([sys.executable, *words[1:]]).returncode
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        print(f"[exit code {code}, {time.monotonic() - start:.1f} s]", flush=True)
        if code != 0:
            print(f"\ndoc command failed with exit code {code}: {shlex.join(words)}", flush=True)
            return 1
    return 0


def run_python(blocks: list[dict], results: Path) -> None:
    """Run each {"name", "text"} as a script of its own (fresh globals, an empty folder of its
    own, as `python block.py` would) in this one Python, and write {name: {ok, output}}."""
    import contextlib
    import io
    import traceback

    outcome, start = {}, Path.cwd()
    for index, block in enumerate(blocks):
        folder = start / f"block{index}"
        folder.mkdir()
        os.chdir(folder)
        output = io.StringIO()
        try:
            with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
                exec(compile(block["text"], block["name"], "exec"), {"__name__": "__main__"})
            ok = True
        except BaseException:  # noqa: B036 (SystemExit too: a block must run to its end)
            ok = False
            output.write(traceback.format_exc())
        finally:
            os.chdir(start)
        outcome[block["name"]] = {"ok": ok, "output": output.getvalue()[-4000:]}
    results.write_text(json.dumps(outcome))


if __name__ == "__main__":
    if sys.argv[1] == "--python":
        run_python(json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3]))
    else:
        sys.exit(run(json.loads(Path(sys.argv[1]).read_text())))
