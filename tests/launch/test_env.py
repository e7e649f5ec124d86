"""Ranks from the environment: each launcher's variables, the order, and the in-batch trap."""

import pytest

from danastar.launch.env import (
    detect_ranks,
    master_address,
    master_port,
    parse_nodelist,
    torch_environment,
)

SLURM_TASK = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
              "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[07-08]"}


@pytest.mark.parametrize("environ, expected", [
    ({}, ("none", 0, 1, 0)),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, ("torchrun", 1, 2, 1)),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
      "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, ("openmpi", 2, 4, 0)),
    ({"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1"}, ("pmi", 5, 8, 1)),
    ({"PMIX_RANK": "6", "PMI_SIZE": "8", "SLURM_LOCALID": "2"}, ("pmi", 6, 8, 2)),
    (SLURM_TASK, ("slurm", 3, 4, 1)),
    # torchrun inside a SLURM step (the torchrun-per-node launch): torchrun's ranks win.
    ({**SLURM_TASK, "RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0"}, ("torchrun", 0, 8, 0)),
    # mpirun inside an allocation: Open MPI's ranks win over SLURM's.
    ({**SLURM_TASK, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
     ("openmpi", 1, 2, 0)),
])
def test_each_launcher_is_recognised_in_order(environ, expected):
    ranks = detect_ranks(environ)
    assert (ranks.launcher, ranks.rank, ranks.world_size, ranks.local_rank) == expected


def test_a_batch_script_with_several_tasks_is_one_process_not_a_rank():
    # What a batch script run with --ntasks=2 sees: no SLURM_STEP_ID. Waiting for a second rank
    # would hang forever; it is one process.
    in_batch = {key: value for key, value in SLURM_TASK.items() if key != "SLURM_STEP_ID"}
    in_batch.update(SLURM_NTASKS="2", SLURM_PROCID="0")
    assert detect_ranks(in_batch).launcher == "none"
    assert torch_environment(in_batch) == {}


def test_slurm_task_exports_torch_variables_with_master_from_the_node_list(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: the built-in parser expands the list
    exported = torch_environment(SLURM_TASK)
    assert exported == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                        "MASTER_ADDR": "gpu07", "MASTER_PORT": str(20000 + 4242 % 20000)}


def test_inherited_master_address_and_port_are_kept():
    environ = {**SLURM_TASK, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}
    assert master_address(environ) == "10.0.0.1" and master_port(environ) == 1234
    assert master_address({}) == "127.0.0.1" and master_port({}) == 29500
    # the step's node list comes before the job's
    assert master_address({"SLURM_STEP_NODELIST": "b1,b2", "SLURM_JOB_NODELIST": "a1"}) == "b1"
    # two jobs on one node get different ports
    assert master_port({"SLURM_JOB_ID": "1"}) != master_port({"SLURM_JOB_ID": "2"})


def test_a_single_task_leaves_nproc_free_to_launch():
    one = {**SLURM_TASK, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}
    assert torch_environment(one) == {}


@pytest.mark.parametrize("nodelist, hosts", [
    ("n1", ["n1"]),
    ("n1,n2", ["n1", "n2"]),
    ("gpu[01-03,7]", ["gpu01", "gpu02", "gpu03", "gpu7"]),
    ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
    ("gpu[08-10],login1", ["gpu08", "gpu09", "gpu10", "login1"]),
    ("r[1-2]-n[8-9]", ["r1-n8", "r1-n9", "r2-n8", "r2-n9"]),
    ("a[1,3],b-x[001-002]", ["a1", "a3", "b-x001", "b-x002"]),
])
def test_the_fallback_parser_expands_node_lists(nodelist, hosts):
    assert parse_nodelist(nodelist) == hosts


@pytest.mark.slurm
def test_the_fallback_parser_agrees_with_scontrol(slurm):
    for nodelist in ("gpu[01-03,7]", "gpu[8-10]", "gpu[08-10],login1", "r[1-2]-n[8-9]",
                     "a[1,3],b-x[001-002]", "node[098-101]"):
        result = slurm.run("scontrol", "show", "hostnames", nodelist)
        assert result.returncode == 0, result.stderr
        assert parse_nodelist(nodelist) == result.stdout.split(), nodelist
