"""After scripts/setup.sh installs danastar: pip's check of the installed packages, kept to what
danastar needs. Run with the environment's Python,

    .venv/bin/python scripts/check_requirements.py train,dev

it runs `pip check` and prints the broken requirements of danastar and of the distributions that
it requires with these extras (recursively; torch among them), as `setup: warning:` lines, and
leaves out those of every other package the environment sees. A venv that sees the system's
packages (to reuse its torch) sees its unrelated ones too, awscli's pins, say, which an install
of danastar's requirements can break in the venv's view without touching them or danastar: pip
reports those at every install, and this does not. Exits 0 either way, as pip does.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import subprocess
import sys

try:
    from packaging.requirements import Requirement
except ModuleNotFoundError:  # the copy inside pip, which every venv has
    from pip._vendor.packaging.requirements import Requirement


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def needed(root: str, extras: set[str]) -> set[str]:
    """``root`` and every installed distribution it requires with ``extras``, recursively
    (an extra naming ``root`` itself, as `dev` names `danastar[train,...]`, included)."""
    wanted: dict[str, set[str]] = {}
    todo = [(root, set(extras))]
    while todo:
        name, name_extras = todo.pop()
        key = normalized(name)
        if key in wanted and name_extras <= wanted[key]:
            continue
        wanted[key] = wanted.get(key, set()) | name_extras
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:  # pip check names what is missing
            continue
        for requirement in map(Requirement, requires):
            environments = [{"extra": extra} for extra in ("", *wanted[key])]
            if requirement.marker is None or any(map(requirement.marker.evaluate, environments)):
                todo.append((requirement.name, set(requirement.extras)))
    return set(wanted)


def kept(report: str, names: set[str]) -> list[str]:
    """The lines of `pip check`'s report about a distribution in ``names``: each line begins
    with the name of the distribution whose requirement is broken."""
    return [line for line in report.splitlines()
            if line.split() and normalized(line.split()[0]) in names]


def main(extras: str) -> int:
    report = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                            text=True).stdout
    for line in kept(report, needed("danastar", set(filter(None, extras.split(","))))):
        print(f"setup: warning: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ""))
