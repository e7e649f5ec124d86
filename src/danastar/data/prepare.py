"""Tokenise a corpus into token files plus `meta.json` (what `danastar prepare` runs).

Output (see docs/data.md): `train_00000.bin, ...` and `val_00000.bin, ...`, flat little-endian
streams of token ids, each document followed by the end-of-text id; `meta.json` describing them;
`tokenizer.json` when the tokenizer is a Hugging Face one (e.g. the BPE trained for the corpus).

Documents are tokenised in worker processes, shard by shard. Each finished shard is renamed into
place and recorded in `.prepare_state.json`, so an interrupted preparation resumes at the first
unfinished shard and produces the same files as an uninterrupted one. `meta.json` is written last:
a directory with a `meta.json` is complete.

`meta.json` records each file's size, SHA-256 and largest id. Preparing into an existing output
verifies every file against it and rebuilds what is damaged or missing (through the same
resumable path), so "prepare again" is always the repair.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import multiprocessing
import os
import shlex
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from danastar import __version__
from danastar.data.prepared import (
    META_FILE,
    check_contents,
    content_problem,
    meta_is_complete,
    prepared_format,
    remember_checked,
    scan_tokens,
    size_problem,
)
from danastar.data.sources import (
    SOURCES,
    Corpus,
    Shard,
    cache_dir,
    make_cache_folder,
    open_source,
)
from danastar.data.tokenizers import Tokenizer, load_tokenizer, token_dtype, train_bpe
from danastar.durable import atomic_path, copy_atomic, out_of_space, sha256, write_atomic
from danastar.errors import UserError

STATE_FILE = ".prepare_state.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT = "danastar-tokens-1"
# Sources prepared automatically on first use by name (small, and downloadable without an account).
AUTO_PREPARED = ("shakespeare",)


def default_data_dir(name: str) -> Path:
    """Where a named source is prepared by default: `$DANASTAR_DATA_DIR/<name>`, else the cache."""
    root = os.environ.get("DANASTAR_DATA_DIR")
    return (Path(root).expanduser() if root else cache_dir() / "data") / name


def is_prepared(directory: Path) -> bool:
    """A directory the loader can open: ours (`meta.json`) or the original release's raw files."""
    return prepared_format(directory) is not None


def ensure_prepared(name_or_dir: str | os.PathLike) -> Path:
    """A prepared data directory: the path itself if prepared, else the named source's default one.

    `shakespeare` is prepared on first use, and prepared again where its default directory is
    found damaged (the check costs milliseconds for this corpus). Several processes (e.g. the ranks
    of one job) may call this at once: an exclusive file lock lets one prepare while the others
    wait, and the others then find `meta.json` in place.
    """
    path = Path(name_or_dir).expanduser()
    if path.is_dir() and is_prepared(path):
        return path  # a directory given by the user: the loader verifies it when it opens it
    name = str(name_or_dir)
    directory = default_data_dir(name) if name in SOURCES else None
    if directory is not None and is_prepared(directory):
        if name not in AUTO_PREPARED or not damage(directory):
            return directory  # a named source prepared earlier into its default directory
    if name not in AUTO_PREPARED:
        if (path / STATE_FILE).is_file():
            recorded = _read_json(path / STATE_FILE).get("command")
            rerun = f"`{recorded} --out {name}`" if recorded else "the `danastar prepare` command"
            raise UserError(
                f"{name!r} holds an unfinished preparation; run {rerun} again to finish it (it "
                "resumes where it stopped)."
            )
        if path.exists():
            raise UserError(
                f"{name!r} holds no meta.json (nor train.bin/val.bin); prepare it with `danastar "
                f"prepare SOURCE --out {name}`."
            )
        if directory is not None:
            raise UserError(
                f"{name!r} is not prepared yet; run `danastar prepare {name}` (it writes "
                f"{directory}) "
                f"or pass a prepared directory."
            )
        raise UserError(
            f"data {name!r} is neither a prepared directory nor one of {', '.join(AUTO_PREPARED)}; "
            f"prepare it first with `danastar prepare SOURCE --out DIR` and pass DIR."
        )
    make_cache_folder(directory.parent)
    import fcntl  # POSIX only, like the rest of the multi-process machinery

    with open(directory.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_prepared(directory) or damage(directory):
            prepare_source(name, directory)  # prepares, or verifies and rebuilds what is damaged
    return directory


def damage(directory: Path, meta: dict | None = None) -> dict[str, str]:
    """What is damaged in a prepared directory: file name -> the problem (empty: nothing).

    Every file is read in full (size, checksum, largest id against the vocabulary): a few
    milliseconds for Shakespeare, about 2 s per GB (SHA-256) for large corpora.
    """
    if meta is None:
        meta = read_meta(directory)
        if meta is None:
            return {META_FILE: f"{META_FILE} is unreadable"}
    if not meta_is_complete(meta):
        return {META_FILE: f"{META_FILE} lacks what a complete preparation records"}
    dtype = np.dtype(meta["dtype"])
    entries = [*meta["train_files"], *meta["val_files"]]
    problems = {e["file"]: size_problem(directory, e, dtype) for e in entries}
    intact_size = [e for e in entries if problems[e["file"]] is None]  # only these are read
    records = check_contents(directory, intact_size, dtype, fresh=True)
    for entry in intact_size:
        problems[entry["file"]] = content_problem(entry, records[entry["file"]],
                                                  meta["vocab_size"])
    tokenizer_file = meta.get("tokenizer_file")
    if tokenizer_file and "tokenizer_sha256" in meta:
        path = directory / tokenizer_file
        if not path.is_file():
            problems[tokenizer_file] = f"{tokenizer_file} is missing"
        elif sha256(path) != meta["tokenizer_sha256"]:
            problems[tokenizer_file] = f"{tokenizer_file} does not match its checksum"
    return {name: problem for name, problem in problems.items() if problem}


def _read_json(path: Path) -> dict:
    """A JSON object from a file; empty when the file is unreadable."""
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) else {}


def read_meta(directory: Path) -> dict | None:
    """The content of `meta.json`; None when it is not a readable JSON object."""
    try:
        meta = json.loads((directory / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def prepare_source(source: str, out_dir: str | os.PathLike, tokenizer: str | None = None,
                   **options) -> dict:
    """Tokenise `source` into `out_dir` and return its meta (the content of `meta.json`).

    `tokenizer`: a `load_tokenizer` spec, or `bpe` to train a byte-level BPE of `vocab_size` on the
    train split (the default for Shakespeare). Other options: `vocab_size`, `workers`, `progress`
    and those of `sources.open_source`. An existing output of the same request is verified, and
    what is damaged or missing rebuilt. A full disk is one sentence: the shards finished are kept
    (each is renamed into place whole), and the same command resumes after them.
    """
    out = Path(out_dir).expanduser()
    try:
        return _prepare_source(source, out, tokenizer, **options)
    except OSError as error:
        if not out_of_space(error):
            raise
        raise UserError(
            f"no space left in {out} while preparing it; the shards finished so far are kept: "
            "free some space and run the same command again to go on from them."
        ) from None


def _prepare_source(
    source: str,
    out: Path,
    tokenizer: str | None = None,
    *,
    vocab_size: int | None = None,
    workers: int | None = None,
    progress: bool = True,
    **source_options,
) -> dict:
    _check_out(out)
    workers = _worker_count(workers)  # checked before any long work
    corpus = open_source(source, **source_options)
    created = not out.exists()
    _make_out(out)
    spec = tokenizer or corpus.default_tokenizer
    if spec != "bpe" and vocab_size is not None:
        raise UserError(
            "--vocab_size only applies to --tokenizer bpe (a vocabulary trained on the corpus)."
        )
    # What was asked for; a directory prepared (or half prepared) for another request is refused.
    request = {
        "source": corpus.description,
        "tokenizer_request": f"bpe:{vocab_size or corpus.default_vocab_size}"
        if spec == "bpe"
        else spec,
    }
    command = _command(source, tokenizer, vocab_size, source_options)
    if (out / META_FILE).is_file():
        meta = read_meta(out)
        if meta is None:
            # Nothing says what the directory held: keep the unreadable file, prepare afresh.
            kept = out / f"{META_FILE}.corrupt"
            os.replace(out / META_FILE, kept)
            _say(f"{out / META_FILE} is unreadable (kept as {kept.name}); preparing {out} again")
        elif {key: meta.get(key) for key in request} != request:
            raise UserError(
                f"{out} already holds data prepared differently; choose another --out or delete it."
            )
        else:
            problems = damage(out, meta)
            if not problems:
                if not _records_complete(meta):  # written before meta.json held checksums
                    meta = _add_checksums(out, meta, command)
                remember_checked(out, [*meta["train_files"], *meta["val_files"]])
                return meta  # already prepared, and intact
            _say(f"{out}: {'; '.join(problems.values())}; rebuilding what is damaged")
            _start_repair(out, meta, request, corpus, problems)
    state = _read_state(out)
    if state is not None and state["request"] != request:
        raise UserError(
            f"{out} holds an unfinished preparation with other options; choose another --out or "
            "delete it."
        )
    tok, worker_spec, tokenizer_file = _resolve_tokenizer(
        spec, vocab_size or corpus.default_vocab_size, corpus, out, resume=state is not None
    )
    state = state or {"request": request, "shards": {}}
    state["command"] = command  # named to whoever finds the preparation unfinished
    dtype = token_dtype(tok.vocab_size)

    total = (
        sum(s.documents for s in corpus.shards)
        if all(s.documents is not None for s in corpus.shards)
        else None
    )
    done_documents = sum(r["documents"] for r in state["shards"].values())
    with (
        _Tokenise(worker_spec, workers) as tokenise,
        _progress(total, done_documents, progress) as bar,
    ):
        for shard in corpus.shards:
            if shard.name in state["shards"]:
                continue  # finished before an interruption
            state["shards"][shard.name] = _write_shard(shard, tokenise, out, dtype, bar)
            _write_json_atomic(out / STATE_FILE, state)

    meta = _meta(request, tok, tokenizer_file, state["shards"], corpus.shards, out, command)
    for split in ("train", "val"):
        if meta[f"{split}_tokens"] == 0:
            # No retry of this request can do better, and what it left would block one with
            # other options: remove what this preparation wrote.
            _remove_written(out, state, spec == "bpe", created)
            raise UserError(
                f"the {split} split of {source!r} is empty; give more documents or adjust "
                f"--val_fraction (the tokens written to {out} were removed)."
            )
        for entry in meta[f"{split}_files"]:
            if entry["max_id"] >= tok.vocab_size:  # a tokenizer that breaks its own contract
                raise RuntimeError(f"{entry['file']} holds id {entry['max_id']} but the "
                                   f"tokenizer {tok.name} has {tok.vocab_size} ids")
    _write_json_atomic(out / META_FILE, meta)
    (out / STATE_FILE).unlink()
    remember_checked(out, [*meta["train_files"], *meta["val_files"]])
    return meta


def _remove_written(out: Path, state: dict, trained_tokenizer: bool, created: bool) -> None:
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


def _check_out(out: Path) -> None:
    """Refuse an output path that cannot be a directory, before any long work."""
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                where = "is" if path == out else f"lies under {path}, which is"
                raise UserError(f"--out {out} {where} a file, not a directory; give a directory.")
            return


def _make_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(
            f"cannot create the output directory {out} ({error.strerror}); give a writable --out."
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UserError(f"the output directory {out} is not writable; give a writable --out.")


def _say(message: str) -> None:
    print(f"danastar prepare: {message}", file=sys.stderr, flush=True)


def _command(source: str, tokenizer: str | None, vocab_size: int | None, options: dict) -> str:
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


def _records_complete(meta: dict) -> bool:
    # Per-file document counts are not required: an older meta.json lacks them for good (a
    # repair of such a directory rebuilds every shard).
    return all({"bytes", "sha256", "max_id"} <= e.keys()
               for e in [*meta["train_files"], *meta["val_files"]])


def _add_checksums(out: Path, meta: dict, command: str) -> dict:
    """Record sizes, checksums and largest ids in a `meta.json` written before it held them (its
    files passed the size check). Document counts per file were not recorded then."""
    for entry in [*meta["train_files"], *meta["val_files"]]:
        path = out / entry["file"]
        entry.update({key: value for key, value in
                      _scan(path, meta["dtype"]).items() if key not in entry})
    if meta.get("tokenizer_file") and (out / meta["tokenizer_file"]).is_file():
        meta.setdefault("tokenizer_sha256", sha256(out / meta["tokenizer_file"]))
    meta.setdefault("command", command)
    _write_json_atomic(out / META_FILE, meta)
    return meta


def _scan(path: Path, dtype: str) -> dict:
    return scan_tokens(path, np.dtype(dtype), checksum=True)


def _start_repair(out: Path, meta: dict, request: dict, corpus: Corpus, problems: dict) -> None:
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
    _write_json_atomic(out / STATE_FILE, {"request": request, "shards": shards})
    (out / META_FILE).unlink()  # the directory is incomplete until the rebuilt meta.json is in


def _resolve_tokenizer(
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


def _meta(
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
                record.update(_scan(out / f"{name}.bin", meta["dtype"]))
            files.append({"file": f"{name}.bin", "tokens": record["tokens"],
                          "documents": record["documents"], "bytes": record["bytes"],
                          "sha256": record["sha256"], "max_id": record["max_id"]})
        meta[f"{split}_files"] = files
        meta[f"{split}_tokens"] = sum(f["tokens"] for f in files)
        meta[f"{split}_documents"] = sum(records[n]["documents"] for n in names)
    return meta


def _write_shard(shard: Shard, tokenise: _Tokenise, out: Path, dtype: str, bar) -> dict:
    """Tokenise one shard into `<name>.bin` (renamed into place when complete); its counts, size,
    checksum and largest id (computed on the way, so verifying it later needs no second pass)."""
    documents = tokens = size = 0
    largest = -1
    digest = hashlib.sha256()
    with atomic_path(out / f"{shard.name}.bin") as temporary:
        with open(temporary, "wb") as f:
            for batch_documents, ids in tokenise(_text_batches(shard.read())):
                data = ids.astype(np.dtype(dtype).newbyteorder("<"), copy=False).tobytes()
                f.write(data)
                digest.update(data)
                size += len(data)
                if len(ids):
                    largest = max(largest, int(ids.max()))
                documents += batch_documents
                tokens += len(ids)
                bar.update(batch_documents)
                bar.set_postfix(tokens=f"{tokens:,}", shard=shard.name, refresh=False)
        if tokens == 0:
            temporary.unlink()  # an empty shard (e.g. no validation document in it) leaves no file
            return {"documents": documents, "tokens": 0}
    return {"documents": documents, "tokens": tokens, "bytes": size,
            "sha256": digest.hexdigest(), "max_id": largest}


def _text_batches(
    texts: Iterable[str], max_chars: int = 1 << 20, max_documents: int = 1024
) -> Iterator[list[str]]:
    """Groups of documents of about a megabyte: large enough to amortise inter-process traffic,
    small enough that a corpus of a few long documents still spreads over all workers."""
    batch, size = [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= max_chars or len(batch) >= max_documents:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


# --- parallel tokenisation
# -------------------------------------------------------------------------

_worker_tokenizer: Tokenizer | None = None


def _init_worker(spec: str, one_thread: bool = False) -> None:
    global _worker_tokenizer
    if one_thread:
        # One core per worker process: the Rust tokenizers' own thread pool would oversubscribe.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_tokenizer = load_tokenizer(spec)


def _encode_documents(texts: list[str]) -> tuple[int, np.ndarray]:
    """(number of documents, their ids concatenated, each followed by the end-of-text id)."""
    tok = _worker_tokenizer
    pieces = []
    for ids in tok.encode_batch(texts):
        pieces.append(ids)
        pieces.append([tok.eot_id])
    return len(texts), np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int64)


class _Tokenise:
    """Maps batches of documents to token arrays, in order, over a pool of worker processes.

    Workers are spawned (not forked): a process that has already run the Rust tokenizers'
    thread pool (BPE training) must not be forked. At most a few batches per worker are in flight,
    so memory stays bounded however large a shard is.
    """

    def __init__(self, spec: str, workers: int):
        self.spec, self.workers, self.pool = spec, workers, None

    def __enter__(self) -> _Tokenise:
        if self.workers > 1:
            context = multiprocessing.get_context("spawn")
            self.pool = context.Pool(
                self.workers, initializer=_init_worker, initargs=(self.spec, True)
            )
        else:
            _init_worker(self.spec)
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()

    def __call__(self, batches: Iterator[list[str]]) -> Iterator[tuple[int, np.ndarray]]:
        if self.pool is None:
            yield from map(_encode_documents, batches)
            return
        while window := list(itertools.islice(batches, 2 * self.workers)):
            yield from self.pool.imap(_encode_documents, window)


def _worker_count(workers: int | None) -> int:
    if workers is None:
        return (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1)
        )
    if workers < 1:
        raise UserError(f"--workers must be at least 1 (got {workers}).")
    return workers


@contextlib.contextmanager
def _progress(total: int | None, done: int, enabled: bool):
    from tqdm.auto import tqdm

    with tqdm(
        total=total,
        initial=done,
        unit="doc",
        desc="tokenising",
        disable=not enabled,
        dynamic_ncols=True,
    ) as bar:
        yield bar


# --- small file helpers
# ----------------------------------------------------------------------------


def _read_state(out: Path) -> dict | None:
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
        _say(f"{path} is unreadable (kept as {kept.name}); starting the preparation over")
        return None
    # A shard counts as finished only if its file is still there, whole (empty shards have none).
    state["shards"] = {
        n: r for n, r in shards.items() if r["tokens"] == 0 or _whole(out / f"{n}.bin", r)
    }
    return state


def _whole(path: Path, record: dict) -> bool:
    if not path.is_file():
        return False
    return "bytes" not in record or path.stat().st_size == record["bytes"]


def _write_json_atomic(path: Path, content: dict) -> None:
    write_atomic(path, json.dumps(content, indent=2) + "\n")
