"""What a plan assumes of a dataset before it is prepared, or reads of it once it is: its
vocabulary size and its training tokens, each with where the number comes from (the dry run says
it). The synthetic source's sizes live here too: it is never prepared, only generated."""

from __future__ import annotations

from pathlib import Path

from danastar.data import prepare, sources
from danastar.data.prepared import META_FILE, RAW_META, prepared_format, repair_command
from danastar.errors import UserError

SYNTHETIC_VOCAB_SIZE = 512
SYNTHETIC_TRAIN_TOKENS = 400_000


def planned_vocab_size(dataset: str) -> tuple[int, str]:
    """(vocabulary size, where it comes from) of a dataset, prepared or not."""
    gpt2_vocab_size = RAW_META["vocab_size"]  # what raw token files hold (FineWeb's tokenizer too)
    path = Path(dataset).expanduser()
    for directory in (path, prepare.default_data_dir(dataset)):
        layout = prepared_format(directory) if directory.is_dir() else None
        if layout == "meta":
            meta = prepare.read_meta(directory)
            if meta is None or not isinstance(meta.get("vocab_size"), int):
                if dataset in prepare.AUTO_PREPARED and directory != path:
                    continue  # training prepares this default directory again before it starts
                raise UserError(f"{directory / META_FILE} is unreadable; repair the directory "
                                f"with {repair_command(directory, meta)}.")
            return int(meta["vocab_size"]), f"{directory / META_FILE}"
        if layout == "raw":
            return gpt2_vocab_size, "raw GPT-2 train.bin/val.bin"
    if dataset == "synthetic":
        return SYNTHETIC_VOCAB_SIZE, "the synthetic source"
    if dataset in sources.SOURCES and dataset != "fineweb":
        return sources.Corpus.default_vocab_size, f"the BPE {dataset} is prepared with on first use"
    return gpt2_vocab_size, "GPT-2 (fineweb's tokenizer; assumed for data not prepared yet)"


def planned_train_tokens(dataset: str) -> tuple[int | None, str]:
    """(training tokens, where the number comes from) of a dataset, prepared or not; None where
    it is not known before the data is prepared."""
    if dataset == "synthetic":
        return SYNTHETIC_TRAIN_TOKENS, "the synthetic source"
    path = Path(dataset).expanduser()
    for directory in (path, prepare.default_data_dir(dataset)):
        layout = prepared_format(directory) if directory.is_dir() else None
        if layout == "meta":
            tokens = (prepare.read_meta(directory) or {}).get("train_tokens")
            if isinstance(tokens, int):
                return tokens, str(directory / META_FILE)
        elif layout == "raw" and (directory / "train.bin").is_file():
            train = directory / "train.bin"  # the original release's uint16 GPT-2 tokens
            return train.stat().st_size // 2, str(train)
    if dataset == "shakespeare":
        return sources.SHAKESPEARE_TRAIN_TOKENS, ("what `danastar prepare shakespeare` gives (not "
                                                  "prepared yet)")
    return None, f"{dataset} is not prepared yet"
