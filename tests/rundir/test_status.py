"""status.json (where a run stands) and the STOP file (a request to stop), as the run writes
them and a job script or a person reads them."""

import json

import pytest

from danastar.rundir import status
from danastar.rundir.files import STATUS_FILE, STOP_FILE


def test_status_is_updated_keeping_earlier_fields(tmp_path, monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
                 "SLURM_RESTART_COUNT", "DANASTAR_SEGMENT"):
        monkeypatch.delenv(name, raising=False)
    assert status.read_status(tmp_path) == {}
    status.write_status(tmp_path, "running", step=0, total=90, exit_code=None)
    written = status.write_status(tmp_path, "segment done", step=30, exit_code=75)
    on_disk = json.loads((tmp_path / STATUS_FILE).read_text())
    assert on_disk == written == status.read_status(tmp_path)
    assert {key: on_disk[key] for key in ("state", "step", "total", "exit_code", "restarts")} == {
        "state": "segment done", "step": 30, "total": 90, "exit_code": 75, "restarts": 0}
    assert on_disk["updated"].endswith("Z")


def test_an_unknown_state_is_a_bug(tmp_path):
    with pytest.raises(AssertionError):
        status.write_status(tmp_path, "paused")


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", ""])
def test_an_unreadable_status_reads_as_none(tmp_path, content):
    (tmp_path / STATUS_FILE).write_text(content)
    assert status.read_status(tmp_path) == {}


def test_the_slurm_job_and_its_restarts():
    assert status.slurm_job({}) == {}
    assert status.slurm_job({"SLURM_JOB_ID": "41", "SLURM_RESTART_COUNT": "2"}) == {
        "job_id": "41", "restarts": 2}
    assert status.slurm_job({"SLURM_JOB_ID": "43", "SLURM_ARRAY_JOB_ID": "42",
                             "SLURM_ARRAY_TASK_ID": "1", "DANASTAR_SEGMENT": "3"}) == {
        "job_id": "42_1", "restarts": 3}


def test_a_stop_is_requested_seen_and_cleared_through_the_stop_file(tmp_path):
    assert not status.stop_requested(tmp_path)
    status.request_stop(tmp_path)
    assert (tmp_path / STOP_FILE).exists() and status.stop_requested(tmp_path)
    status.clear_stop(tmp_path)
    status.clear_stop(tmp_path)  # clearing twice is fine: a stop is consumed once
    assert not status.stop_requested(tmp_path)
