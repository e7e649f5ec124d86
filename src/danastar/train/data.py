"""The data a run reads, as the loop needs it: train batches by (step, micro-step), fixed
validation batches (spread evenly over the validation stream), and the tokenizer for the closing
sample.

Composes `danastar.data`: the dataset is prepared on first use (`ensure_prepared`, safe when
every rank calls it), memory-mapped (`TokenData`), and sampled by `TrainLoader`, whose batch for
a step is a pure function of (seed, step, micro-step, data rank, data world). `--dataset
synthetic` is an in-memory power-law Markov source for smoke tests without any corpus.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Iterator, Optional

import torch

from danastar.config import BatchLayout, TrainConfig
from danastar.data.loader import TokenData, TrainLoader, validation_batches
from danastar.data.planned import SYNTHETIC_TRAIN_TOKENS, SYNTHETIC_VOCAB_SIZE
from danastar.data.prepare import AUTO_PREPARED, default_data_dir, ensure_prepared, is_prepared
from danastar.data.sources import SOURCES
from danastar.train.parallel import Distributed


def open_tokens(config: TrainConfig, prepare: bool = True) -> Optional[TokenData]:
    """The tokens a run reads: the synthetic source, or the prepared dataset (prepared first
    where training prepares it on first use). `prepare=False` prepares nothing and gives None
    for data not prepared yet (for checks that must write nothing)."""
    seed = config.train.seed if config.data.data_seed is None else config.data.data_seed
    dataset = config.data.dataset
    if dataset == "synthetic":
        return TokenData.synthetic(SYNTHETIC_VOCAB_SIZE, SYNTHETIC_TRAIN_TOKENS, seed=seed)
    if prepare:
        return TokenData.open(ensure_prepared(dataset))
    candidates = [Path(dataset).expanduser()]
    if dataset in SOURCES:
        candidates.append(default_data_dir(dataset))
    found = next((path for path in candidates if path.is_dir() and is_prepared(path)), None)
    return None if found is None else TokenData.open(found)


def check_prepared_here(dataset: str) -> None:
    """Refuse, with the sentence training says when it opens the data, a named source that is
    not prepared on this machine and that training does not prepare on first use (`fineweb`:
    the sentence names `danastar prepare fineweb`). A plan needs no data (`danastar submit`
    plans one for a cluster, whose data is its own); a run here does, so `danastar train` and
    `danastar sweep` refuse it before anything starts, and their dry runs after the plan."""
    if dataset in SOURCES and dataset not in AUTO_PREPARED:
        ensure_prepared(dataset)  # prepares nothing for such a source: finds it, or refuses


class TrainingData:
    def __init__(
        self, tokens: TokenData, loader: TrainLoader, layout: BatchLayout, env: Distributed
    ):
        self.tokens = tokens
        self.loader = loader
        self.layout = layout
        self.env = env
        self.device = env.device
        self.tokenizer = tokens.tokenizer() if tokens.path is not None else None
        self._periodic = lru_cache(maxsize=1)(self._load_validation)

    @classmethod
    def open(cls, config: TrainConfig, env: Distributed, layout: BatchLayout) -> "TrainingData":
        seed = config.train.seed if config.data.data_seed is None else config.data.data_seed
        tokens = open_tokens(config)
        loader = TrainLoader(
            tokens,
            seq_len=layout.sequence_length,
            micro_batch_size=layout.micro_batch_per_rank,
            acc_steps=layout.acc_steps,
            rank=env.data_rank,
            world_size=env.data_world,
            seed=seed,
            device=env.device,
        )
        return cls(tokens, loader, layout, env)

    @property
    def vocab_size(self) -> int:
        return self.tokens.vocab_size

    def train_batch(self, step: int, micro_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of this rank for (step, micro-step), on the device."""
        return self.loader.get(step, micro_step)

    def validation_batches(
        self, count: Optional[int]
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """`count` fixed validation batches spread evenly over the whole validation stream
        (None: all of it), this rank's rows of each, moved to the device one at a time.

        Spread, not the first `count`: a validation stream is documents in order, and its
        difficulty drifts along it (Shakespeare's first batches score ~0.45 higher than the
        whole), so a periodic evaluation on a prefix is not comparable with the final one on
        all of it; an even sample of the same stream is, within its sampling noise. The periodic
        set is kept in (host) memory; the whole set is not."""
        batches = self._periodic(count) if count is not None else self._load_validation(None)
        for inputs, targets in batches:
            yield (
                inputs.to(self.device, non_blocking=True),
                targets.to(self.device, non_blocking=True),
            )

    def _load_validation(self, count: Optional[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # The validation batch is the global micro-batch, so its rows do not depend on the world
        # size.
        batch_size = self.layout.micro_batch_per_rank * self.env.data_world
        return validation_batches(
            self.tokens,
            seq_len=self.layout.sequence_length,
            batch_size=batch_size,
            num_batches=count,
            rank=self.env.data_rank,
            world_size=self.env.data_world,
            spread=True,
        )

    @property
    def eot_id(self) -> int:
        return self.tokenizer.eot_id if self.tokenizer is not None else 0

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text) if self.tokenizer is not None else []

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, or the ids themselves when the data has no loadable tokenizer."""
        return self.tokenizer.decode(ids) if self.tokenizer is not None else " ".join(map(str, ids))

    def close(self) -> None:
        self.loader.close()
