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

import fcntl  # POSIX only, like the rest of the multi-process machinery
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from danastar.data.prepare_records import (
    STATE_FILE,
    TOKENIZER_FILE,
    add_checksums,
    build_meta,
    command_text,
    read_json,
    read_state,
    records_complete,
    remove_written,
    resolve_tokenizer,
    say,
    start_repair,
    write_json_atomic,
)
from danastar.data.prepared import (
    META_FILE,
    check_contents,
    content_problem,
    meta_is_complete,
    prepared_format,
    remember_checked,
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
from danastar.data.tokenise import Tokenise, progress_bar, text_batches, worker_count
from danastar.data.tokenizers import token_dtype
from danastar.durable import atomic_path, out_of_space, sha256
from danastar.errors import UserError
from danastar.progress import Stages

# Sources prepared automatically on first use by name (small, and downloadable without an account).
AUTO_PREPARED = ("shakespeare", "prose")


def default_data_dir(name: str) -> Path:
    """Where a named source is prepared by default: `$DANASTAR_DATA_DIR/<name>`, else the cache."""
    root = os.environ.get("DANASTAR_DATA_DIR")
    return (Path(root).expanduser() if root else cache_dir() / "data") / name


def is_prepared(directory: Path) -> bool:
    """A directory the loader can open: ours (`meta.json`) or the original release's raw files."""
    return prepared_format(directory) is not None


def ensure_prepared(name_or_dir: str | os.PathLike) -> Path:
    """A prepared data directory: the path itself if prepared, else the named source's default one.

    `shakespeare` and `prose` are prepared on first use, and prepared again where their default
    directory is found damaged (the check costs milliseconds for these corpora). Several
    processes (e.g. the ranks of one job) may call this at once: an exclusive file lock lets one
    prepare while the others wait, and the others then find `meta.json` in place.
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
            recorded = read_json(path / STATE_FILE).get("command")
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
    workers = worker_count(workers)  # checked before any long work
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
    command = command_text(source, tokenizer, vocab_size, source_options)
    if (out / META_FILE).is_file():
        intact = _verify_existing(out, request, corpus, command)
        if intact is not None:
            return intact
    state = read_state(out)
    if state is not None and state["request"] != request:
        raise UserError(
            f"{out} holds an unfinished preparation with other options; choose another --out or "
            "delete it."
        )
    # the two long stages, said as they start (a bar counts the second on a terminal)
    stages = Stages("danastar prepare" if progress else None)
    if spec == "bpe" and not (state is not None and (out / TOKENIZER_FILE).is_file()):
        stages.start(f"training a BPE vocabulary of {vocab_size or corpus.default_vocab_size:,} "
                     f"tokens on {source}'s training text")
    tok, worker_spec, tokenizer_file = resolve_tokenizer(
        spec, vocab_size or corpus.default_vocab_size, corpus, out, resume=state is not None
    )
    state = state or {"request": request, "shards": {}}
    state["command"] = command  # named to whoever finds the preparation unfinished
    stages.start(f"tokenising {source} into {out}")
    _write_shards(corpus, state, out, token_dtype(tok.vocab_size), worker_spec, workers, progress)
    meta = build_meta(request, tok, tokenizer_file, state["shards"], corpus.shards, out, command)
    for split in ("train", "val"):
        if meta[f"{split}_tokens"] == 0:
            # No retry of this request can do better, and what it left would block one with
            # other options: remove what this preparation wrote.
            remove_written(out, state, spec == "bpe", created)
            raise UserError(
                f"the {split} split of {source!r} is empty; give more documents or adjust "
                f"--val_fraction (the tokens written to {out} were removed)."
            )
        for entry in meta[f"{split}_files"]:
            if entry["max_id"] >= tok.vocab_size:  # a tokenizer that breaks its own contract
                raise RuntimeError(f"{entry['file']} holds id {entry['max_id']} but the "
                                   f"tokenizer {tok.name} has {tok.vocab_size} ids")
    write_json_atomic(out / META_FILE, meta)
    (out / STATE_FILE).unlink()
    remember_checked(out, [*meta["train_files"], *meta["val_files"]])
    return meta


def _verify_existing(out: Path, request: dict, corpus: Corpus, command: str) -> dict | None:
    """An output with a `meta.json`: its meta when it is this request's and intact; else None,
    with what is damaged turned into an unfinished preparation (or an unreadable `meta.json`
    kept aside). Another request's output is refused."""
    meta = read_meta(out)
    if meta is None:
        # Nothing says what the directory held: keep the unreadable file, prepare afresh.
        kept = out / f"{META_FILE}.corrupt"
        os.replace(out / META_FILE, kept)
        say(f"{out / META_FILE} is unreadable (kept as {kept.name}); preparing {out} again")
        return None
    if {key: meta.get(key) for key in request} != request:
        raise UserError(
            f"{out} already holds data prepared differently; choose another --out or delete it."
        )
    problems = damage(out, meta)
    if problems:
        say(f"{out}: {'; '.join(problems.values())}; rebuilding what is damaged")
        start_repair(out, meta, request, corpus, problems)
        return None
    if not records_complete(meta):  # written before meta.json held checksums
        meta = add_checksums(out, meta, command)
    remember_checked(out, [*meta["train_files"], *meta["val_files"]])
    return meta  # already prepared, and intact


def _write_shards(corpus: Corpus, state: dict, out: Path, dtype: str, worker_spec: str,
                  workers: int, progress: bool) -> None:
    """Tokenise the shards not finished yet, recording each in the state file as it is done."""
    total = (
        sum(s.documents for s in corpus.shards)
        if all(s.documents is not None for s in corpus.shards)
        else None
    )
    done_documents = sum(r["documents"] for r in state["shards"].values())
    with (
        Tokenise(worker_spec, workers) as tokenise,
        progress_bar(total, done_documents, progress) as bar,
    ):
        for shard in corpus.shards:
            if shard.name in state["shards"]:
                continue  # finished before an interruption
            state["shards"][shard.name] = _write_shard(shard, tokenise, out, dtype, bar)
            write_json_atomic(out / STATE_FILE, state)


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


def _write_shard(shard: Shard, tokenise: Tokenise, out: Path, dtype: str, bar) -> dict:
    """Tokenise one shard into `<name>.bin` (renamed into place when complete); its counts, size,
    checksum and largest id (computed on the way, so verifying it later needs no second pass)."""
    documents = tokens = size = 0
    largest = -1
    digest = hashlib.sha256()
    with atomic_path(out / f"{shard.name}.bin") as temporary:
        with open(temporary, "wb") as f:
            for batch_documents, ids in tokenise(text_batches(shard.read())):
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


# --- parallel tokenisation
# -------------------------------------------------------------------------


# --- small file helpers
# ----------------------------------------------------------------------------


