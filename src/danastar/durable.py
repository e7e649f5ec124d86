"""Durable, atomic file writes and checksums: the one way danastar publishes a file or folder.

A file is written beside its target under a hidden temporary name, flushed to disk, then
renamed over the target, so a reader sees the old content or the whole new one, never a part
(a rename is atomic within one filesystem). A folder is published the same way.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from danastar.errors import UserError

# A full disk (or quota): a write that fails with these is the user's to fix, not a crash.
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def out_of_space(error: BaseException) -> bool:
    """Whether `error` comes from a full disk: an OSError(ENOSPC or EDQUOT) itself or anywhere in
    its chain (torch's writer turns it into a RuntimeError about the file's position)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in NO_SPACE_ERRNOS:
            return True
        error = error.__cause__ or error.__context__
    return False


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks (checkpoints can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(directory: Path) -> None:
    """Flush a folder's entries (a rename into it survives a crash only after this)."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(directory: Path) -> None:
    """Flush every file under `directory`, and its entries, before a rename publishes them."""
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            fsync_file(path)
    fsync_dir(directory)


@contextlib.contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """A temporary path beside `target` to write into; on success it is flushed and renamed over
    `target`, on an exception removed. Unique per process, so concurrent writers never mix."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        yield temporary
        if temporary.exists():  # the writer may decide to write nothing
            fsync_file(temporary)
            os.replace(temporary, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def write_atomic(target: Path, content: str) -> None:
    """Replace `target` with `content` (text), atomically and durably."""
    with atomic_path(target) as temporary:
        temporary.write_text(content)


def copy_atomic(source: Path, target: Path) -> None:
    with atomic_path(target) as temporary:
        shutil.copyfile(source, temporary)


def publish_dir(temporary: Path, final: Path) -> None:
    """fsync then rename a finished temporary folder into place (atomic on one filesystem)."""
    fsync_tree(temporary)
    if final.exists():  # only a stale copy of the same content can be here; the new one replaces it
        shutil.rmtree(final)
    os.replace(temporary, final)
    fsync_dir(final.parent)


def check_output(path: Path, flag: str, *, folder: bool = False) -> None:
    """Refuse, before any work, an output that cannot be written: a file name that is a folder
    (or, with ``folder``, a folder name that is a file), or a place where the nearest existing
    folder is a file or cannot be written into (tried by writing a file there). A missing folder
    is fine: it is created when the output is written, as `train` creates a run directory.
    UserError names ``flag``."""
    path = Path(path)
    fix = f"give {flag} a path in a writable folder"
    if folder and path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file; give {flag} a folder.")
    if not folder and path.is_dir():
        raise UserError(f"{flag} {path} is a folder; give {flag} a file name.")
    start = path if folder else path.parent
    existing = next(p for p in (start, *start.parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"{flag} {path} cannot be written: {existing} is a file, not a folder; "
                        f"{fix}.")
    probe = existing / f".danastar-write-check-{os.getpid()}"
    try:
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise UserError(f"{flag} {path} cannot be written: {existing} does not take new files "
                        f"({error.strerror}); {fix}.") from None


def write_output(path: Path, content: str, flag: str) -> None:
    """Write an output file (``flag``'s) atomically, creating its folder; UserError naming the
    file when the system refuses (a full disk, a folder made read-only meanwhile)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, content)
    except OSError as error:
        raise UserError(f"{flag} {path} could not be written ({error.strerror or error}); "
                        f"free space or give {flag} a path in a writable folder.") from None
