"""Periodic and final validation losses are comparable: the periodic sample is spread evenly over
the validation stream, so on a stream whose difficulty drifts along it (as real validation text
does: documents in order) it estimates the loss of the whole stream, where a prefix does not."""

import contextlib

import numpy as np
import torch

from danastar.config import BatchLayout
from danastar.data.loader import TokenData, TrainLoader, spread_indices, validation_batches
from danastar.models import ModelConfig, build_model
from danastar.optim import build_optimizer
from danastar.train.data import TrainingData
from danastar.train.loop import evaluate
from danastar.train.parallel import Distributed

VOCAB, SEQ, BATCH = 64, 16, 8
SINGLE = Distributed("single", 0, 0, 1, torch.device("cpu"), 0, 1)


def drifting_data() -> TokenData:
    """Training text that counts (each token the previous one plus one, modulo the vocabulary,
    from random starts): learnt in a few dozen steps. A validation stream of 96 batches of the
    same text in which a growing share of the tokens (none at the start, all at the end) is
    replaced by uniform noise, so a trained model's loss rises steadily along the stream."""
    rng = np.random.default_rng(2)

    def counting(length: int) -> np.ndarray:
        starts = rng.integers(0, VOCAB, size=-(-length // 50))
        return ((starts[:, None] + np.arange(50)[None, :]) % VOCAB).reshape(-1)[:length]

    val_len = 96 * BATCH * SEQ + 1
    val = counting(val_len)
    noisy = rng.random(val_len) < np.linspace(0.0, 1.0, val_len)
    val[noisy] = rng.integers(0, VOCAB, size=int(noisy.sum()))
    meta = {"format": "synthetic", "tokenizer": "synthetic-counting", "vocab_size": VOCAB,
            "dtype": "uint16"}
    return TokenData([counting(20_000).astype(np.uint16)], val.astype(np.uint16), meta)


def trained_model(tokens: TokenData) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="enoki", n_layer=1, n_head=2, n_embd=32, head_dim=16,
                                    mlp_hidden=64, vocab_size=VOCAB, max_seq_len=SEQ))
    optimizer = build_optimizer("adamw", model.param_groups(0.0), lr=3e-3)
    loader = TrainLoader(tokens, seq_len=SEQ, micro_batch_size=16, acc_steps=1, seed=0)
    for step in range(60):
        inputs, targets = loader.get(step, 0)
        model(inputs, targets)[0].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    loader.close()
    return model


def test_spread_indices_cover_the_stream_evenly():
    assert spread_indices(123, 8) == [7, 23, 38, 53, 69, 84, 99, 115]
    assert spread_indices(5, 8) == [0, 1, 2, 3, 4]  # fewer batches than asked: all of them
    assert spread_indices(96, 96) == list(range(96))
    chosen = spread_indices(1000, 32)
    assert len(set(chosen)) == 32 and chosen == sorted(chosen)
    gaps = np.diff(chosen)
    assert gaps.min() >= 31 and gaps.max() <= 32  # equal parts, one batch from the middle of each


def test_periodic_sample_agrees_with_the_whole_stream():
    tokens = drifting_data()
    model = trained_model(tokens)
    layout = BatchLayout(1, 1, BATCH, BATCH, 1, SEQ)
    data = TrainingData(tokens, None, layout, SINGLE)
    no_autocast = contextlib.nullcontext()

    periodic = evaluate(model, data.validation_batches(8), no_autocast)
    larger = evaluate(model, data.validation_batches(32), no_autocast)
    whole = evaluate(model, data.validation_batches(None), no_autocast)
    prefix = evaluate(model, validation_batches(tokens, seq_len=SEQ, batch_size=BATCH,
                                                num_batches=8), no_autocast)
    per_batch = np.array([evaluate(model, [batch], no_autocast) for batch in
                          validation_batches(tokens, seq_len=SEQ, batch_size=BATCH)])

    # Tolerance: an even sample has no bias from a smooth trend (the middle of each part); what is
    # left is the batches' own noise. That noise is estimated from neighbouring batches (their
    # differences cancel the trend): sigma = std(diff) / sqrt(2); 8 batches: 3 sigma / sqrt(8).
    sigma = np.std(np.diff(per_batch)) / np.sqrt(2)
    trend = per_batch[-12:].mean() - per_batch[:12].mean()
    assert trend > 10 * sigma  # the stream really drifts, far beyond the noise
    assert abs(whole - per_batch.mean()) < 1e-5  # equal batches: the mean of the batch means
    assert abs(periodic - whole) < 3 * sigma / np.sqrt(8)
    assert abs(larger - whole) < 3 * sigma / np.sqrt(32)
    # What evaluating on the first batches did: far off the whole stream's loss.
    assert whole - prefix > 5 * 3 * sigma / np.sqrt(8)


def test_validation_batches_are_fixed():
    """The same batches at every evaluation (and so after a resume): nothing random per call."""
    tokens = drifting_data()
    layout = BatchLayout(1, 1, BATCH, BATCH, 1, SEQ)
    first = list(TrainingData(tokens, None, layout, SINGLE).validation_batches(8))
    again = TrainingData(tokens, None, layout, SINGLE)
    for _ in range(2):
        for (x1, y1), (x2, y2) in zip(first, again.validation_batches(8), strict=True):
            assert torch.equal(x1, x2) and torch.equal(y1, y2)
    every = validation_batches(tokens, seq_len=SEQ, batch_size=BATCH)
    for (x1, y1), index in zip(first, spread_indices(96, 8), strict=True):
        assert torch.equal(x1, every[index][0]) and torch.equal(y1, every[index][1])
