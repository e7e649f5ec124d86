"""metrics.jsonl's one reader keeps what it can read and names the lines it cannot; a resume
moves the lines after its checkpoint (and unreadable ones) aside, never losing them."""

import json

from danastar.rundir import metrics
from danastar.rundir.files import METRICS_FILE, SUPERSEDED_FILE


def lines(*records) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def test_a_missing_file_reads_as_empty(tmp_path):
    found = metrics.read(tmp_path / METRICS_FILE)
    assert found.records == [] and found.bad_lines == [] and found.problem() is None
    assert metrics.records(tmp_path / METRICS_FILE) == []


def test_bad_lines_are_skipped_and_reported_by_number(tmp_path):
    path = tmp_path / METRICS_FILE
    good = [{"step": 0, "val_loss": 2.5}, {"step": 1, "train_loss": 2.4}, {"step": 2}]
    path.write_text(lines(good[0]) + "not json\n" + "\n" + lines(good[1]) + "[1, 2]\n"
                    + lines({"step": "three"}) + lines(good[2]) + '{"step": 3, "train_')
    found = metrics.read(path)
    assert found.records == good
    assert found.bad_lines == [2, 5, 6, 8] and found.total_lines == 8 and found.cut_short
    assert found.problem() == (f"4 of the 8 lines of {path} could not be read and were left "
                               f"out (lines 2, 5, 6, 8)")


def test_a_cut_short_last_line_is_named_as_a_killed_runs(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text(lines({"step": 0, "val_loss": 2.5}) + '{"step": 1, "tra')
    found = metrics.read(path)
    assert found.records == [{"step": 0, "val_loss": 2.5}]
    assert found.problem().endswith("(line 2); the last line was cut short, as a killed run "
                                    "leaves it")


def test_final_validation_is_the_last_final_record_with_a_loss():
    found = [{"step": 10, "val_loss": 3.0, "final": True}, {"step": 10, "train_loss": 2.9},
             {"step": 20, "final": True}, {"step": 20, "val_loss": 2.0, "final": True},
             {"step": 20, "val_loss": 2.1}]
    assert metrics.final_validation(found) == found[3]
    assert metrics.final_validation(found[1:3]) is None


def test_truncate_keeps_the_lines_up_to_the_step_and_moves_the_rest_aside(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text(lines(*({"step": s, "train_loss": 1.0} for s in range(6))) + '{"step": 6, "t')
    metrics.truncate(path, 3)
    assert [m["step"] for m in metrics.records(path)] == [0, 1, 2, 3]
    assert metrics.read(path).bad_lines == []
    superseded = (tmp_path / SUPERSEDED_FILE).read_text().splitlines()
    assert [json.loads(line)["step"] for line in superseded[:2]] == [4, 5]
    assert superseded[2] == '{"step": 6, "t'  # unreadable, but kept as it was
    before = path.read_text()
    metrics.truncate(path, 3)  # nothing after step 3 any more: nothing moves
    assert path.read_text() == before and len(
        (tmp_path / SUPERSEDED_FILE).read_text().splitlines()) == 3
