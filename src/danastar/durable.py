"""Durable, atomic file writes and checksums: the one way danastar publishes a file or folder.

A file is written beside its target under a hidden temporary name, flushed to disk, then
renamed over the target, so a reader sees the old content or the whole new one, never a part
(a rename is atomic within one filesystem). A folder is published the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


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
