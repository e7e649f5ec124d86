import pytest
import torch

from danastar.config import merge
from danastar.errors import UserError
from danastar.launch.local import torchrun_command, worker_argv
from danastar.train import parallel


@pytest.mark.parametrize(
    "requested, world, expected",
    [
        ("auto", 1, "single"),
        ("fsdp", 1, "single"),
        ("auto", 4, "ddp"),
        ("fsdp", 4, "fsdp"),
        ("hsdp", 8, "hsdp"),
    ],
)
def test_backend_resolution(requested, world, expected):
    assert parallel.resolve_backend(requested, world) == expected


def test_single_cannot_run_several_processes():
    with pytest.raises(UserError, match="cannot run 2 processes"):
        parallel.resolve_backend("single", 2)


def test_one_process_on_cpu(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    env = parallel.setup_distributed(merge([{"train": {"device": "cpu"}}]))
    assert (env.backend, env.world_size, env.data_rank, env.data_world, env.device) == (
        "single",
        1,
        0,
        1,
        torch.device("cpu"),
    )
    model = torch.nn.Linear(2, 2)
    assert parallel.parallelize(model, merge([]), env) is model  # nothing to wrap
    with parallel.gradient_sync(model, sync=False):
        model(torch.ones(1, 2)).sum().backward()


def test_tensor_parallelism_needs_several_processes(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(UserError, match="need several processes"):
        parallel.setup_distributed(
            merge([{"parallel": {"tp_size": 2, "backend": "fsdp"}, "train": {"device": "cpu"}}])
        )


def test_launcher_hands_nproc_to_the_workers_as_a_key():
    assert worker_argv(["--nproc", "4", "--heads", "3", "--nproc=2"]) == [
        "parallel.nproc=4",
        "--heads",
        "3",
        "parallel.nproc=2",
    ]
    command = torchrun_command(4, ["--nproc", "4"])
    assert "--nproc_per_node=4" in command and "SIGUSR1" in " ".join(command)
    assert command[-3:] == ["danastar", "train", "parallel.nproc=4"]
