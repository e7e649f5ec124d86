"""Fixtures for the launch tests: a real local SLURM (skipped, saying why, where it cannot run)."""

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from local_slurm import LocalSlurm, Munge, why_not_available


def pytest_collection_modifyitems(items):
    """Under pytest-xdist, every test of the local SLURM runs in one test process, which starts
    the cluster once (a session fixture is per process)."""
    for item in items:
        if "munge" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("slurm"))


@pytest.fixture(scope="session")
def munge():
    reason = why_not_available()
    if reason:
        pytest.skip(f"no local SLURM: {reason}")
    # A short private path: munged and slurmd refuse socket paths longer than ~100 characters.
    directory = Path(tempfile.mkdtemp(prefix="dslurm-"))
    daemon = Munge(directory / "munge")
    yield daemon
    daemon.stop()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm(munge):
    """One cluster of one node with this machine's name, shared by the SLURM tests."""
    import socket

    cluster = LocalSlurm(munge.directory.parent / "cluster", munge, name="local",
                         nodes=(socket.gethostname(),))
    yield cluster
    cluster.stop()


# The training tests' helpers (tiny runs as real processes) serve these tests too.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "train"))
