import json
from pathlib import Path

import numpy as np
import pytest
import torch

from danastar.data.loader import TokenData, TrainLoader, validation_batches
from danastar.errors import UserError


def positional_data(lengths: list[int], val_tokens: int = 1000) -> TokenData:
    """Shards whose token at position i of shard s is s*1_000_000 + i, so a window tells where it
    came from."""
    shards = [
        np.arange(s * 1_000_000, s * 1_000_000 + n, dtype=np.uint32) for s, n in enumerate(lengths)
    ]
    val = np.arange(9_000_000, 9_000_000 + val_tokens, dtype=np.uint32)
    meta = {"tokenizer": "test", "vocab_size": 10_000_000, "dtype": "uint32"}
    return TokenData(shards, val, meta)


def all_windows(loader: TrainLoader, steps: range) -> list[tuple[int, int]]:
    return [w for step in steps for m in range(loader.acc_steps) for w in loader.windows(step, m)]


# --- opening prepared data ------------------------------------------------------------------------


def test_open_prepared_shakespeare(shakespeare_dir, shakespeare_texts):
    data = TokenData.open(shakespeare_dir)
    assert (data.vocab_size, data.dtype, data.meta["tokenizer"]) == (4096, np.uint16, "bpe-4096")
    assert (data.train_tokens, data.val_tokens) == (
        data.meta["train_tokens"],
        data.meta["val_tokens"],
    )
    assert isinstance(data.train_shards[0], np.memmap)
    tok = data.tokenizer()
    assert tok.name == "bpe-4096" and tok.vocab_size == 4096
    first_val_document = shakespeare_texts[data.meta["source"]["split"]["val_documents"][0]]
    assert first_val_document.startswith(tok.decode(data.val[:300].tolist()))


def test_open_the_original_release_raw_files(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 50257, size=5000).astype(np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    tokens[:700].tofile(tmp_path / "val.bin")
    data = TokenData.open(tmp_path)
    assert (data.vocab_size, data.dtype, data.meta["tokenizer"]) == (50257, np.uint16, "gpt2")
    assert (data.train_tokens, data.val_tokens) == (5000, 700)
    assert np.array_equal(data.train_shards[0], tokens)


def write_prepared(
    directory: Path, shards: list[int], val: int, vocab_size: int = 1000, dtype: str = "uint16"
) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    meta = {
        "tokenizer": "bytes",
        "vocab_size": vocab_size,
        "dtype": dtype,
        "train_files": [],
        "val_files": [],
    }
    for split, lengths in (("train", shards), ("val", [val])):
        for i, n in enumerate(lengths):
            np.arange(n, dtype=dtype).tofile(directory / f"{split}_{i:05d}.bin")
            meta[f"{split}_files"].append({"file": f"{split}_{i:05d}.bin", "tokens": n})
        meta[f"{split}_tokens"] = sum(lengths)
    (directory / "meta.json").write_text(json.dumps(meta))
    return meta


def test_open_multi_shard_with_meta(tmp_path):
    write_prepared(tmp_path, [300, 500, 200], val=50)
    data = TokenData.open(tmp_path / "meta.json")
    assert [len(s) for s in data.train_shards] == [300, 500, 200] and data.val_tokens == 50
    assert data.tokenizer().name == "bytes"


def broken(tmp_path: Path, change) -> Path:
    directory = tmp_path / "data"
    meta = write_prepared(directory, [300, 500], val=50)
    change(directory, meta)
    (directory / "meta.json").write_text(json.dumps(meta))
    return directory


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d, m: (d / "train_00001.bin").unlink(), "train_00001.bin is missing"),
        (lambda d, m: (d / "val_00000.bin").write_bytes(b""), "val_00000.bin is empty"),
        (
            lambda d, m: (d / "train_00000.bin").write_bytes(b"\0" * 601),
            "not a whole number of uint16 tokens",
        ),
        (lambda d, m: m.update(vocab_size=70_000), "does not fit the uint16 token files"),
        (lambda d, m: m.update(dtype="int8"), "is not uint16 or uint32"),
        (
            lambda d, m: m["train_files"][0].update(tokens=299),
            "says train_00000.bin holds 299 tokens but it holds 300",
        ),
        (lambda d, m: m.update(train_tokens=801), "says 801 train tokens but the files hold 800"),
        (lambda d, m: m.pop("vocab_size"), "lacks vocab_size"),
        (lambda d, m: m.update(val_files=[]), "the val split .* is empty"),
    ],
)
def test_open_errors_name_the_problem(tmp_path, change, message):
    with pytest.raises(UserError, match=message):
        TokenData.open(broken(tmp_path, change))


def test_open_missing_or_unprepared_directory(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        TokenData.open(tmp_path / "absent")
    with pytest.raises(UserError, match="neither meta.json nor train.bin"):
        TokenData.open(tmp_path)
    (tmp_path / "train.bin").write_bytes(b"\0\0" * 10)
    with pytest.raises(UserError, match="val.bin is missing"):
        TokenData.open(tmp_path)
    (tmp_path / "meta.json").write_text("{oops")
    with pytest.raises(UserError, match="not valid JSON"):
        TokenData.open(tmp_path)


def test_tokenizer_is_none_when_it_cannot_load(tmp_path):
    write_prepared(tmp_path, [300], val=50)
    meta = json.loads((tmp_path / "meta.json").read_text())
    meta.update(
        tokenizer="no-such-tokenizer", tokenizer_file="tokenizer.json"
    )  # the file is not there
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    assert TokenData.open(tmp_path).tokenizer() is None


# --- the sampler ----------------------------------------------------------------------------------


def test_batches_are_a_pure_function_of_position():
    data = TokenData.synthetic(512, 50_000, seed=3)
    layout = dict(seq_len=32, micro_batch_size=4, acc_steps=3, world_size=2, rank=1, seed=7)
    sequential, scattered = TrainLoader(data, **layout), TrainLoader(data, **layout, prefetch=False)
    batches = {(s, m): sequential.get(s, m) for s in range(6) for m in range(3)}
    for key in [(5, 2), (0, 0), (3, 1), (3, 1), (1, 2)]:
        x, y = scattered.get(*key)
        assert torch.equal(x, batches[key][0]) and torch.equal(y, batches[key][1])
        assert x.dtype == torch.int64 and x.shape == (4, 32)
    other_seed = TrainLoader(data, **{**layout, "seed": 8})
    assert not torch.equal(other_seed.get(0, 0)[0], batches[(0, 0)][0])
    sequential.close()


def test_targets_are_the_next_tokens_and_windows_stay_in_their_shard():
    data = positional_data([1000, 333, 2500, 70])
    loader = TrainLoader(data, seq_len=16, micro_batch_size=8, acc_steps=2, prefetch=False)
    for step in range(40):  # several epochs
        for m in range(2):
            x, y = loader.get(step, m)
            assert torch.equal(x[:, 1:], y[:, :-1])
            rows = torch.cat([x, y[:, -1:]], dim=1)
            assert torch.equal(
                rows[:, 1:] - rows[:, :-1], torch.ones(8, 16, dtype=torch.int64)
            )  # contiguous
            shard = rows // 1_000_000
            assert torch.equal(shard, shard[:, :1].expand_as(shard))  # never straddles shards


def test_an_epoch_visits_every_window_once_at_its_offset():
    data = positional_data([1000, 333, 2500])
    seq = 16
    loader = TrainLoader(
        data, seq_len=seq, micro_batch_size=5, acc_steps=1, seed=11, prefetch=False
    )
    for epoch in range(3):
        offset, _, permutation = loader._epoch(epoch)
        start = sum(len(loader._epoch(e)[2]) for e in range(epoch))  # the epoch's first position
        windows = []
        for position in range(start, start + len(permutation)):
            step, slot = divmod(position, 5)
            windows.append(loader.windows(step, 0)[slot])
        expected = {
            (s, offset + k * (seq + 1))
            for s, n in enumerate([1000, 333, 2500])
            for k in range((n - offset) // (seq + 1))
        }
        assert len(windows) == len(set(windows)) == len(expected) and set(windows) == expected
        assert 0 <= offset < seq
    assert len({loader._epoch(e)[0] for e in range(6)}) > 1  # the offset changes between epochs


def test_ranks_never_overlap_and_the_step_does_not_depend_on_the_topology():
    data = TokenData.synthetic(512, 80_000, seed=1)
    one = TrainLoader(
        data, seq_len=24, micro_batch_size=8, acc_steps=2, world_size=1, prefetch=False
    )
    two = [
        TrainLoader(
            data, seq_len=24, micro_batch_size=4, acc_steps=2, rank=r, world_size=2, prefetch=False
        )
        for r in (0, 1)
    ]
    four = [
        TrainLoader(
            data, seq_len=24, micro_batch_size=2, acc_steps=2, rank=r, world_size=4, prefetch=False
        )
        for r in range(4)
    ]
    for step in range(12):  # crosses an epoch boundary
        reference = sorted(all_windows(one, range(step, step + 1)))
        for topology in (two, four):
            per_rank = [all_windows(loader, range(step, step + 1)) for loader in topology]
            assert sorted(sum(per_rank, [])) == reference
            assert len(set(sum(per_rank, []))) == len(reference)  # no window on two ranks
        x_one = torch.cat([one.get(step, m)[0] for m in range(2)])
        x_two = torch.cat([two[r].get(step, m)[0] for m in range(2) for r in range(2)])
        assert torch.equal(x_one, x_two)  # the same sequences in the same order of the stream


def test_resuming_at_a_step_gives_the_same_batches():
    data = TokenData.synthetic(512, 30_000, seed=2)
    layout = dict(seq_len=20, micro_batch_size=3, acc_steps=2, seed=5)
    through = TrainLoader(data, **layout)
    expected = [through.get(s, m) for s in range(10) for m in range(2)]
    assert through.state_dict() == {"step": 10}
    first = TrainLoader(data, **layout)
    for s in range(4):
        for m in range(2):
            first.get(s, m)
    state = first.state_dict()
    assert state == {"step": 4}
    resumed = TrainLoader(data, **layout)
    resumed.load_state_dict(state)
    got = [resumed.get(s, m) for s in range(state["step"], 10) for m in range(2)]
    for (x, y), (ex, ey) in zip(got, expected[8:]):
        assert torch.equal(x, ex) and torch.equal(y, ey)
    for loader in (through, first, resumed):
        loader.close()


def test_loader_errors():
    data = positional_data([100, 60])
    with pytest.raises(UserError, match="too short for sequence length 64"):
        TrainLoader(data, seq_len=64, micro_batch_size=1, acc_steps=1)
    TrainLoader(data, seq_len=50, micro_batch_size=1, acc_steps=1, prefetch=False).get(
        7
    )  # 2*seq_len tokens suffice
    with pytest.raises(UserError, match="invalid batch layout"):
        TrainLoader(data, seq_len=8, micro_batch_size=1, acc_steps=1, rank=2, world_size=2)


# --- validation batches ---------------------------------------------------------------------------


def test_validation_batches_are_fixed_and_shared_across_ranks():
    data = positional_data([1000], val_tokens=1000)
    whole = validation_batches(data, seq_len=10, batch_size=8)
    assert len(whole) == 999 // 10 // 8 == 12
    x, y = whole[1]
    assert x.shape == (8, 10) and torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(
        x[:, 0] - 9_000_000, torch.arange(80, 160, 10)
    )  # stride seq_len from the start
    assert all(
        torch.equal(a[0], b[0])
        for a, b in zip(whole, validation_batches(data, seq_len=10, batch_size=8))
    )
    shares = [
        validation_batches(data, seq_len=10, batch_size=8, rank=r, world_size=2) for r in (0, 1)
    ]
    assert len(shares[0]) == len(shares[1]) == 12
    for i, (x, y) in enumerate(whole):
        assert torch.equal(torch.cat([shares[0][i][0], shares[1][i][0]]), x)
        assert torch.equal(torch.cat([shares[0][i][1], shares[1][i][1]]), y)
    assert len(validation_batches(data, seq_len=10, batch_size=8, num_batches=3)) == 3
    assert len(validation_batches(data, seq_len=10, batch_size=8, num_batches=100)) == 12


def test_validation_errors():
    data = positional_data([1000], val_tokens=100)
    with pytest.raises(UserError, match="not divisible by the 3 processes"):
        validation_batches(data, seq_len=10, batch_size=8, world_size=3)
    with pytest.raises(UserError, match="shorter than one batch"):
        validation_batches(data, seq_len=10, batch_size=16)


# --- the synthetic source -------------------------------------------------------------------------


def conditional_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Empirical H(next | previous) in nats."""
    pairs = np.bincount(
        tokens[:-1].astype(np.int64) * vocab_size + tokens[1:], minlength=vocab_size**2
    ).reshape(vocab_size, vocab_size)
    joint = pairs / pairs.sum()
    previous = joint.sum(axis=1, keepdims=True)
    nonzero = joint > 0
    return float(
        -(joint[nonzero] * np.log((joint / np.where(previous > 0, previous, 1))[nonzero])).sum()
    )


def test_synthetic_sources():
    markov = TokenData.synthetic(64, 200_000, seed=0)
    assert (
        markov.train_tokens == 200_000 and markov.val_tokens == 20_000 and markov.dtype == np.uint16
    )
    assert np.array_equal(
        markov.train_shards[0], TokenData.synthetic(64, 200_000, seed=0).train_shards[0]
    )
    assert not np.array_equal(
        markov.train_shards[0], TokenData.synthetic(64, 200_000, seed=1).train_shards[0]
    )
    uniform = TokenData.synthetic(64, 200_000, kind="uniform")
    assert uniform.train_shards[0].max() < 64
    # The Markov source is learnable: knowing the previous token removes much of the uncertainty.
    assert (
        conditional_entropy(markov.train_shards[0], 64)
        < 0.8 * np.log(64)
        < conditional_entropy(uniform.train_shards[0], 64)
    )
    assert TokenData.synthetic(70_000, 1000).dtype == np.uint32
    with pytest.raises(UserError, match="unknown synthetic source"):
        TokenData.synthetic(64, 100, kind="zipf")
    with TrainLoader(markov, seq_len=64, micro_batch_size=2, acc_steps=1) as loader:
        assert loader.get(0)[0].max() < 64
