"""Tokenising documents in parallel: batches of about a megabyte, encoded in order over a pool of
spawned worker processes (or in this process for one worker), with a progress bar."""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections.abc import Iterable, Iterator

import numpy as np

from danastar.data.tokenizers import Tokenizer, load_tokenizer
from danastar.errors import UserError
from danastar.progress import bar


def text_batches(
    texts: Iterable[str], max_chars: int = 1 << 20, max_documents: int = 1024
) -> Iterator[list[str]]:
    """Groups of documents of about a megabyte: large enough to amortise inter-process traffic,
    small enough that a corpus of a few long documents still spreads over all workers."""
    batch, size = [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= max_chars or len(batch) >= max_documents:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


# The tokenizer of this worker process (set by `init_worker`, read by `encode_documents`).
_worker_tokenizer: Tokenizer | None = None


def init_worker(spec: str, one_thread: bool = False) -> None:
    global _worker_tokenizer
    if one_thread:
        # One core per worker process: the Rust tokenizers' own thread pool would oversubscribe.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_tokenizer = load_tokenizer(spec)


def encode_documents(texts: list[str]) -> tuple[int, np.ndarray]:
    """(number of documents, their ids concatenated, each followed by the end-of-text id)."""
    tok = _worker_tokenizer
    pieces = []
    for ids in tok.encode_batch(texts):
        pieces.append(ids)
        pieces.append([tok.eot_id])
    return len(texts), np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int64)


class Tokenise:
    """Maps batches of documents to token arrays, in order, over a pool of worker processes.

    Workers are spawned (not forked): a process that has already run the Rust tokenizers'
    thread pool (BPE training) must not be forked. At most a few batches per worker are in flight,
    so memory stays bounded however large a shard is.
    """

    def __init__(self, spec: str, workers: int):
        self.spec, self.workers, self.pool = spec, workers, None

    def __enter__(self) -> Tokenise:
        if self.workers > 1:
            context = multiprocessing.get_context("spawn")
            self.pool = context.Pool(
                self.workers, initializer=init_worker, initargs=(self.spec, True)
            )
        else:
            init_worker(self.spec)
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()

    def __call__(self, batches: Iterator[list[str]]) -> Iterator[tuple[int, np.ndarray]]:
        if self.pool is None:
            yield from map(encode_documents, batches)
            return
        while window := list(itertools.islice(batches, 2 * self.workers)):
            yield from self.pool.imap(encode_documents, window)


def worker_count(workers: int | None) -> int:
    if workers is None:
        return (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1)
        )
    if workers < 1:
        raise UserError(f"--workers must be at least 1 (got {workers}).")
    return workers


def progress_bar(total: int | None, done: int, enabled: bool):
    """The documents tokenised, counted on standard error where it is a terminal."""
    return bar(total, initial=done, unit="doc", desc="tokenising", enabled=enabled)

