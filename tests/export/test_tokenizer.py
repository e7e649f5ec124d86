"""The run's tokenizer, written for `AutoTokenizer`: the same ids as danastar's tokenizer, the
end-of-text token as eos, and a sentence where a run has no tokenizer to write."""

import pytest

pytest.importorskip("transformers")
from transformers import AutoTokenizer  # noqa: E402

from danastar.data.tokenizers import (  # noqa: E402
    END_OF_TEXT,
    ByteTokenizer,
    TiktokenTokenizer,
    train_bpe,
)
from danastar.export.tokenizer import run_tokenizer, write  # noqa: E402

TEXTS = ["ROMEO: But soft, what light through yonder window breaks?",
         "Ünïcödé — 日本語, tabs\tand\nnew lines,   spaces; digits 12345 and <|endoftext|> text"]


def assert_same_ids(tokenizer, tmp_path):
    assert write(tokenizer, tmp_path) == ["tokenizer.json", "tokenizer_config.json"]
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert loaded(text)["input_ids"] == ids
        assert loaded.decode(ids) == tokenizer.decode(ids)
    assert loaded.eos_token_id == loaded.pad_token_id == tokenizer.eot_id
    assert loaded.bos_token_id is None


def test_bytes_become_one_id_per_utf8_byte(tmp_path):
    assert_same_ids(ByteTokenizer(), tmp_path)


def test_a_trained_bpe_is_written_as_itself(tmp_path):
    words = "the quick brown fox jumps over the lazy dog while the cat sleeps".split()
    corpus = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 5
    assert_same_ids(train_bpe(corpus, 300), tmp_path)


def test_a_tiktoken_encoding_is_converted(tmp_path):
    """A small tiktoken BPE made here (GPT-2's pattern, 256 bytes and a few merges) stands for
    gpt2 and cl100k, whose vocabularies this machine cannot download."""
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken_ext.openai_public import r50k_pat_str

    ranks = {bytes([b]): b for b in range(256)}
    for merge in (b"th", b"he", b"the", b" t", b" the", b"in", b"ing", b"er", b" w"):
        ranks[merge] = len(ranks)
    encoding = tiktoken.Encoding(name="tiny", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                                 special_tokens={END_OF_TEXT: len(ranks)})
    tokenizer = TiktokenTokenizer(encoding, "tiny")
    assert len(tokenizer.encode(" the thing")) < len(" the thing")  # the merges are used
    assert_same_ids(tokenizer, tmp_path)


def test_the_synthetic_source_has_no_tokenizer_and_says_so():
    tokenizer, why = run_tokenizer("synthetic")
    assert tokenizer is None and "synthetic source has no tokenizer" in why
