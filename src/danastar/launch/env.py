"""Ranks from the environment: whoever started this process, find its rank, world size and local
rank, and export them as torch's variables so that `init_process_group("env://")` works.

    srun -n 2 python -m danastar train ...        # ranks from SLURM
    mpirun -n 2 python -m danastar train ...      # ranks from Open MPI
    torchrun --nproc_per_node 2 -m danastar train # ranks from torchrun (left as they are)

The first launcher whose variables are present wins, in this order: torchrun, Open MPI, PMI/PMIx,
a SLURM task, nothing (one process). A SLURM task counts only when `SLURM_STEP_ID` is set: a
process started directly by a batch script with `--ntasks=2` sees `SLURM_NTASKS=2` and
`SLURM_PROCID=0` but is no task of a step, and waiting for a second rank would hang forever.

`train` reads only torch's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
`MASTER_PORT`); the `danastar train` front end calls `export_torch_environment()` before it, so
the training engine stays launcher-agnostic and usable from anyone's torchrun script.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Mapping

PORT_BASE, PORT_RANGE = 20000, 20000  # MASTER_PORT = 20000 + job id mod 20000
DEFAULT_PORT = 29500  # torchrun's default, for a launcher that gives no job id


@dataclass(frozen=True)
class Ranks:
    """Where this process sits, and which launcher said so."""

    launcher: str  # torchrun | openmpi | pmi | slurm | none
    rank: int
    world_size: int
    local_rank: int


def _int(environ: Mapping[str, str], *names: str, default: int | None = None) -> int | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return int(value)
    return default


def detect_ranks(environ: Mapping[str, str] | None = None) -> Ranks:
    """The rank, world size and local rank of this process, from the first launcher that set
    them (see the module docstring for the order)."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return Ranks("torchrun", _int(env, "RANK"), _int(env, "WORLD_SIZE"),
                     _int(env, "LOCAL_RANK", default=0))
    if "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
        return Ranks("openmpi", _int(env, "OMPI_COMM_WORLD_RANK"),
                     _int(env, "OMPI_COMM_WORLD_SIZE"),
                     _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", default=0))
    if ("PMIX_RANK" in env or "PMI_RANK" in env) and "PMI_SIZE" in env:
        return Ranks("pmi", _int(env, "PMIX_RANK", "PMI_RANK"), _int(env, "PMI_SIZE"),
                     _int(env, "MPI_LOCALRANKID", "SLURM_LOCALID", default=0))
    if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return Ranks("slurm", _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS"),
                     _int(env, "SLURM_LOCALID", default=0))
    return Ranks("none", 0, 1, 0)


# ----------------------------------------------------------------------------------------------
# SLURM node lists: "gpu[01-03,07],login1" -> gpu01 gpu02 gpu03 gpu07 login1

def expand_nodelist(nodelist: str) -> list[str]:
    """Host names of a SLURM node list, by `scontrol show hostnames` when it runs here, else by
    the built-in parser (the same answer; tested against scontrol)."""
    if not nodelist:
        return []
    if "[" not in nodelist:
        return parse_nodelist(nodelist)  # plain names: nothing to expand
    try:
        result = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                                text=True, timeout=5)
        if result.returncode == 0 and result.stdout.strip():
            return result.stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return parse_nodelist(nodelist)


def parse_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM host list without scontrol: comma-separated names, each with any number of
    bracketed ranges (`n[1-3]`, `rack[1-2]-n[01,03]`); zero padding is kept as written."""
    hosts = []
    for name in _split_top_level(nodelist):
        hosts += _expand_name(name)
    return hosts


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for char in text:
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part.strip() for part in parts if part.strip()]


def _expand_name(name: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", name)
    if not match:
        return [name]
    prefix, suffix = name[:match.start()], name[match.end():]
    values = []
    for item in match.group(1).split(","):
        low, _, high = item.partition("-")
        if not high:
            values.append(low)
            continue
        width = len(low)  # scontrol keeps the padding of the range's first number
        values += [str(number).zfill(width) for number in range(int(low), int(high) + 1)]
    return [expanded for value in values for expanded in _expand_name(prefix + value + suffix)]


def master_address(environ: Mapping[str, str] | None = None) -> str:
    """An inherited MASTER_ADDR, else the first host of the step's (or job's) node list, else
    the loopback address."""
    env = os.environ if environ is None else environ
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"]
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(name):
            hosts = expand_nodelist(env[name])
            if hosts:
                return hosts[0]
    return "127.0.0.1"


def master_port(environ: Mapping[str, str] | None = None) -> int:
    """An inherited MASTER_PORT, else one derived from the job id, so that two jobs sharing a
    node do not collide; torchrun's default without a job id."""
    env = os.environ if environ is None else environ
    if env.get("MASTER_PORT"):
        return int(env["MASTER_PORT"])
    job_id = _int(env, "SLURM_JOB_ID", "SLURM_JOBID", default=None)
    if job_id is None:
        return DEFAULT_PORT
    return PORT_BASE + job_id % PORT_RANGE


def torch_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The torch variables this process should have; empty when it is one process alone or
    torchrun already set them."""
    env = os.environ if environ is None else environ
    ranks = detect_ranks(env)
    if ranks.launcher in ("torchrun", "none") or ranks.world_size <= 1:
        # One process: leave `--nproc N` free to start its own workers.
        return {}
    return {
        "RANK": str(ranks.rank),
        "WORLD_SIZE": str(ranks.world_size),
        "LOCAL_RANK": str(ranks.local_rank),
        "MASTER_ADDR": master_address(env),
        "MASTER_PORT": str(master_port(env)),
    }


def export_torch_environment() -> Ranks:
    """Set torch's variables from whichever launcher started this process; returns its ranks."""
    os.environ.update(torch_environment())
    return detect_ranks()
