"""The files of a preparation besides its tokens: the tokenizer beside the data, the state file
that lets an interrupted preparation resume, `meta.json` (each file's size, checksum and largest
id), the turn of a damaged output into an unfinished one, and the `danastar prepare` command that
makes it."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
from pathlib import Path

import numpy as np

from danastar import __version__
from danastar.data.prepared import META_FILE, scan_tokens
from danastar.data.sources import SOURCES, Corpus, Shard
from danastar.data.tokenizers import Tokenizer, load_tokenizer, token_dtype, train_bpe
from danastar.durable import atomic_path, copy_atomic, sha256, write_atomic

STATE_FILE = ".prepare_state.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT = "danastar-tokens-1"


def say(message: str) -> None:
    print(f"danastar prepare: {message}", file=sys.stderr, flush=True)


def command_text(source: str, tokenizer: str | None, vocab_size: int | None, options: dict) -> str:
    """The `danastar prepare` command that makes this output (without `--out`, so two outputs of
    one request record the same text); messages add `--out DIR` to name the repair."""
    if source not in SOURCES:
        source = str(Path(source).expanduser().resolve())
    parts = ["danastar", "prepare", source]
    if tokenizer is not None:
        parts += ["--tokenizer", str(tokenizer)]
    if vocab_size is not None:
        parts += ["--vocab_size", str(vocab_size)]
    for key in sorted(options):
        value = options[key]
        values = value if isinstance(value, (list, tuple)) else [value]
        parts += [f"--{key}", *map(str, values)]
    return shlex.join(parts)


def read_json(path: Path) -> dict:
    """A JSON object from a file; empty when the file is unreadable."""
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) else {}


def read_state(out: Path) -> dict | None:
    path = out / STATE_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
        shards = state["shards"]
        if not isinstance(state["request"], dict) or not all(
            isinstance(r.get("tokens"), int) and isinstance(r.get("documents"), int)
            for r in shards.values()
        ):
            raise TypeError
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        # Only a resume aid: without it the preparation starts over, which loses no result.
        kept = out / f"{STATE_FILE}.corrupt"
        os.replace(path, kept)
        say(f"{path} is unreadable (kept as {kept.name}); starting the preparation over")
        return None
    # A shard counts as finished only if its file is still there, whole (empty shards have none).
    state["shards"] = {
        n: r for n, r in shards.items() if r["tokens"] == 0 or whole(out / f"{n}.bin", r)
    }
    return state


def whole(path: Path, record: dict) -> bool:
    if not path.is_file():
        return False
    return "bytes" not in record or path.stat().st_size == record["bytes"]


def write_json_atomic(path: Path, content: dict) -> None:
    write_atomic(path, json.dumps(content, indent=2) + "\n")


def records_complete(meta: dict) -> bool:
    # Per-file document counts are not required: an older meta.json lacks them for good (a
    # repair of such a directory rebuilds every shard).
    return all({"bytes", "sha256", "max_id"} <= e.keys()
               for e in [*meta["train_files"], *meta["val_files"]])


def add_checksums(out: Path, meta: dict, command: str) -> dict:
    """Record sizes, checksums and largest ids in a `meta.json` written before it held them (its
    files passed the size check). Document counts per file were not recorded then."""
    for entry in [*meta["train_files"], *meta["val_files"]]:
        path = out / entry["file"]
        entry.update({key: value for key, value in
                      scan(path, meta["dtype"]).items() if key not in entry})
    if meta.get("tokenizer_file") and (out / meta["tokenizer_file"]).is_file():
        meta.setdefault("tokenizer_sha256", sha256(out / meta["tokenizer_file"]))
    meta.setdefault("command", command)
    write_json_atomic(out / META_FILE, meta)
    return meta


def scan(path: Path, dtype: str) -> dict:
    return scan_tokens(path, np.dtype(dtype), checksum=True)


def start_repair(out: Path, meta: dict, request: dict, corpus: Corpus, problems: dict) -> None:
    """Turn a damaged output into an unfinished preparation whose finished shards are the intact
    files, so the resumable path rebuilds exactly what is damaged (and survives an interruption)."""
    shards: dict = {}
    tokenizer_file = meta.get("tokenizer_file")
    intact_meta = META_FILE not in problems  # else its file list cannot be trusted
    entries = ({Path(e["file"]).stem: e for e in [*meta["train_files"], *meta["val_files"]]}
               if intact_meta else {})
    # With another tokenizer, or without per-file document counts (an older meta.json), every
    # shard is made again.
    if (intact_meta and tokenizer_file not in problems
            and all("documents" in e for e in entries.values())):
        for shard in corpus.shards:
            entry = entries.get(shard.name)
            if entry is None:
                shards[shard.name] = {"documents": 0, "tokens": 0}  # an empty shard has no file
            elif entry["file"] not in problems:
                shards[shard.name] = {key: entry[key] for key in
                                      ("documents", "tokens", "bytes", "sha256", "max_id")}
    if tokenizer_file in problems:
        with contextlib.suppress(FileNotFoundError):
            (out / tokenizer_file).unlink()  # made again (a trained BPE deterministically)
    write_json_atomic(out / STATE_FILE, {"request": request, "shards": shards})
    (out / META_FILE).unlink()  # the directory is incomplete until the rebuilt meta.json is in


def resolve_tokenizer(
    spec: str, vocab_size: int, corpus: Corpus, out: Path, resume: bool
) -> tuple[Tokenizer, str, str | None]:
    """(tokenizer, the spec worker processes load it from, tokenizer file beside the data or
    None)."""
    target = out / TOKENIZER_FILE
    if spec == "bpe":
        name = f"bpe-{vocab_size}"
        if resume and target.is_file():  # the BPE trained before the interruption
            tok = load_tokenizer(str(target))
            tok.name = name
            return tok, str(target), TOKENIZER_FILE
        trained = train_bpe(corpus.train_texts(), vocab_size, name=name)
        with atomic_path(target) as temporary:
            trained.save(temporary)
        return trained, str(target), TOKENIZER_FILE
    tok = load_tokenizer(spec)
    if spec.endswith(".json") or Path(spec).is_dir():
        # Keep a copy beside the data, so the directory is self-contained.
        source = Path(spec) / TOKENIZER_FILE if Path(spec).is_dir() else Path(spec)
        if source.resolve() != target.resolve():
            copy_atomic(source, target)
        return tok, str(target), TOKENIZER_FILE
    return tok, spec, None


def build_meta(
    request: dict,
    tok: Tokenizer,
    tokenizer_file: str | None,
    records: dict,
    shards: list[Shard],
    out: Path,
    command: str,
) -> dict:
    meta = {
        "format": FORMAT,
        "tokenizer": tok.name,
        "vocab_size": tok.vocab_size,
        "dtype": token_dtype(tok.vocab_size),
        "eot_id": tok.eot_id,
        "tokenizer_file": tokenizer_file,
        "tokenizer_sha256": sha256(out / tokenizer_file) if tokenizer_file else None,
        "tokenizer_library": tok.library,
        **request,
        "command": command,
        "danastar_version": __version__,
    }
    for split in ("train", "val"):
        names = [s.name for s in shards if s.split == split]
        files = []
        for name in names:
            record = records[name]
            if record["tokens"] == 0:
                continue
            if "sha256" not in record:  # finished by a version that did not record it
                record.update(scan(out / f"{name}.bin", meta["dtype"]))
            files.append({"file": f"{name}.bin", "tokens": record["tokens"],
                          "documents": record["documents"], "bytes": record["bytes"],
                          "sha256": record["sha256"], "max_id": record["max_id"]})
        meta[f"{split}_files"] = files
        meta[f"{split}_tokens"] = sum(f["tokens"] for f in files)
        meta[f"{split}_documents"] = sum(records[n]["documents"] for n in names)
    return meta


def remove_written(out: Path, state: dict, trained_tokenizer: bool, created: bool) -> None:
    """Remove the token files, the trained tokenizer and the state of an unfinished preparation,
    and the output directory it `created` when nothing else is in it."""
    for name, record in state["shards"].items():
        if record.get("tokens"):
            (out / f"{name}.bin").unlink(missing_ok=True)
    if trained_tokenizer:
        (out / TOKENIZER_FILE).unlink(missing_ok=True)
    (out / STATE_FILE).unlink(missing_ok=True)
    if created:
        with contextlib.suppress(OSError):
            out.rmdir()  # only if empty

