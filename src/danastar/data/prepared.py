"""How a prepared data directory is recognised: one answer for preparation, the loader and the
dry run."""

from __future__ import annotations

from pathlib import Path

META_FILE = "meta.json"  # ours: written last, so a directory holding it is complete
RAW_FILES = ("train.bin", "val.bin")  # the original release's GPT-2 token files
# What the original release's raw train.bin / val.bin hold.
RAW_META = {"format": "raw", "tokenizer": "gpt2", "vocab_size": 50257, "eot_id": 50256,
            "dtype": "uint16"}


def prepared_format(directory: Path) -> str | None:
    """"meta" for a directory with our `meta.json`, "raw" for the original release's
    `train.bin`/`val.bin` (a missing one is reported when it is opened), None otherwise."""
    if (directory / META_FILE).is_file():
        return "meta"
    if any((directory / name).is_file() for name in RAW_FILES):
        return "raw"
    return None
