"""Token data (memory-mapped files or a synthetic source), the train sampler and validation batches.

The train sampler is the paper's: in epoch e the train tokens are cut into non-overlapping windows
of seq_len + 1 tokens starting at a random offset in [0, seq_len), and the windows are visited in a
random order; both are drawn from a generator seeded with `seed + e`. The windows of all epochs
form one stream; step s takes the G = micro_batch_size * acc_steps * world_size windows at
positions [s*G, (s+1)*G) of it, and (micro-step m, rank r) takes the B = micro_batch_size windows
at [(m*world_size + r)*B, +B) of those. A batch is therefore a pure function of (seed, step,
micro-step, rank, world): resuming needs only the step, and the sequences of a step are the same
whatever the number of processes that share it.
"""

from __future__ import annotations

import bisect
import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from danastar.data.prepared import (
    META_FILE,
    RAW_META,
    check_contents,
    meta_is_complete,
    prepared_format,
    repair_command,
)
from danastar.data.tokenizers import Tokenizer, load_tokenizer, token_dtype
from danastar.errors import UserError

REQUIRED_META_KEYS = (
    "tokenizer",
    "vocab_size",
    "dtype",
    "train_files",
    "val_files",
    "train_tokens",
    "val_tokens",
)


class TokenData:
    """Train shards and the validation stream as 1-D integer arrays, with their `meta`."""

    def __init__(
        self, train_shards: list[np.ndarray], val: np.ndarray, meta: dict, path: Path | None = None
    ):
        self.train_shards = train_shards
        self.val = val
        self.meta = meta
        self.path = path

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.meta["dtype"])

    @property
    def train_tokens(self) -> int:
        return sum(len(shard) for shard in self.train_shards)

    @property
    def val_tokens(self) -> int:
        return len(self.val)

    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer the data was made with (its file beside the data, else its name); None
        when it cannot be loaded (e.g. a tiktoken vocabulary that is not cached offline)."""
        candidates = []
        if self.path is not None and self.meta.get("tokenizer_file"):
            candidates.append(str(self.path / self.meta["tokenizer_file"]))
        candidates.append(self.meta["tokenizer"])
        for spec in candidates:
            try:
                tok = load_tokenizer(spec)
            except UserError:
                continue
            tok.name = self.meta["tokenizer"]
            return tok
        return None

    def __repr__(self) -> str:
        return (
            f"TokenData({self.path or 'in memory'}: {self.train_tokens:,} train tokens in "
            f"{len(self.train_shards)} shard(s), {self.val_tokens:,} validation tokens, "
            f"vocabulary {self.vocab_size:,}, {self.dtype})"
        )

    @classmethod
    def open(cls, path: str | Path) -> TokenData:
        """A prepared directory (with `meta.json`), or the original release's raw
        `train.bin`/`val.bin` (uint16 GPT-2 tokens).

        Every file gets the size check; each file's content check (largest id against the
        vocabulary, and its checksum when `meta.json` records one) runs once and is cached
        (`danastar.data.prepared`). A problem is refused with the command that repairs it.
        """
        directory = _data_directory(path)
        meta, repair = _read_meta(directory)
        dtype = _check_dtype(meta, directory, repair)
        splits = _map_splits(directory, meta, dtype, repair)
        _count_tokens(directory, meta, splits, repair)
        _check_contents(directory, meta, dtype, repair)
        val = splits["val"][0] if len(splits["val"]) == 1 else np.concatenate(splits["val"])
        return cls(splits["train"], val, meta, directory)

    @classmethod
    def synthetic(
        cls, vocab_size: int, num_tokens: int, seed: int = 0, kind: str = "markov"
    ) -> TokenData:
        """In-memory tokens for smoke tests: `num_tokens` train tokens and a tenth as many
        validation tokens from the same source. `markov`: each token is drawn from a power law
        over a state-dependent ordering of the vocabulary (learnable, far from uniform);
        `uniform`: i.i.d."""
        if vocab_size < 2 or num_tokens < 1:
            raise UserError(
                f"a synthetic source needs vocab_size >= 2 and num_tokens >= 1 (got {vocab_size}, "
                f"{num_tokens})."
            )
        generators = {"markov": _markov_tokens, "uniform": _uniform_tokens}
        if kind not in generators:
            raise UserError(
                f"unknown synthetic source {kind!r}; choose one of {', '.join(generators)}."
            )
        val_tokens = max(num_tokens // 10, 2)
        tokens = generators[kind](vocab_size, num_tokens + val_tokens, np.random.default_rng(seed))
        dtype = token_dtype(vocab_size)
        tokens = tokens.astype(dtype)
        meta = {
            "format": "synthetic",
            "tokenizer": f"synthetic-{kind}",
            "vocab_size": vocab_size,
            "dtype": dtype,
            "seed": seed,
            "train_tokens": num_tokens,
            "val_tokens": val_tokens,
        }
        return cls([tokens[:num_tokens]], tokens[num_tokens:], meta)


def _data_directory(path: str | Path) -> Path:
    """The data directory `path` names (its `meta.json` names it too); refused when it does not
    exist."""
    directory = Path(path).expanduser()
    if directory.name == META_FILE:
        directory = directory.parent
    if not directory.is_dir():
        raise UserError(
            f"data directory {str(directory)!r} does not exist; prepare it with `danastar "
            "prepare SOURCE --out DIR`."
        )
    return directory


def _read_meta(directory: Path) -> tuple[dict, str]:
    """(meta, how to repair the directory) of prepared data (`meta.json`) or of the original
    release's raw `train.bin`/`val.bin`; a directory with neither is refused."""
    layout = prepared_format(directory)
    if layout == "meta":
        return _prepared_meta(directory)
    if layout == "raw":
        return _raw_meta()
    raise UserError(
        f"{str(directory)!r} has neither meta.json nor train.bin/val.bin; prepare it with "
        f"`danastar prepare SOURCE --out {directory}`."
    )


def _prepared_meta(directory: Path) -> tuple[dict, str]:
    """`meta.json`, refused unless it is what `danastar prepare` writes: valid JSON with the
    required keys, a token dtype that holds the vocabulary, and every token file described."""
    meta_path = directory / META_FILE
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(
            f"{meta_path} is not valid JSON ({error}); repair the directory with "
            f"{repair_command(directory, None)}."
        ) from None
    if not isinstance(meta, dict):
        meta = {}
    missing = [key for key in REQUIRED_META_KEYS if key not in meta]
    if missing:
        raise UserError(
            f"{meta_path} lacks {', '.join(missing)}; repair the directory with "
            f"{repair_command(directory, meta)}."
        )
    repair = f"repair it with {repair_command(directory, meta)}"
    _check_dtype(meta, directory, repair)
    if not meta_is_complete(meta):
        raise UserError(
            f"{meta_path} does not describe its token files as `danastar prepare` "
            f"writes them; {repair}."
        )
    return meta, repair


def _raw_meta() -> tuple[dict, str]:
    """What the original release's raw `train.bin`/`val.bin` hold, as a `meta.json` says it."""
    meta = dict(
        RAW_META,
        **{f"{split}_files": [{"file": f"{split}.bin"}] for split in ("train", "val")},
    )
    return meta, "restore the file or prepare the corpus with `danastar prepare`"


def _map_splits(directory: Path, meta: dict, dtype: np.dtype, repair: str
                ) -> dict[str, list[np.ndarray]]:
    """The token files of each split, memory-mapped once each passes its size checks."""
    meta_path = directory / META_FILE
    return {
        split: [
            _map_file(directory, entry, dtype, meta_path, repair)
            for entry in meta[f"{split}_files"]
        ]
        for split in ("train", "val")
    }


def _count_tokens(directory: Path, meta: dict, splits: dict[str, list[np.ndarray]],
                  repair: str) -> None:
    """Refuse an empty split, or one whose files hold another number of tokens than `meta`
    says; `meta` then records each split's count."""
    meta_path = directory / META_FILE
    for split, arrays in splits.items():
        total = sum(len(a) for a in arrays)
        if not arrays or total == 0:
            raise UserError(
                f"the {split} split in {directory} is empty; prepare the data again with more "
                "documents."
            )
        expected = meta.get(f"{split}_tokens", total)
        if expected != total:
            raise UserError(
                f"{meta_path} says {expected:,} {split} tokens but the files hold {total:,}; "
                f"{repair}."
            )
        meta[f"{split}_tokens"] = total


def _check_dtype(meta: dict, directory: Path, repair: str) -> np.dtype:
    if meta["dtype"] not in ("uint16", "uint32"):
        raise UserError(
            f"token dtype {meta['dtype']!r} in {directory} is not uint16 or uint32; {repair}."
        )
    if not isinstance(meta["vocab_size"], int) or meta["vocab_size"] < 1:
        raise UserError(
            f"vocabulary size {meta['vocab_size']!r} in {directory} is not a positive whole "
            f"number; {repair}."
        )
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")  # token files are little-endian
    if meta["vocab_size"] > np.iinfo(dtype).max + 1:
        raise UserError(
            f"vocabulary size {meta['vocab_size']:,} does not fit the {meta['dtype']} token files "
            f"in {directory}; prepare the data again (it will use uint32)."
        )
    return dtype


def _map_file(
    directory: Path, entry: dict, dtype: np.dtype, meta_path: Path, repair: str
) -> np.ndarray:
    path = directory / entry["file"]
    if not path.is_file():
        raise UserError(f"token file {path} is missing; {repair}.")
    size = path.stat().st_size
    if size == 0:
        raise UserError(f"token file {path} is empty; {repair}.")
    if size % dtype.itemsize:
        raise UserError(
            f"token file {path} ({size} bytes) is not a whole number of {dtype.name} tokens, "
            f"so it is truncated or meta.json has the wrong dtype; {repair}."
        )
    tokens = np.memmap(path, dtype=dtype, mode="r")
    if "tokens" in entry and entry["tokens"] != len(tokens):
        raise UserError(
            f"{meta_path} says {entry['file']} holds {entry['tokens']:,} tokens but it holds "
            f"{len(tokens):,}; {repair}."
        )
    if "bytes" in entry and entry["bytes"] != size:
        raise UserError(
            f"{meta_path} says {entry['file']} has {entry['bytes']:,} bytes but it has "
            f"{size:,}; {repair}."
        )
    return tokens


def _check_contents(directory: Path, meta: dict, dtype: np.dtype, repair: str) -> None:
    """The content check of every file (cached per file): its checksum when `meta.json` records
    one, and its largest id against the vocabulary the model is built with. An id beyond the
    vocabulary would otherwise fail deep inside the embedding (a device assert on CUDA)."""
    entries = [*meta["train_files"], *meta["val_files"]]
    records = check_contents(directory, entries, dtype)
    vocab_size = int(meta["vocab_size"])
    for entry in entries:
        record, path = records[entry["file"]], directory / entry["file"]
        if "sha256" in entry and record.get("sha256") != entry["sha256"]:
            raise UserError(
                f"token file {path} does not match its checksum in meta.json (it is damaged or "
                f"was altered); {repair}."
            )
        if record["max_id"] >= vocab_size:
            if meta.get("format") == "raw":
                fix = (
                    "raw train.bin/val.bin are read as GPT-2 tokens, so prepare this corpus "
                    "with `danastar prepare SOURCE --out DIR --tokenizer NAME` (its meta.json "
                    "then names the tokenizer) and pass DIR"
                )
            else:
                fix = f"the file and meta.json disagree, so {repair}"
            raise UserError(
                f"token file {path} holds token id {record['max_id']:,} but the model's "
                f"vocabulary has {vocab_size:,} ids (0 to {vocab_size - 1:,}); {fix}."
            )


def _uniform_tokens(vocab_size: int, count: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, vocab_size, size=count)


def _markov_tokens(
    vocab_size: int, count: int, rng: np.random.Generator, chains: int = 256, exponent: float = 1.2
) -> np.ndarray:
    """`chains` independent chains (each one a "document"), concatenated. From state s the next
    token is (base[s] + k) mod V with k ~ P(k) ∝ (k + 1)^-exponent: a power law over an ordering of
    the vocabulary that depends on the state."""
    weights = np.arange(1, vocab_size + 1, dtype=np.float64) ** -exponent
    base = rng.permutation(vocab_size)
    length = -(-count // chains)
    jumps = rng.choice(vocab_size, size=(length, chains), p=weights / weights.sum())
    tokens = np.empty((length, chains), dtype=np.int64)
    state = rng.integers(0, vocab_size, size=chains)
    for t in range(length):  # sequential in time, vectorised over chains
        state = (base[state] + jumps[t]) % vocab_size
        tokens[t] = state
    return tokens.T.reshape(-1)[:count]


class TrainLoader:
    """Batches of the paper's sampler (module doc); `get(step, micro_step)` → (x, y), int64 tensors
    of shape (micro_batch_size, seq_len) with y the next tokens of x.

    The next batch is prepared in a background thread while the caller computes; since every batch
    is a pure function of its position, prefetching never changes what is returned.
    """

    def __init__(
        self,
        data: TokenData,
        *,
        seq_len: int,
        micro_batch_size: int,
        acc_steps: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        device: str | torch.device = "cpu",
        prefetch: bool = True,
    ):
        if min(seq_len, micro_batch_size, acc_steps, world_size) < 1 or not 0 <= rank < world_size:
            raise UserError(
                f"invalid batch layout: seq_len={seq_len}, micro_batch_size={micro_batch_size}, "
                f"acc_steps={acc_steps}, rank={rank}, world_size={world_size}; all must be "
                "positive, rank < world_size."
            )
        self.data, self.seq_len, self.micro_batch_size, self.acc_steps = (
            data,
            seq_len,
            micro_batch_size,
            acc_steps,
        )
        self.rank, self.world_size, self.seed, self.device = (
            rank,
            world_size,
            seed,
            torch.device(device),
        )
        self.window = seq_len + 1
        self.global_batch = micro_batch_size * acc_steps * world_size
        self._lengths = np.array([len(shard) for shard in data.train_shards], dtype=np.int64)
        if self._windows_per_shard(offset=seq_len - 1).sum() == 0:
            raise UserError(
                f"the train data ({int(self._lengths.max()):,} tokens in its largest shard) is too "
                "short for "
                f"sequence length {seq_len} (at least {2 * seq_len} tokens are needed); lower the "
                "sequence length."
            )
        self._epoch_starts = [0]  # position of the first window of each epoch in the stream
        self._epoch_cache: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}
        self._epoch_lock = threading.Lock()
        self._next_step = 0
        self._pending: dict[tuple[int, int], Future] = {}
        self._executor = (
            ThreadPoolExecutor(1, thread_name_prefix="danastar-prefetch") if prefetch else None
        )

    # --- the sampler ------------------------------------------------------------------------

    def _windows_per_shard(self, offset: int) -> np.ndarray:
        return np.maximum((self._lengths - offset) // self.window, 0)

    def _epoch_offset(self, epoch: int) -> tuple[np.random.Generator, int]:
        rng = np.random.default_rng(self.seed + epoch)
        return rng, int(rng.integers(0, self.seq_len))

    def _epoch(self, epoch: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(offset, first window index of each shard, the epoch's permutation of its windows)."""
        with self._epoch_lock:
            if epoch not in self._epoch_cache:
                rng, offset = self._epoch_offset(epoch)
                counts = self._windows_per_shard(offset)
                if len(self._epoch_cache) >= 2:  # a batch rarely spans more than two epochs
                    self._epoch_cache.pop(min(self._epoch_cache))
                self._epoch_cache[epoch] = (
                    offset,
                    np.concatenate([[0], np.cumsum(counts)]),
                    rng.permutation(int(counts.sum())),
                )
            return self._epoch_cache[epoch]

    def _locate(self, position: int) -> tuple[int, int]:
        """(epoch, index within the epoch) of a position in the stream of windows."""
        with self._epoch_lock:
            while self._epoch_starts[-1] <= position:
                epoch = len(self._epoch_starts) - 1
                self._epoch_starts.append(
                    self._epoch_starts[-1]
                    + int(self._windows_per_shard(self._epoch_offset(epoch)[1]).sum())
                )
            epoch = bisect.bisect_right(self._epoch_starts, position) - 1
            return epoch, position - self._epoch_starts[epoch]

    def window_positions(self, step: int, micro_step: int) -> range:
        """Positions in the window stream of the batch of (step, micro_step) on this rank."""
        if not 0 <= micro_step < self.acc_steps or step < 0:
            raise ValueError(
                f"step {step} / micro-step {micro_step} out of range (acc_steps={self.acc_steps})"
            )
        first = (
            step * self.global_batch
            + (micro_step * self.world_size + self.rank) * self.micro_batch_size
        )
        return range(first, first + self.micro_batch_size)

    def windows(self, step: int, micro_step: int) -> list[tuple[int, int]]:
        """(shard, first token) of each sequence of the batch."""
        result = []
        for position in self.window_positions(step, micro_step):
            epoch, index = self._locate(position)
            offset, shard_starts, permutation = self._epoch(epoch)
            window = int(permutation[index])
            shard = int(np.searchsorted(shard_starts, window, side="right")) - 1
            result.append((shard, offset + (window - int(shard_starts[shard])) * self.window))
        return result

    def _load(self, step: int, micro_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.stack(
            [
                self.data.train_shards[s][start : start + self.window]
                for s, start in self.windows(step, micro_step)
            ]
        )
        tokens = torch.from_numpy(rows.astype(np.int64))
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        if self.device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        return x, y

    # --- the public interface ----------------------------------------------------------------

    def get(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        future = self._pending.pop((step, micro_step), None)
        self._pending.clear()  # anything else in flight is for a position no longer wanted
        x, y = future.result() if future is not None else self._load(step, micro_step)
        upcoming = (step, micro_step + 1) if micro_step + 1 < self.acc_steps else (step + 1, 0)
        self._next_step = upcoming[0]
        if self._executor is not None:
            self._pending[upcoming] = self._executor.submit(self._load, *upcoming)
        non_blocking = self.device.type == "cuda"
        return x.to(self.device, non_blocking=non_blocking), y.to(
            self.device, non_blocking=non_blocking
        )

    def state_dict(self) -> dict:
        """The whole state: the step whose batches come next."""
        return {"step": self._next_step}

    def load_state_dict(self, state: dict) -> None:
        self._next_step = int(state["step"])
        self._pending.clear()
        if self._executor is not None:
            self._pending[(self._next_step, 0)] = self._executor.submit(
                self._load, self._next_step, 0
            )

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def __enter__(self) -> TrainLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def validation_batches(
    data: TokenData,
    *,
    seq_len: int,
    batch_size: int,
    num_batches: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    spread: bool = False,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed validation batches: this rank's share of each.

    The validation stream is cut into consecutive windows at a stride of seq_len (so every token
    after the first is a target exactly once); global batch i holds windows [i*batch_size,
    (i+1)*batch_size), and rank r takes rows [r*b, (r+1)*b) of it, b = batch_size / world_size.
    Only whole batches are used (the ragged tail of the stream is dropped on every rank alike), so
    every rank runs the same number of forward passes and the plain mean of the batch losses is
    the mean over the evaluated tokens. num_batches=None: all whole batches; otherwise the first
    min(num_batches, available), or with `spread` as many batches spread evenly over the whole
    stream (see `spread_indices`), so that a sample of a stream whose difficulty drifts (documents
    in order) estimates the whole stream's loss.
    """
    if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size or seq_len < 1:
        raise UserError(
            f"invalid validation layout: seq_len={seq_len}, batch_size={batch_size}, rank={rank}, "
            f"world_size={world_size}."
        )
    if batch_size % world_size:
        raise UserError(
            f"the validation batch size {batch_size} is not divisible by the {world_size} "
            "processes; make it a multiple."
        )
    available = (data.val_tokens - 1) // seq_len // batch_size
    if available == 0:
        raise UserError(
            f"the validation set ({data.val_tokens:,} tokens) is shorter than one batch of "
            f"{batch_size} x {seq_len} "
            f"tokens; lower the validation batch size or the sequence length."
        )
    count = available if num_batches is None else min(num_batches, available)
    chosen = spread_indices(available, count) if spread else range(count)
    share = batch_size // world_size
    batches = []
    for batch in chosen:
        first = (batch * batch_size + rank * share) * seq_len
        rows = np.stack(
            [
                data.val[start : start + seq_len + 1]
                for start in range(first, first + share * seq_len, seq_len)
            ]
        )
        tokens = torch.from_numpy(rows.astype(np.int64))
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return batches


def spread_indices(available: int, count: int) -> list[int]:
    """`count` of `available` batch indices spread evenly: the middle batch of each of `count`
    equal parts of the stream (all of them when count >= available). Fixed, so every evaluation
    of a run (and of a resumed run) sees the same batches."""
    if count >= available:
        return list(range(available))
    return [(2 * part + 1) * available // (2 * count) for part in range(count)]
