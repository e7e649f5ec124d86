"""The run's tokenizer in Hugging Face form (``tokenizer.json`` and its configuration), so that
``AutoTokenizer.from_pretrained(EXPORT)`` encodes text to the ids the model was trained on.

* a ``tokenizer.json`` tokenizer (the trained BPE, any file given to ``prepare``): itself;
* ``bytes``: a byte-level BPE without merges whose token for byte b has id b, and
  ``<|endoftext|>`` at 256, so each UTF-8 byte is one id as in training;
* tiktoken encodings (``gpt2``, ``cl100k``...): converted by transformers' ``TikTokenConverter``
  from the vocabulary tiktoken has cached.

The end-of-text id is the tokenizer's ``eos_token`` (and the padding token: the models have
none of their own). Special-token text inside a document is read as danastar reads it: as plain
text for bytes and tiktoken, as the special token for a ``tokenizer.json``. A run whose
tokenizer cannot be written (the synthetic source has none; a tiktoken vocabulary that is not
cached) exports without one, and ``run_tokenizer`` says why.
"""

from __future__ import annotations

import base64
import json
import tempfile
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from danastar.data.loader import TokenData
from danastar.data.prepare import ensure_prepared
from danastar.data.tokenizers import (
    END_OF_TEXT,
    ByteTokenizer,
    HuggingFaceTokenizer,
    TiktokenTokenizer,
    Tokenizer,
)

TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # tokenizer_config.json's class: standard


def run_tokenizer(dataset: str | None) -> tuple[Tokenizer | None, str]:
    """The run's tokenizer, or None and the sentence that says why there is none."""
    if dataset is None or dataset == "synthetic":
        return None, ("the synthetic source has no tokenizer (its tokens are ids): the export "
                      "has none; give it token ids")
    data = TokenData.open(ensure_prepared(dataset))
    tokenizer = data.tokenizer()
    if tokenizer is None:
        name = data.meta.get("tokenizer", "?")
        return None, (f"the run's tokenizer {name!r} cannot be loaded here (a tiktoken "
                      "vocabulary that is not cached, or a tokenizer file that is gone): the "
                      "export has none; cache it (TIKTOKEN_CACHE_DIR) and export again")
    return tokenizer, ""


def hf_tokenizer(tokenizer: Tokenizer):
    """A ``tokenizers.Tokenizer`` that gives the same ids as ``tokenizer``."""
    if isinstance(tokenizer, HuggingFaceTokenizer):
        return tokenizer.tokenizer
    if isinstance(tokenizer, ByteTokenizer):
        return _byte_tokenizer()
    if isinstance(tokenizer, TiktokenTokenizer):
        return _from_tiktoken(tokenizer.encoding)
    raise TypeError(f"no Hugging Face form for {type(tokenizer).__name__}")


def _byte_tokenizer():
    # ByteLevel spells byte b as the printable character alphabet()[...]; bytes_to_unicode's
    # order is needed to give that character the id b
    vocab = {_byte_char(b): b for b in range(256)}
    tokenizer = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([END_OF_TEXT])
    assert tokenizer.token_to_id(END_OF_TEXT) == ByteTokenizer.eot_id
    return tokenizer


def _byte_char(byte: int) -> str:
    """GPT-2's printable character for ``byte`` (what ByteLevel pre-tokenisation emits)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    if byte in printable:
        return chr(byte)
    return chr(256 + sorted(set(range(256)) - set(printable)).index(byte))


def _from_tiktoken(encoding):
    # transformers: the export extra (danastar.export.hf says when it is missing)
    from transformers.convert_slow_tokenizer import TikTokenConverter  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as scratch:
        # the converter reads a .tiktoken file: base64 token and rank per line
        ranks = Path(scratch) / "vocab.tiktoken"
        ranks.write_bytes(b"".join(base64.b64encode(token) + b" " + str(rank).encode() + b"\n"
                                   for token, rank in sorted(encoding._mergeable_ranks.items(),
                                                             key=lambda item: item[1])))
        return TikTokenConverter(vocab_file=str(ranks), pattern=encoding._pat_str,
                                 extra_special_tokens=encoding._special_tokens).converted()


def write(tokenizer: Tokenizer, out: Path) -> list[str]:
    """Write ``tokenizer`` as ``tokenizer.json`` and its configuration into ``out``."""
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 (the export extra)

    converted = hf_tokenizer(tokenizer)
    eot = converted.id_to_token(tokenizer.eot_id)
    # danastar's byte and tiktoken tokenizers read "<|endoftext|>" inside a text as plain text
    # (the end-of-text id comes only between documents); tokenizer.json files match it
    ordinary = not isinstance(tokenizer, HuggingFaceTokenizer)
    fast = PreTrainedTokenizerFast(tokenizer_object=converted, eos_token=eot, pad_token=eot,
                                   split_special_tokens=ordinary)
    fast.save_pretrained(out)
    # transformers 5 names its own class (TokenizersBackend), which transformers 4 lacks; both
    # know PreTrainedTokenizerFast (5's alias of it): a standard class, so no code is run
    settings_path = out / "tokenizer_config.json"
    settings = json.loads(settings_path.read_text())
    settings["tokenizer_class"] = TOKENIZER_CLASS
    settings_path.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return sorted(p.name for p in out.iterdir() if "token" in p.name)
