"""Tokenizers behind one small interface: `encode`, `decode`, `vocab_size`, `eot_id`, `name`.

`load_tokenizer(spec)` accepts
* `gpt2`, `cl100k` (and the other tiktoken encodings by their tiktoken name) — tiktoken
  downloads the vocabulary on first use and caches it in `$TIKTOKEN_CACHE_DIR`;
* a path or URL ending in `.tiktoken` — a tiktoken BPE file (base64 token, rank per line);
* `bytes` — UTF-8 bytes 0..255 plus an end-of-text id 256;
* a path to a Hugging Face `tokenizer.json` (or a directory holding one), such as the BPE that
  `train_bpe` makes for the Shakespeare corpus.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from importlib.metadata import version
from pathlib import Path

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tiktoken_ext.openai_public import r50k_pat_str
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from danastar.errors import UserError

END_OF_TEXT = "<|endoftext|>"

# End-of-document tokens of common tokenizer.json files, in the order they are looked for.
_EOT_CANDIDATES = (END_OF_TEXT, "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>", "[SEP]")


class Tokenizer:
    """The interface every tokenizer offers (subclasses fill in the four members)."""

    name: str
    vocab_size: int  # number of ids, specials included; ids are 0..vocab_size-1
    eot_id: int  # appended after every document
    library: str  # what implements it, with its version (recorded in meta.json)

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size}, "
                f"eot_id={self.eot_id})")


class TiktokenTokenizer(Tokenizer):
    """A tiktoken `Encoding`; special-token text inside documents is encoded as ordinary text."""

    def __init__(self, encoding, name: str):
        self.encoding = encoding
        self.name = name
        self.vocab_size = encoding.n_vocab
        self.eot_id = encoding.eot_token
        self.library = f"tiktoken {version('tiktoken')}"

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(texts, num_threads=1)

    def decode(self, ids: Iterable[int]) -> str:
        return self.encoding.decode(list(ids))


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255 and end-of-text 256; no vocabulary to download or train."""

    name = "bytes"
    vocab_size = 257
    eot_id = 256
    library = "danastar"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        # End-of-text ids are dropped; a sequence cut inside a character decodes to U+FFFD.
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HuggingFaceTokenizer(Tokenizer):
    """A Hugging Face `tokenizers.Tokenizer`, e.g. loaded from a `tokenizer.json` file."""

    def __init__(self, tokenizer, name: str):
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.library = f"tokenizers {version('tokenizers')}"
        eot = next(
            (
                tokenizer.token_to_id(t)
                for t in _EOT_CANDIDATES
                if tokenizer.token_to_id(t) is not None
            ),
            None,
        )
        if eot is None:
            raise UserError(
                f"tokenizer {name!r} has none of the end-of-text tokens "
                f"{', '.join(_EOT_CANDIDATES)}; "
                f"add {END_OF_TEXT!r} as a special token to it."
            )
        self.eot_id = eot

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def save(self, path: str | os.PathLike) -> None:
        self.tokenizer.save(str(path))


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    *,
    min_frequency: int = 2,
    name: str | None = None,
) -> HuggingFaceTokenizer:
    """Train a byte-level BPE (GPT-2 style pre-tokenisation) with Hugging Face `tokenizers`.

    Byte-level means every text round-trips exactly and no character is unknown. The result is
    deterministic for the same texts in the same order; id 0 is the end-of-text token.
    """
    if vocab_size < 257:
        raise UserError(
            f"a byte-level BPE needs a vocabulary of at least 257 (got {vocab_size}); raise "
            "--vocab_size."
        )
    tokenizer = HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return HuggingFaceTokenizer(tokenizer, name or f"bpe-{vocab_size}")


# Short names accepted for tiktoken encodings (any tiktoken encoding name works too).
_TIKTOKEN_ALIASES = {
    "gpt2": "gpt2",
    "cl100k": "cl100k_base",
    "o200k": "o200k_base",
    "r50k": "r50k_base",
}


def _tiktoken_by_name(spec: str) -> Tokenizer:
    encoding_name = _TIKTOKEN_ALIASES.get(spec, spec)
    try:
        encoding = tiktoken.get_encoding(encoding_name)
    except (OSError, ValueError) as error:  # no network (requests raises OSError), bad download
        cache = os.environ.get("TIKTOKEN_CACHE_DIR", "<unset>")
        raise UserError(
            f"cannot load the tiktoken vocabulary {encoding_name!r} (TIKTOKEN_CACHE_DIR={cache}; "
            f"{type(error).__name__}); "
            f"pre-cache it on a machine with internet with `TIKTOKEN_CACHE_DIR=DIR python -c "
            f"\"import tiktoken; tiktoken.get_encoding('{encoding_name}')\"`, copy DIR here and "
            "set TIKTOKEN_CACHE_DIR=DIR."
        ) from None
    return TiktokenTokenizer(encoding, spec)


def _tiktoken_file(spec: str) -> Tokenizer:
    """A `.tiktoken` BPE file (a path or URL; URLs are cached in `$TIKTOKEN_CACHE_DIR`)."""
    try:
        ranks = load_tiktoken_bpe(spec)
    except (OSError, ValueError) as error:
        raise UserError(
            f"cannot read the tiktoken BPE file {spec!r} ({type(error).__name__}: {error}); "
            "check the path, or pre-cache the URL in TIKTOKEN_CACHE_DIR on a machine with "
            "internet."
        ) from None
    # The end-of-text id follows the mergeable ranks, as in GPT-2.
    encoding = tiktoken.Encoding(
        name=Path(spec).stem,
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={END_OF_TEXT: len(ranks)},
    )
    return TiktokenTokenizer(encoding, spec)


def _tokenizer_json(spec: str) -> Tokenizer:
    path = Path(spec)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise UserError(
            f"tokenizer file {str(path)!r} does not exist; give an existing tokenizer.json path."
        )
    try:
        tokenizer = HFTokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception on malformed files
        raise UserError(
            f"cannot read tokenizer file {str(path)!r} ({error}); give a valid tokenizer.json."
        ) from None
    return HuggingFaceTokenizer(tokenizer, str(path))


_NAMED: dict[str, Callable[[str], Tokenizer]] = {"bytes": lambda spec: ByteTokenizer()}


def load_tokenizer(spec: str) -> Tokenizer:
    """Load a tokenizer by name (`gpt2`, `cl100k`, `bytes`, a tiktoken name) or file (see module
    doc)."""
    spec = str(spec)
    if spec in _NAMED:
        return _NAMED[spec](spec)
    if spec.endswith(".tiktoken"):
        return _tiktoken_file(spec)
    if spec.endswith(".json") or os.sep in spec or Path(spec).is_dir():
        return _tokenizer_json(spec)
    if spec in _TIKTOKEN_ALIASES or spec in tiktoken.list_encoding_names():
        return _tiktoken_by_name(spec)
    known = ", ".join([*_NAMED, *_TIKTOKEN_ALIASES])
    raise UserError(
        f"unknown tokenizer {spec!r}; use one of {known}, a tiktoken encoding name, or a "
        "tokenizer.json path."
    )


def token_dtype(vocab_size: int) -> str:
    """The narrowest unsigned integer type of the token files that holds every id."""
    return "uint16" if vocab_size <= 2**16 else "uint32"
