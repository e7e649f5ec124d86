"""How a prepared data directory is recognised and verified: one answer for preparation, the
loader and the dry run.

Verification has two levels (docs/data.md, "Verification"):

* a **size check**, always: every token file has the size `meta.json` records;
* a **content check**, one pass over a file that computes its largest token id (the vocabulary
  check) and, when `meta.json` records one, its SHA-256. `danastar prepare` runs it on every file
  of an existing output; the loader runs it once per file and caches the result per user
  (`$DANASTAR_CACHE_DIR/verified/`) keyed by the file's path, size and modification time, so a
  changed or replaced file is checked again and an unchanged one costs nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
from pathlib import Path

import numpy as np

from danastar.data.sources import cache_dir
from danastar.durable import write_atomic

try:
    import fcntl
except ImportError:  # not POSIX: no lock, each process checks the files itself
    fcntl = None

META_FILE = "meta.json"  # ours: written last, so a directory holding it is complete
RAW_FILES = ("train.bin", "val.bin")  # the original release's GPT-2 token files
# What the original release's raw train.bin / val.bin hold.
RAW_META = {"format": "raw", "tokenizer": "gpt2", "vocab_size": 50257, "eot_id": 50256,
            "dtype": "uint16"}
# Bytes read per step of the content check: large enough for numpy and hashlib to run at full
# speed, small enough to bound memory whatever the file size.
CHUNK_BYTES = 1 << 24


def prepared_format(directory: Path) -> str | None:
    """"meta" for a directory with our `meta.json`, "raw" for the original release's
    `train.bin`/`val.bin` (a missing one is reported when it is opened), None otherwise."""
    if (directory / META_FILE).is_file():
        return "meta"
    if any((directory / name).is_file() for name in RAW_FILES):
        return "raw"
    return None


def meta_is_complete(meta: dict) -> bool:
    """Whether `meta` has the shape `prepare` writes (what verification and the loader rely on)."""
    files = [meta.get("train_files"), meta.get("val_files")]
    return (
        isinstance(meta.get("vocab_size"), int)
        and meta.get("dtype") in ("uint16", "uint32")
        and all(isinstance(f, list) for f in files)
        and all(isinstance(e, dict) and isinstance(e.get("file"), str)
                and isinstance(e.get("tokens"), int) for f in files for e in f)
    )


def repair_command(directory: Path, meta: dict | None) -> str:
    """The command that rebuilds what is damaged in `directory` (`danastar prepare` verifies an
    existing output and rebuilds what fails), as the user would type it."""
    recorded = (meta or {}).get("command")
    if isinstance(recorded, str) and recorded:
        return f"`{recorded} --out {shlex.quote(str(directory))}`"
    return (f"`danastar prepare SOURCE --out {shlex.quote(str(directory))}` with the options it "
            "was prepared with")


# --- the content check ----------------------------------------------------------------------------


def scan_tokens(path: Path, dtype: np.dtype, checksum: bool) -> dict:
    """One pass over a token file: its size, largest id (-1 when empty) and, if asked, SHA-256."""
    dtype = np.dtype(dtype).newbyteorder("<")
    digest = hashlib.sha256() if checksum else None
    largest, size = -1, 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            size += len(chunk)
            if digest is not None:
                digest.update(chunk)
            whole = len(chunk) - len(chunk) % dtype.itemsize  # a torn tail is a size error
            if whole:
                largest = max(largest, int(np.frombuffer(chunk[:whole], dtype=dtype).max()))
    record = {"bytes": size, "max_id": largest}
    if digest is not None:
        record["sha256"] = digest.hexdigest()
    return record


def size_problem(directory: Path, entry: dict, dtype: np.dtype) -> str | None:
    """What the size check finds wrong with one token file of a `meta.json` (None: nothing)."""
    path = directory / entry["file"]
    if not path.is_file():
        return f"{entry['file']} is missing"
    expected = entry.get("bytes", entry.get("tokens", 0) * np.dtype(dtype).itemsize)
    size = path.stat().st_size
    if size != expected:
        return f"{entry['file']} has {size:,} bytes instead of {expected:,}"
    return None


def content_problem(entry: dict, record: dict, vocab_size: int) -> str | None:
    """What the content check (`record`, from `scan_tokens`) finds wrong with one token file."""
    if "sha256" in entry and record.get("sha256") != entry["sha256"]:
        return f"{entry['file']} does not match its checksum"
    if record["max_id"] >= vocab_size:
        return (f"{entry['file']} holds id {record['max_id']:,}, beyond the vocabulary "
                f"{vocab_size:,}")
    return None


class CheckCache:
    """Content-check results of one data directory, cached per user so that each file is read
    once: an entry holds for as long as the file keeps its size and modification time."""

    def __init__(self, directory: Path):
        self.directory = directory.resolve()
        key = hashlib.sha1(str(self.directory).encode()).hexdigest()[:20]
        self.path = cache_dir() / "verified" / f"{key}.json"
        self.entries = self._read()
        self.changed = False

    def _read(self) -> dict:
        try:
            content = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # absent or unreadable: the files are simply checked again
        if not isinstance(content, dict) or content.get("directory") != str(self.directory):
            return {}
        files = content.get("files")
        return files if isinstance(files, dict) else {}

    @staticmethod
    def _stamp(path: Path) -> dict:
        status = path.stat()
        return {"bytes": status.st_size, "mtime_ns": status.st_mtime_ns}

    def get(self, name: str, sha256: str | None) -> dict | None:
        """The cached record of file `name` if it still describes the file (and, when `sha256`
        is given, was checked against that checksum)."""
        entry = self.entries.get(name)
        if not isinstance(entry, dict) or entry.get("stamp") != self._stamp(self.directory / name):
            return None
        if sha256 is not None and entry.get("sha256") != sha256:
            return None
        return entry

    def put(self, name: str, record: dict) -> None:
        self.entries[name] = {**record, "stamp": self._stamp(self.directory / name)}
        self.changed = True

    def save(self) -> None:
        """Best effort: a cache that cannot be written (read-only home) only costs a re-check."""
        if not self.changed:
            return
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(
                {"directory": str(self.directory), "files": self.entries}, indent=1) + "\n")
        self.changed = False

    @contextlib.contextmanager
    def locked(self):
        """Held while checking: the ranks of a job on one machine check each file once between
        them (the others wait, then find the result cached). Without a usable lock, each checks."""
        handle = None
        with contextlib.suppress(OSError):
            if fcntl is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                handle = open(self.path.with_suffix(".lock"), "w")
                fcntl.flock(handle, fcntl.LOCK_EX)
                self.entries = self._read()  # what another process cached while this one waited
        try:
            yield self
        finally:
            if handle is not None:
                handle.close()


def check_contents(
    directory: Path, entries: list[dict], dtype: np.dtype, fresh: bool = False
) -> dict[str, dict]:
    """The content-check record of each file (`bytes`, `max_id`, and `sha256` when its entry has
    one), from the cache where it still holds, else by reading the file (then cached). `fresh`:
    read every file (what `danastar prepare` does: it also catches a change that kept the file's
    size and modification time)."""
    cache = CheckCache(directory)
    records = {}
    with cache.locked():
        for entry in entries:
            name, expected = entry["file"], entry.get("sha256")
            record = None if fresh else cache.get(name, expected)
            if record is None:
                record = scan_tokens(directory / name, dtype, checksum=expected is not None)
                cache.put(name, record)
            records[name] = record
        cache.save()
    return records


def remember_checked(directory: Path, entries: list[dict]) -> None:
    """Cache the records `danastar prepare` has just computed for the files it wrote or
    verified, so the first run that opens them does not read them again."""
    cache = CheckCache(directory)
    with cache.locked():
        for entry in entries:
            if os.path.isfile(directory / entry["file"]) and "sha256" in entry:
                cache.put(entry["file"], {key: entry[key] for key in ("bytes", "max_id", "sha256")})
        cache.save()
