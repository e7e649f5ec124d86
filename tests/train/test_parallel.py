import socket
import subprocess

import pytest
import torch

from danastar.config import merge
from danastar.errors import UserError
from danastar.launch.local import torchrun_command, worker_argv
from danastar.train import parallel, wrap

from train_helpers import command, environment


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
    assert wrap.parallelize(model, merge([]), env) is model  # nothing to wrap
    with wrap.gradient_sync(model, sync=False):
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


# ----------------------------------------------------------------------------------------------
# RANK/WORLD_SIZE in the environment without the other processes (a shell inside a torchrun job)

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_a_rank_whose_peers_never_come_says_so_and_gives_up_with_the_fix(tmp_path):
    port = free_port()
    stray = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port), "DANASTAR_RENDEZVOUS_TIMEOUT": "2"}
    result = subprocess.run(command([], tmp_path / "run"), env={**environment(), **stray},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    why = "RANK=1 and WORLD_SIZE=2 in the environment say this process is rank 1 of a 2-process job"
    assert result.stderr.strip().splitlines() == [
        f"danastar train: waiting at 127.0.0.1:{port} for the other process of the job ({why}); "
        f"giving up in 1 s.",
        f"danastar train: the other processes of a 2-process job did not join at "
        f"127.0.0.1:{port} within 2 s ({why}); if it is meant to run alone, unset RANK, "
        f"WORLD_SIZE and LOCAL_RANK (a shell inside a torchrun job inherits them); else start "
        f"the 2 processes together (--nproc 2, torchrun, srun or mpirun); "
        f"DANASTAR_RENDEZVOUS_TIMEOUT=<seconds> waits longer."]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("variables, message", [
    ({}, r"rank 0 of a 2-process job, but MASTER_ADDR and MASTER_PORT \(where its processes "
         r"meet\) are not set; if it is meant to run alone, unset RANK, WORLD_SIZE and LOCAL_RANK"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "taken"}, "cannot meet the others at "
     "127.0.0.1:{port} (.*address already in use.*); if it is meant to run alone"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "DANASTAR_RENDEZVOUS_TIMEOUT": "soon"},
     "DANASTAR_RENDEZVOUS_TIMEOUT=soon is not a number of seconds above 0"),
])
def test_a_rendezvous_that_cannot_happen_is_one_sentence(monkeypatch, variables, message):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("MASTER_ADDR", "MASTER_PORT", "DANASTAR_RENDEZVOUS_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as taken:  # a port something else listens on
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for name, value in variables.items():
            monkeypatch.setenv(name, str(port) if value == "taken" else value)
        with pytest.raises(UserError, match=message.format(port=port)):
            parallel.setup_distributed(merge([{"train": {"device": "cpu"}}]))
