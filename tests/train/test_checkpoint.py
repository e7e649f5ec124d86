import json
import random

import numpy as np
import pytest
import torch

from danastar.train.checkpoint import (
    Checkpointer,
    gather_rng_states,
    rng_state,
    set_rng_state,
    verify,
)


def trained_pair(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).square().sum().backward()
    optimizer.step()
    return model, optimizer


def save_steps(checkpointer, steps, **kwargs):
    model, optimizer = trained_pair()
    for step in steps:
        checkpointer.save(
            step, model, optimizer, {"step": step, "rng": gather_rng_states()}, **kwargs
        )
    return model, optimizer


def test_round_trip_restores_model_optimizer_and_run_state(tmp_path):
    checkpointer = Checkpointer(tmp_path, sharded=False)
    model, optimizer = save_steps(checkpointer, [7])
    fresh_model, fresh_optimizer = trained_pair(seed=1)
    found = checkpointer.find_latest()
    assert (found.step, found.layout) == (7, "single")
    run_state = checkpointer.load(found, fresh_model, fresh_optimizer)
    assert run_state["step"] == 7
    for a, b in zip(model.state_dict().values(), fresh_model.state_dict().values()):
        assert torch.equal(a, b)
    assert torch.equal(
        optimizer.state_dict()["state"][0]["exp_avg"],
        fresh_optimizer.state_dict()["state"][0]["exp_avg"],
    )


def test_keeps_the_newest_latest_and_every_permanent(tmp_path):
    checkpointer = Checkpointer(tmp_path, sharded=False, keep_latest=2)
    save_steps(checkpointer, [1, 2, 3, 4])
    save_steps(checkpointer, [2], kind="permanent")
    names = [path.name for path in checkpointer.checkpoints()]
    assert names == ["permanent-00000002", "latest-00000003", "latest-00000004"]
    assert not list(tmp_path.glob(".tmp-*"))  # temporaries are renamed into place
    meta = json.loads((tmp_path / "latest-00000004" / "meta.json").read_text())
    assert meta["step"] == 4 and "state.pt" in meta["files"]


@pytest.mark.parametrize("damage", ["flip_byte", "truncate", "delete_meta"])
def test_corrupt_latest_falls_back_to_the_previous_one_with_a_message(tmp_path, damage):
    messages = []
    checkpointer = Checkpointer(tmp_path, sharded=False, log=messages.append)
    save_steps(checkpointer, [10, 20])
    newest = tmp_path / "latest-00000020"
    state = newest / "state.pt"
    if damage == "flip_byte":
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
    elif damage == "truncate":
        state.write_bytes(state.read_bytes()[:100])
    else:
        (newest / "meta.json").unlink()
    assert verify(newest)[0] is None
    assert checkpointer.find_latest().step == 10
    assert len(messages) == 1 and "latest-00000020" in messages[0] and "previous" in messages[0]
    assert (tmp_path / "corrupt-latest-00000020").is_dir()  # kept for inspection, out of the way
    save_steps(checkpointer, [30, 40])
    assert [p.name for p in checkpointer.checkpoints()] == ["latest-00000030", "latest-00000040"]


def test_an_unfinished_temporary_directory_is_ignored(tmp_path):
    checkpointer = Checkpointer(tmp_path, sharded=False)
    save_steps(checkpointer, [5])
    (tmp_path / ".tmp-latest-00000009").mkdir()  # a save killed half way
    assert checkpointer.find_latest().step == 5


def test_nothing_to_resume_from(tmp_path):
    assert Checkpointer(tmp_path / "none", sharded=False).find_latest() is None


def test_staging_on_local_disk_copies_in_the_background(tmp_path):
    staging = tmp_path / "local"
    checkpointer = Checkpointer(tmp_path / "run", sharded=False, staging_root=staging)
    save_steps(checkpointer, [3, 6])
    checkpointer.wait()
    assert [p.name for p in checkpointer.checkpoints()] == ["latest-00000003", "latest-00000006"]
    assert verify(tmp_path / "run" / "latest-00000006")[0] is not None
    assert not [
        p for p in staging.rglob("*") if p.is_file()
    ]  # staged copies are removed once moved


def test_staged_sharded_checkpoint_is_published_verified_and_loads(tmp_path):
    staging = tmp_path / "local"
    checkpointer = Checkpointer(tmp_path / "run", sharded=True, staging_root=staging)
    model, _ = save_steps(checkpointer, [3, 6])
    checkpointer.wait()
    assert [p.name for p in checkpointer.checkpoints()] == ["latest-00000003", "latest-00000006"]
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".tmp-")]
    assert not [p for p in staging.rglob("*") if p.is_file()]
    meta, _ = verify(tmp_path / "run" / "latest-00000006")
    assert meta["layout"] == "dcp" and {".metadata", "run_state.pt"} <= set(meta["files"])
    fresh_model, fresh_optimizer = trained_pair(seed=1)
    assert checkpointer.load(checkpointer.find_latest(), fresh_model, fresh_optimizer)["step"] == 6
    for a, b in zip(model.state_dict().values(), fresh_model.state_dict().values()):
        assert torch.equal(a, b)


def test_slurm_tmpdir_turns_staging_on(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_TMPDIR", str(tmp_path / "node"))
    checkpointer = Checkpointer(tmp_path / "run", sharded=False)
    assert checkpointer.staging_root == tmp_path / "node" / "danastar-checkpoints"


def test_rng_states_round_trip():
    set_seed_state = rng_state()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(set_seed_state)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert (
        torch.equal(expected[0], again[0])
        and np.array_equal(expected[1], again[1])
        and expected[2] == again[2]
    )
