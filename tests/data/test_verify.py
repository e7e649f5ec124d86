"""Trust in prepared data: damage is found and repaired by `danastar prepare`, ids beyond the
vocabulary are refused before training, and bad inputs to `prepare` get one sentence."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from danastar import cli
from danastar.data import prepare, prepared
from danastar.data.loader import TokenData
from danastar.data.prepare import ensure_prepared, prepare_source
from danastar.errors import UserError

WORDS = "the king and queen of denmark speak of love war and honour to thee my lord".split()


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    # The per-user cache of checked files goes where the test can see it (and not into ~/.cache).
    monkeypatch.setenv("DANASTAR_CACHE_DIR", str(tmp_path / "cache"))


def write_corpus(root: Path, files: int = 8) -> Path:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for i in range(files):
        (root / f"{i}.txt").write_text(" ".join(rng.choice(WORDS, size=300)) + "\n")
    return root


# Each input file its own shard, so a repair can be seen to rebuild one shard and keep the others.
OPTIONS = dict(tokenizer="bytes", val_fraction=0.3, shard_input_mb=1e-4, workers=1, progress=False)


def prepared_corpus(tmp_path: Path, **options) -> tuple[Path, Path, dict[str, bytes]]:
    source = write_corpus(tmp_path / "in")
    out = tmp_path / "out"
    prepare_source(str(source), out, **{**OPTIONS, **options})
    return source, out, files_of(out)


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def flip_bytes(path: Path, offset: int = 10, keep_time: bool = False) -> None:
    status = path.stat()
    content = bytearray(path.read_bytes())
    content[offset] ^= 0x7F  # stays below 256 in the low byte: a plausible token id, same size
    path.write_bytes(bytes(content))
    # A distinct modification time whatever the file system's resolution, or (bit rot, a copy
    # that keeps times) the same one.
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + (0 if keep_time else 10**9)))


def test_meta_records_size_checksum_and_largest_id(tmp_path):
    _, out, _ = prepared_corpus(tmp_path)
    meta = json.loads((out / "meta.json").read_text())
    command = meta["command"]
    assert command.startswith("danastar prepare /") and "--tokenizer bytes" in command
    assert len(meta["train_files"]) == 6 and len(meta["val_files"]) == 2
    for entry in [*meta["train_files"], *meta["val_files"]]:
        tokens = np.fromfile(out / entry["file"], dtype=np.uint16)
        assert entry["bytes"] == (out / entry["file"]).stat().st_size == 2 * entry["tokens"]
        assert entry["max_id"] == int(tokens.max()) == 256  # the end-of-text id of `bytes`
        scan = prepared.scan_tokens(out / entry["file"], "uint16", checksum=True)
        assert entry["sha256"] == scan["sha256"]
        assert entry["documents"] == int((tokens == 256).sum())


DAMAGE = {
    "truncated shard": (lambda d: (d / "train_00002.bin").write_bytes(b"\0" * 10), "train_00002"),
    "altered shard": (lambda d: flip_bytes(d / "train_00001.bin"), "train_00001"),
    "altered, same time": (lambda d: flip_bytes(d / "train_00004.bin", keep_time=True),
                           "train_00004"),
    "missing val": (lambda d: (d / "val_00006.bin").unlink(), "val_00006"),
    "corrupt meta.json": (lambda d: (d / "meta.json").write_text('{"vocab_'), None),
    "meta.json of the wrong shape": (lambda d: (d / "meta.json").write_text(json.dumps(
        {**json.loads((d / "meta.json").read_text()), "train_files": "?"})), None),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_prepare_repairs_damage_and_keeps_what_is_intact(tmp_path, damage, capsys):
    source, out, original = prepared_corpus(tmp_path)
    change, damaged_shard = DAMAGE[damage]
    change(out)
    assert prepare.damage(out)  # found, whatever the check cache says
    if damage != "altered, same time":  # the loader trusts its cache for an unchanged stamp
        with pytest.raises(UserError, match=r"repair|prepare"):
            TokenData.open(out)
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.bin")}
    prepare_source(str(source), out, **OPTIONS)
    assert "rebuilding" in capsys.readouterr().err or damage == "corrupt meta.json"
    repaired = files_of(out)
    if damage == "corrupt meta.json":
        assert repaired.pop("meta.json.corrupt") == b'{"vocab_'  # kept, not lost
    assert repaired == original  # byte for byte what the first preparation wrote
    assert not prepare.damage(out)
    if damaged_shard is not None:  # only the damaged file was written again
        rewritten = {n for n, t in before.items() if (out / n).stat().st_mtime_ns != t}
        assert rewritten <= {f"{damaged_shard}.bin"}
    TokenData.open(out)


def test_a_damaged_trained_tokenizer_is_trained_again(tmp_path):
    source, out, original = prepared_corpus(tmp_path, tokenizer="bpe", vocab_size=300)
    (out / "tokenizer.json").write_text("{}")
    assert "tokenizer.json" in prepare.damage(out)
    prepare_source(str(source), out, **{**OPTIONS, "tokenizer": "bpe", "vocab_size": 300})
    assert files_of(out) == original


def test_a_corrupt_state_file_starts_the_preparation_over(tmp_path, monkeypatch, capsys):
    source = write_corpus(tmp_path / "in")
    prepare_source(str(source), tmp_path / "whole", **OPTIONS)
    write_shard, calls = prepare._write_shard, []

    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt
        return write_shard(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(prepare, "_write_shard", dying)
        with pytest.raises(KeyboardInterrupt):
            prepare_source(str(source), tmp_path / "out", **OPTIONS)
    with pytest.raises(UserError, match=r"holds an unfinished preparation; run `danastar "
                       r"prepare .* --out .*` again to finish it"):
        ensure_prepared(tmp_path / "out")  # what training says when given this directory
    (tmp_path / "out" / prepare.STATE_FILE).write_text('{"request": {"sour')
    prepare_source(str(source), tmp_path / "out", **OPTIONS)
    assert "unreadable" in capsys.readouterr().err
    repaired = files_of(tmp_path / "out")
    assert repaired.pop(f"{prepare.STATE_FILE}.corrupt") == b'{"request": {"sour'
    assert repaired == files_of(tmp_path / "whole")


def test_a_meta_json_without_checksums_is_adopted_then_repaired(tmp_path):
    """A directory prepared before meta.json held checksums: prepare records them once; a later
    repair (no per-file document counts to keep shards by) rebuilds every shard."""
    source, out, original = prepared_corpus(tmp_path)
    meta = json.loads((out / "meta.json").read_text())
    for key in ("command", "tokenizer_sha256"):
        meta.pop(key)
    for entry in [*meta["train_files"], *meta["val_files"]]:
        for key in ("bytes", "sha256", "max_id", "documents"):
            entry.pop(key)
    (out / "meta.json").write_text(json.dumps(meta))
    TokenData.open(out)  # still loads (size and vocabulary checks only)
    prepare_source(str(source), out, **OPTIONS)
    adopted = json.loads((out / "meta.json").read_text())
    assert adopted["command"] == json.loads(original["meta.json"])["command"]
    assert [e["sha256"] for e in adopted["train_files"]] == [
        e["sha256"] for e in json.loads(original["meta.json"])["train_files"]]
    stamp = (out / "meta.json").stat().st_mtime_ns
    prepare_source(str(source), out, **OPTIONS)
    assert (out / "meta.json").stat().st_mtime_ns == stamp  # adopted once
    flip_bytes(out / "train_00003.bin")
    prepare_source(str(source), out, **OPTIONS)
    assert files_of(out) == original


def test_the_loaders_advice_is_a_command_that_repairs(tmp_path):
    """The refusal names a command; run as it is written, it repairs the directory."""
    _, out, original = prepared_corpus(tmp_path)
    flip_bytes(out / "val_00006.bin")
    with pytest.raises(UserError, match="does not match its checksum") as refused:
        TokenData.open(out)
    command = shlex.split(re.search(r"`([^`]*)`", str(refused.value)).group(1))
    assert command[:2] == ["danastar", "prepare"]
    result = subprocess.run([sys.executable, "-m", "danastar", *command[1:], "--no_progress"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "val_00006.bin does not match its checksum; rebuilding" in result.stderr
    assert files_of(out) == original
    TokenData.open(out)


def test_the_damaged_default_corpus_is_repaired_before_training(
    tmp_path, monkeypatch, shakespeare_dir, capsys
):
    """`ensure_prepared("shakespeare")`, what training calls, rebuilds a damaged default
    directory itself (here a copy of the session's prepared Shakespeare)."""
    monkeypatch.setenv("DANASTAR_DATA_DIR", str(tmp_path / "data"))
    default = prepare.default_data_dir("shakespeare")
    shutil.copytree(shakespeare_dir, default)
    original = files_of(default)
    assert ensure_prepared("shakespeare") == default and files_of(default) == original
    assert capsys.readouterr().err == ""  # intact: left alone
    flip_bytes(default / "val_00000.bin", offset=1000)
    assert ensure_prepared("shakespeare") == default
    assert "val_00000.bin does not match its checksum; rebuilding" in capsys.readouterr().err
    assert files_of(default) == original


@pytest.mark.parametrize("text", ['{"vocab_', "[]", '{"train_files": 3}'])
def test_a_corrupt_meta_json_is_refused_by_the_loader_and_the_dry_run(tmp_path, capsys, text):
    _, out, _ = prepared_corpus(tmp_path)
    (out / "meta.json").write_text(text)
    with pytest.raises(UserError, match=f"repair the directory with .*--out {out}"):
        TokenData.open(out)
    assert cli.main(["train", "--dataset", str(out), "--dry_run", "--no_wandb"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "meta.json" in error and f"--out {out}" in error


# --- the vocabulary check -------------------------------------------------------------------------


def test_ids_beyond_the_vocabulary_are_refused_naming_file_id_and_size(tmp_path):
    _, out, _ = prepared_corpus(tmp_path)
    meta = json.loads((out / "meta.json").read_text())
    meta["vocab_size"] = 200  # the bytes tokenizer's ids go up to 256
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError) as refused:
        TokenData.open(out)
    message = str(refused.value)
    assert "train_00000.bin holds token id 256 but the model's vocabulary has 200 ids" in message
    assert f"--out {out}" in message and message.count(". ") == 0
    assert "id 256, beyond the vocabulary 200" in prepare.damage(out)["train_00000.bin"]


def test_the_check_reads_each_file_once_and_again_when_it_changes(tmp_path, monkeypatch):
    tokens = np.random.default_rng(0).integers(0, 50257, size=5000).astype(np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    tokens[:700].tofile(tmp_path / "val.bin")
    scans = []
    scan = prepared.scan_tokens
    monkeypatch.setattr(prepared, "scan_tokens", lambda *a, **k: scans.append(a[0].name) or
                        scan(*a, **k))
    data = TokenData.open(tmp_path)  # the original release's raw files still load
    assert (data.vocab_size, data.train_tokens, data.val_tokens) == (50257, 5000, 700)
    assert sorted(scans) == ["train.bin", "val.bin"]
    TokenData.open(tmp_path)
    assert len(scans) == 2  # cached
    tokens[123] = 50257
    tokens.tofile(tmp_path / "train.bin")
    os.utime(tmp_path / "train.bin", ns=(0, 10**18))
    with pytest.raises(UserError, match="holds token id 50,257 but the model's vocabulary has "
                                        "50,257 ids .* raw train.bin/val.bin are read as GPT-2"):
        TokenData.open(tmp_path)
    assert scans[2:] == ["train.bin"]  # only the changed file was read again


def test_train_refuses_ids_beyond_the_vocabulary_before_the_first_step(tmp_path):
    data = tmp_path / "raw"
    data.mkdir()
    tokens = np.random.default_rng(0).integers(0, 50257, size=20_000).astype(np.uint16)
    tokens[777] = 60_000
    tokens.tofile(data / "train.bin")
    tokens[:3000].clip(0, 50_000).tofile(data / "val.bin")
    result = subprocess.run(
        [sys.executable, "-m", "danastar", "train", "--dataset", str(data), "--heads", "2",
         "--batch_size", "4", "--sequence_length", "32", "--iterations", "3", "--no_wandb",
         "--run_dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert f"{data / 'train.bin'} holds token id 60,000 but the model's vocabulary has 50,257" in (
        result.stderr)
    assert not (tmp_path / "run").exists()  # refused before anything was written


# --- bad inputs to `danastar prepare` ------------------------------------------------------------


def bad_input(tmp_path: Path, case: str) -> tuple[list[str], str]:
    """(argv, what the one sentence must say) of each bad input; files written under tmp_path."""
    good = write_corpus(tmp_path / "in", files=3)
    out = ["--out", str(tmp_path / "out"), "--tokenizer", "bytes", "--no_progress"]
    if case == "empty txt":
        (good / "empty.txt").write_text("")
        return [str(good), *out], f"{good / 'empty.txt'} is empty"
    if case == "blank txt":
        (good / "blank.txt").write_text("  \n\n")
        return [str(good), *out], f"{good / 'blank.txt'} is empty"
    if case == "binary txt":
        (good / "image.txt").write_bytes(bytes(range(256)) * 4)
        return [str(good), *out], f"{good / 'image.txt'} is not UTF-8 text"
    if case == "NUL txt":
        (good / "nul.txt").write_bytes(b"text\0\0\0more")
        return [str(good), *out], "holds NUL bytes"
    if case == "bad jsonl line":
        path = tmp_path / "docs.jsonl"
        path.write_text('{"text": "one"}\n{"text": "two"}\n{"text": "thr\n{"text": "four"}\n')
        return [str(path), *out], f"line 3 of {path} is not valid JSON"
    if case == "jsonl line without text":
        path = tmp_path / "docs.jsonl"
        path.write_text('{"text": "one"}\n\n{"body": "two"}\n')
        return [str(path), *out], f"{path}:3 has no string field 'text'"
    if case == "non-UTF-8 jsonl line":
        path = tmp_path / "docs.jsonl"
        path.write_bytes(b'{"text": "one"}\n{"text": "\xff\xfe"}\n')
        return [str(path), *out], f"line 2 of {path} is not UTF-8 text"
    if case == "corrupt parquet":
        (good / "rows.parquet").write_bytes(b"PAR1 not really")
        return [str(good), *out], "is not a readable parquet file"
    if case == "--out is a file":
        (tmp_path / "out").write_text("precious")
        return [str(good), *out], "is a file, not a directory"
    if case == "--out under a file":
        (tmp_path / "file").write_text("precious")
        return [str(good), "--out", str(tmp_path / "file" / "out"), "--tokenizer", "bytes"], (
            f"lies under {tmp_path / 'file'}, which is a file")
    raise AssertionError(case)


BAD_INPUTS = ["empty txt", "blank txt", "binary txt", "NUL txt", "bad jsonl line",
              "jsonl line without text", "non-UTF-8 jsonl line", "corrupt parquet",
              "--out is a file", "--out under a file"]


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_prepare_inputs_get_one_sentence_and_lose_nothing(tmp_path, capsys, case):
    argv, expected = bad_input(tmp_path, case)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert cli.main(["prepare", *argv]) == 2
    error = capsys.readouterr().err
    assert expected in error and error.count("\n") == 1 and "Traceback" not in error
    assert error.startswith("danastar prepare: ") and error.rstrip().endswith(".")
    for path, content in before.items():  # every input and output file is still there, intact
        assert path.read_bytes() == content
    assert not (tmp_path / "out" / "meta.json").exists()
