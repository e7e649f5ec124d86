import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from danastar import cli
from danastar.commands import prepare as prepare_command
from danastar.data import prepare
from danastar.data.prepare import ensure_prepared, prepare_source
from danastar.data.sources import SHAKESPEARE_TRAIN_TOKENS, in_validation
from danastar.data.tokenizers import load_tokenizer, train_bpe
from danastar.errors import UserError

META_KEYS = {
    "tokenizer",
    "vocab_size",
    "dtype",
    "train_tokens",
    "val_tokens",
    "train_documents",
    "val_documents",
    "eot_id",
    "train_files",
    "val_files",
    "source",
}


def documents_in(directory: Path, split: str) -> list[str]:
    """Decode a split's token files back into its documents (each ends with the end-of-text id)."""
    meta = json.loads((directory / "meta.json").read_text())
    spec = str(directory / meta["tokenizer_file"]) if meta["tokenizer_file"] else meta["tokenizer"]
    tok = load_tokenizer(spec)
    tokens = np.concatenate(
        [np.fromfile(directory / f["file"], dtype=meta["dtype"]) for f in meta[f"{split}_files"]]
    )
    assert len(tokens) == meta[f"{split}_tokens"] and tokens[-1] == meta["eot_id"]
    ends = np.flatnonzero(tokens == meta["eot_id"])
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [tok.decode(tokens[a:b].tolist()) for a, b in zip(starts, ends)]


def directory_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# --- Shakespeare, prepared for real ---------------------------------------------------------------


def test_two_processes_prepare_shakespeare_once(shakespeare_run):
    assert shakespeare_run.returncodes == [0, 0], shakespeare_run.stderrs
    assert shakespeare_run.stdouts == [str(shakespeare_run.directory)] * 2
    assert sorted(p.name for p in shakespeare_run.directory.iterdir()) == [
        "meta.json",
        "tokenizer.json",
        "train_00000.bin",
        "val_00000.bin",
    ]
    assert ensure_prepared(shakespeare_run.directory) == shakespeare_run.directory


def test_shakespeare_one_copy_of_each_work_split_by_document(shakespeare_dir, shakespeare_texts):
    meta = json.loads((shakespeare_dir / "meta.json").read_text())
    assert META_KEYS <= meta.keys()
    assert (meta["tokenizer"], meta["vocab_size"], meta["dtype"], meta["eot_id"]) == (
        "bpe-4096",
        4096,
        "uint16",
        0,
    )
    # 42 plays and poems of Shakespeare, 7 works of Milton; no First Folio duplicates, no copies.
    assert len(shakespeare_texts) == 49 and not any(key.endswith("_f") for key in shakespeare_texts)
    assert len(set(shakespeare_texts.values())) == 49
    val_keys = meta["source"]["split"]["val_documents"]
    assert (meta["train_documents"], meta["val_documents"]) == (49 - len(val_keys), len(val_keys))
    for split in ("train", "val"):
        assert meta[f"{split}_tokens"] == sum(
            (shakespeare_dir / f["file"]).stat().st_size // 2 for f in meta[f"{split}_files"]
        )
    # Decoding the token files gives back exactly the texts of each split, in order.
    assert documents_in(shakespeare_dir, "val") == [shakespeare_texts[key] for key in val_keys]
    train_keys = [key for key in sorted(shakespeare_texts) if key not in val_keys]
    assert documents_in(shakespeare_dir, "train") == [shakespeare_texts[key] for key in train_keys]
    assert (
        1_500_000 < meta["train_tokens"] < 2_500_000
        and 0.05 < meta["val_tokens"] / meta["train_tokens"] < 0.25
    )
    assert meta["train_tokens"] == SHAKESPEARE_TRAIN_TOKENS  # what plans say before preparing it


# --- local files ----------------------------------------------------------------------------------


def write_local_corpus(root: Path) -> list[str]:
    """Two .txt files, a .jsonl and a .parquet in a subfolder; returns every document."""
    rng = np.random.default_rng(0)
    words = "the king and queen of denmark speak of love war and honour to thee my lord".split()

    def text(n):
        return " ".join(rng.choice(words, size=n)) + ".\n"

    root.mkdir(parents=True)
    documents = []
    for name in ("a.txt", "b.txt"):
        documents.append(text(50) + "Ünïcode — line two\n")
        (root / name).write_text(documents[-1], encoding="utf-8")
    lines = [text(int(rng.integers(5, 40))) for _ in range(30)]
    (root / "docs.jsonl").write_text(
        "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(lines))
    )
    rows = [text(int(rng.integers(5, 40))) for _ in range(40)]
    (root / "sub").mkdir()
    pq.write_table(pa.table({"text": rows, "id": list(range(40))}), root / "sub" / "rows.parquet")
    return documents + lines + rows


def test_local_files_every_document_once_split_by_hash(tmp_path):
    documents = write_local_corpus(tmp_path / "in")
    meta = prepare_source(
        str(tmp_path / "in"),
        tmp_path / "out",
        tokenizer="bytes",
        val_fraction=0.25,
        workers=1,
        progress=False,
    )
    train, val = documents_in(tmp_path / "out", "train"), documents_in(tmp_path / "out", "val")
    assert sorted(train + val) == sorted(documents) and not set(train) & set(val)
    assert (meta["train_documents"], meta["val_documents"]) == (len(train), len(val))
    assert 10 < len(val) < 30
    # The validation set is the hash rule applied to (relative path, row).
    keys = [
        "a.txt:0",
        "b.txt:0",
        *(f"docs.jsonl:{i}" for i in range(30)),
        *(f"sub/rows.parquet:{i}" for i in range(40)),
    ]
    assert sorted(val) == sorted(d for d, k in zip(documents, keys) if in_validation(k, 0.25, 0))
    # Preparing again with the same request is a no-op; with another one it is refused.
    before = directory_bytes(tmp_path / "out")
    assert (
        prepare_source(
            str(tmp_path / "in"),
            tmp_path / "out",
            tokenizer="bytes",
            val_fraction=0.25,
            progress=False,
        )
        == meta
    )
    assert directory_bytes(tmp_path / "out") == before
    with pytest.raises(UserError, match="prepared differently"):
        prepare_source(
            str(tmp_path / "in"),
            tmp_path / "out",
            tokenizer="bytes",
            val_fraction=0.5,
            progress=False,
        )


def test_text_field_option(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "d.jsonl").write_text(
        "".join(json.dumps({"content": f"document {i}"}) + "\n" for i in range(40))
    )
    with pytest.raises(UserError, match="--text_field"):
        prepare_source(str(tmp_path / "in"), tmp_path / "out", tokenizer="bytes", progress=False)
    prepare_source(
        str(tmp_path / "in"),
        tmp_path / "out2",
        tokenizer="bytes",
        text_field="content",
        val_fraction=0.2,
        progress=False,
    )
    assert sorted(
        documents_in(tmp_path / "out2", "train") + documents_in(tmp_path / "out2", "val")
    ) == sorted(f"document {i}" for i in range(40))


def interrupt_after(monkeypatch, shards: int) -> None:
    """Make the preparation die (as from Ctrl-C) while writing shard number `shards` + 1."""
    write_shard, calls = prepare._write_shard, []

    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) > shards:
            raise KeyboardInterrupt
        return write_shard(*args, **kwargs)

    monkeypatch.setattr(prepare, "_write_shard", dying)


def test_interrupted_local_preparation_resumes_to_identical_output(tmp_path, monkeypatch):
    write_local_corpus(tmp_path / "in")
    # A tiny shard size makes each input file its own shard; the BPE is trained on the corpus.
    options = dict(
        tokenizer="bpe",
        vocab_size=300,
        val_fraction=0.25,
        shard_input_mb=1e-4,
        workers=1,
        progress=False,
    )
    prepare_source(str(tmp_path / "in"), tmp_path / "whole", **options)
    assert len(json.loads((tmp_path / "whole" / "meta.json").read_text())["train_files"]) == 4

    with monkeypatch.context() as patch:
        interrupt_after(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            prepare_source(str(tmp_path / "in"), tmp_path / "resumed", **options)
    assert (tmp_path / "resumed" / prepare.STATE_FILE).is_file() and not (
        tmp_path / "resumed" / "meta.json"
    ).exists()
    with monkeypatch.context() as patch:
        interrupt_after(patch, 2)  # the second attempt is interrupted too, later on
        with pytest.raises(KeyboardInterrupt):
            prepare_source(str(tmp_path / "in"), tmp_path / "resumed", **options)
    prepare_source(str(tmp_path / "in"), tmp_path / "resumed", **options)
    assert directory_bytes(tmp_path / "resumed") == directory_bytes(tmp_path / "whole")


def test_a_full_disk_while_preparing_is_one_sentence_and_keeps_the_finished_shards(
        tmp_path, monkeypatch):
    # A full disk cannot be made safely everywhere the tests run: here the third shard's writes
    # fail part way with ENOSPC, as they do on a full disk (checked by hand on a small tmpfs).
    import builtins
    import errno
    import io

    write_local_corpus(tmp_path / "in")
    options = dict(tokenizer="bytes", val_fraction=0.25, shard_input_mb=1e-4, workers=1,
                   progress=False)
    prepare_source(str(tmp_path / "in"), tmp_path / "whole", **options)
    real_open, opened = builtins.open, []

    class FullDisk(io.FileIO):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    def open_on_a_full_disk(path, mode="r", *args, **kwargs):
        if str(path).endswith(".tmp") and ".bin." in str(path) and "w" in mode:
            opened.append(path)
            if len(opened) >= 3:
                return io.BufferedWriter(FullDisk(path, "w"), buffer_size=16)
        return real_open(path, mode, *args, **kwargs)

    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        patch.setattr("builtins.open", open_on_a_full_disk)
        with pytest.raises(UserError) as refused:  # before: the OSError's traceback
            prepare_source(str(tmp_path / "in"), out, **options)
    assert str(refused.value) == (
        f"no space left in {out} while preparing it; the shards finished so far are kept: free "
        "some space and run the same command again to go on from them.")
    kept = sorted(path.name for path in out.iterdir())
    assert prepare.STATE_FILE in kept and "meta.json" not in kept
    assert not [name for name in kept if name.endswith(".tmp")]  # no partial shard is left
    prepare_source(str(tmp_path / "in"), out, **options)
    assert directory_bytes(out) == directory_bytes(tmp_path / "whole")


# --- FineWeb on parquet files shaped like the hub's
# ------------------------------------------------


def write_fineweb_parquet(root: Path, files: int = 3, rows: int = 120) -> list[str]:
    rng = np.random.default_rng(1)
    words = "web page text about cooking travel science news sports music the a of and to".split()
    root.mkdir(parents=True)
    documents = []
    for f in range(files):
        texts = [" ".join(rng.choice(words, size=int(rng.integers(10, 80)))) for _ in range(rows)]
        documents += texts
        table = pa.table(
            {
                "text": texts,
                "id": [f"<urn:uuid:{f}-{i}>" for i in range(rows)],
                "dump": ["CC-MAIN-2024-10"] * rows,
                "url": [f"https://example.com/{f}/{i}" for i in range(rows)],
                "date": ["2024-02-20T00:00:00Z"] * rows,
                "file_path": [f"s3://commoncrawl/{f}.warc.gz"] * rows,
                "language": ["en"] * rows,
                "language_score": rng.uniform(0.65, 1.0, rows),
                "token_count": [len(t.split()) for t in texts],
            }
        )
        pq.write_table(table, root / f"{f:03d}_00000.parquet")
    return documents


@pytest.fixture(scope="module")
def fineweb_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("fineweb")
    documents = write_fineweb_parquet(root / "parquet")
    tok = train_bpe(documents[:100], 300)  # a test tokenizer in place of GPT-2, through --tokenizer
    tok.save(root / "test-tokenizer.json")
    return root, documents


def fineweb_args(root: Path, out: str, workers: int) -> list[str]:
    return [
        "fineweb",
        "--out",
        str(root / out),
        "--data_files",
        str(root / "parquet"),
        "--tokenizer",
        str(root / "test-tokenizer.json"),
        "--docs_per_shard",
        "100",
        "--val_fraction",
        "0.05",
        "--hf_cache_dir",
        str(root / "hf-cache"),
        "--workers",
        str(workers),
        "--no_progress",
    ]


def test_fineweb_from_local_parquet_with_the_papers_split(fineweb_case):
    import datasets

    root, documents = fineweb_case
    assert cli.main(["prepare", *fineweb_args(root, "out", workers=2)]) == 0
    meta = json.loads((root / "out" / "meta.json").read_text())
    assert meta["vocab_size"] == 300 and meta["tokenizer_file"] == "tokenizer.json"
    assert [f["file"] for f in meta["train_files"]] == [
        "train_00000.bin",
        "train_00001.bin",
        "train_00002.bin",
        "train_00003.bin",
    ]
    files = sorted(str(p) for p in (root / "parquet").glob("*.parquet"))
    expected = datasets.load_dataset(
        "parquet", data_files=files, split="train", cache_dir=str(root / "hf-cache")
    ).train_test_split(test_size=0.05, seed=2357, shuffle=True)
    val, train = list(expected["test"]["text"]), list(expected["train"]["text"])
    assert documents_in(root / "out", "val") == val
    assert documents_in(root / "out", "train") == train
    assert len(val) == 18 and sorted(val + train) == sorted(documents)


def test_fineweb_one_worker_and_resumed_give_identical_output(fineweb_case, monkeypatch):
    root, _ = fineweb_case
    if not (root / "out" / "meta.json").exists():
        assert prepare_command.main(fineweb_args(root, "out", workers=2)) == 0
    with monkeypatch.context() as patch:
        interrupt_after(patch, 2)
        with pytest.raises(KeyboardInterrupt):
            prepare_command.main(fineweb_args(root, "resumed", workers=1))
    assert prepare_command.main(fineweb_args(root, "resumed", workers=1)) == 0
    assert directory_bytes(root / "resumed") == directory_bytes(root / "out")


def test_fineweb_hub_unreachable_offline_is_a_clear_error(tmp_path):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_DATASETS_CACHE": str(tmp_path / "hf-ds"),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "danastar",
            "prepare",
            "fineweb",
            "--out",
            str(tmp_path / "out"),
            "--tokenizer",
            "bytes",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "--data_files" in result.stderr and "Traceback" not in result.stderr


# --- command line and errors
# ------------------------------------------------------------------------


def test_help(capsys):
    assert prepare_command.main(["--help"]) == 0
    assert "--tokenizer" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["shakespeare", "--config", "sample-10BT"],
            "--config does not apply to the shakespeare source",
        ),
        (["fineweb", "--config", "sample-1T"], "unknown FineWeb config"),
        (["/no/such/corpus", "--out", "x"], "neither a known source"),
        (["some/folder"], "--out is required"),
        (
            ["shakespeare", "--tokenizer", "bytes", "--vocab_size", "512"],
            "--vocab_size only applies",
        ),
        (["shakespeare", "--val_fraction", "1.5"], "strictly between 0 and 1"),
        (["shakespeare", "--workers", "0", "--out", "x"], "--workers must be at least 1"),
    ],
)
def test_command_line_errors_are_one_sentence(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DANASTAR_DATA_DIR", str(tmp_path / "data"))
    assert cli.main(["prepare", *argv]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1


def test_empty_split_and_empty_folder(tmp_path):
    (tmp_path / "in").mkdir()
    with pytest.raises(UserError, match="no .txt/.jsonl/.parquet files"):
        prepare_source(str(tmp_path / "in"), tmp_path / "out", tokenizer="bytes", progress=False)
    (tmp_path / "in" / "only.txt").write_text("a single document")
    with pytest.raises(UserError, match="is one paragraph, so one document, which cannot fill"):
        prepare_source(str(tmp_path / "in"), tmp_path / "out", tokenizer="bytes", progress=False)
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_a_single_text_file_is_split_into_documents_at_blank_lines(tmp_path):
    paragraphs = [f"paragraph {i}, line one\nline two of {i}" for i in range(30)]
    book = tmp_path / "book.txt"
    book.write_text("\n\n".join(paragraphs) + "\n")
    # Before, one document: its train split took it all and the validation split stayed empty,
    # and the .prepare_state.json left behind refused the retry with another --val_fraction.
    with pytest.raises(UserError, match=r"--val_fraction 0.01 puts none of the 30 paragraphs of "
                                        r".* in the validation split; raise --val_fraction"):
        prepare_source(str(book), tmp_path / "out", tokenizer="bytes", progress=False)
    assert not (tmp_path / "out").exists()
    meta = prepare_source(str(book), tmp_path / "out", tokenizer="bytes", val_fraction=0.2,
                          progress=False)
    train, val = documents_in(tmp_path / "out", "train"), documents_in(tmp_path / "out", "val")
    assert sorted(train + val) == sorted(paragraphs) and train and val
    assert meta["train_documents"] + meta["val_documents"] == 30


def test_an_empty_split_found_while_tokenising_leaves_nothing_that_blocks_the_retry(tmp_path):
    (tmp_path / "in").mkdir()
    lines = [json.dumps({"text": f"document {i}"}) for i in range(20)]
    (tmp_path / "in" / "d.jsonl").write_text("\n".join(lines) + "\n")
    assert not any(in_validation(f"d.jsonl:{i}", 0.001, 0) for i in range(20))
    with pytest.raises(UserError, match=r"the val split .* is empty; .*were removed\)\.$"):
        prepare_source(str(tmp_path / "in"), tmp_path / "out", tokenizer="bytes",
                       val_fraction=0.001, progress=False)
    assert not (tmp_path / "out").exists()
    meta = prepare_source(str(tmp_path / "in"), tmp_path / "out", tokenizer="bytes",
                          val_fraction=0.3, progress=False)
    assert meta["train_documents"] + meta["val_documents"] == 20


def read_only_folder(tmp_path: Path) -> Path:
    """A folder that takes no new files: chmod for a user, a read-only file system for root."""
    if os.geteuid() != 0:
        (tmp_path / "locked").mkdir(mode=0o555)
        return tmp_path / "locked"
    locked = os.path.realpath("/proc/sys")
    if not os.path.isdir(locked) or os.access(locked, os.W_OK):
        pytest.skip("running as root and no read-only file system to write into")
    return Path(locked)


def test_a_cache_that_cannot_be_created_names_the_variable_and_the_fix(tmp_path, monkeypatch,
                                                                       capsys):
    # Before: NotADirectoryError / OSError(EROFS) tracebacks from mkdir.
    monkeypatch.delenv("DANASTAR_DATA_DIR", raising=False)
    a_file = tmp_path / "cache"
    a_file.write_text("kept")
    monkeypatch.setenv("DANASTAR_CACHE_DIR", str(a_file))
    assert cli.main(["prepare", "shakespeare"]) == 2
    assert capsys.readouterr().err == (
        f"danastar prepare: DANASTAR_CACHE_DIR={a_file} cannot hold danastar's cache ({a_file} "
        "is a file); set DANASTAR_CACHE_DIR to a writable folder.\n")
    assert a_file.read_text() == "kept"
    home = read_only_folder(tmp_path)
    monkeypatch.delenv("DANASTAR_CACHE_DIR")
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(UserError) as refused:
        ensure_prepared("shakespeare")
    assert str(refused.value).startswith(
        f"HOME={home} cannot hold danastar's cache ~/.cache/danastar ({home / '.cache'}")
    assert str(refused.value).endswith("; set DANASTAR_CACHE_DIR to a writable folder.")


def test_ensure_prepared_names_and_directories(tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("train.bin", "val.bin"):
        np.arange(1000, dtype=np.uint16).tofile(raw / name)
    assert ensure_prepared(raw) == raw
    with pytest.raises(UserError, match="holds no meta.json"):
        ensure_prepared(tmp_path)
    with pytest.raises(UserError, match="neither a prepared directory"):
        ensure_prepared("openwebtext")
    monkeypatch.setenv("DANASTAR_DATA_DIR", str(tmp_path / "data"))
    assert prepare.default_data_dir("shakespeare") == tmp_path / "data" / "shakespeare"
    monkeypatch.delenv("DANASTAR_DATA_DIR")
    monkeypatch.setenv("DANASTAR_CACHE_DIR", str(tmp_path / "cache"))
    assert prepare.default_data_dir("shakespeare") == tmp_path / "cache" / "data" / "shakespeare"


def test_a_vocabulary_beyond_uint16_is_stored_as_uint32(tmp_path):
    import base64

    from danastar.data.loader import TokenData

    # A tiktoken BPE file with every byte and every pair of bytes: 65,792 tokens + end-of-text.
    tokens = [bytes([b]) for b in range(256)] + [
        bytes([a, b]) for a in range(256) for b in range(256)
    ]
    (tmp_path / "wide.tiktoken").write_bytes(
        b"".join(base64.b64encode(t) + b" %d\n" % r for r, t in enumerate(tokens))
    )
    (tmp_path / "in").mkdir()
    for i in range(12):
        (tmp_path / "in" / f"{i}.txt").write_text(f"document {i}: ßpæcial ✓ " * 20)
    meta = prepare_source(
        str(tmp_path / "in"),
        tmp_path / "out",
        tokenizer=str(tmp_path / "wide.tiktoken"),
        val_fraction=0.3,
        workers=1,
        progress=False,
    )
    assert (meta["vocab_size"], meta["dtype"], meta["eot_id"]) == (65_793, "uint32", 65_792)
    data = TokenData.open(tmp_path / "out")
    assert data.dtype == np.uint32 and int(data.val.max()) == 65_792
    assert sorted(
        documents_in(tmp_path / "out", "train") + documents_in(tmp_path / "out", "val")
    ) == sorted(f"document {i}: ßpæcial ✓ " * 20 for i in range(12))


def test_a_named_source_prepared_into_its_default_directory_is_found_by_name(tmp_path, monkeypatch):
    # `danastar prepare fineweb` (no --out) then `danastar train --dataset fineweb`.
    monkeypatch.setenv("DANASTAR_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(UserError, match="run `danastar prepare fineweb`"):
        ensure_prepared("fineweb")
    default = prepare.default_data_dir("fineweb")
    default.mkdir(parents=True)
    for name in ("train.bin", "val.bin"):
        np.arange(1000, dtype=np.uint16).tofile(default / name)
    assert ensure_prepared("fineweb") == default
