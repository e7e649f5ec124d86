"""Tiny real runs to export and evaluate: `danastar prepare` on a small local corpus (a trained
BPE of 300 ids, so the export has a tokenizer) and `danastar train` of each architecture."""

import random

import pytest

from export_helpers import ARCHS, TINY, WORDS, danastar


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A prepared directory: 40 documents of 300 words, a BPE of 300 ids trained on them."""
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    (root / "text").mkdir()
    for index in range(40):
        words = " ".join(rng.choice(WORDS) for _ in range(300))
        (root / "text" / f"doc{index:02d}.txt").write_text(words + ".\n")
    danastar("prepare", root / "text", "--tokenizer", "bpe", "--vocab_size", "300", "--out",
             root / "data", "--workers", "1", "--no_progress", "--val_fraction", "0.2")
    return root / "data"


@pytest.fixture(scope="session")
def runs(corpus, tmp_path_factory):
    """One three-step run of each architecture on the corpus: {arch: run directory}."""
    root = tmp_path_factory.mktemp("runs")
    made = {}
    for arch, args in ARCHS.items():
        made[arch] = root / arch
        danastar("train", "--dataset", corpus, *args, *TINY, "--run_dir", made[arch])
    return made
