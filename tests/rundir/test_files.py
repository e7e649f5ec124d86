"""An earlier run's files are moved aside, never deleted, and only a run that trained counts."""

from danastar.rundir.files import (
    CONFIG_FILE,
    METRICS_FILE,
    MODEL_CONFIG_FILE,
    PLAN_FILE,
    RUN_FILE,
    has_earlier_run,
    move_aside,
)


def test_config_and_plan_alone_are_no_earlier_run(tmp_path):
    for name in (CONFIG_FILE, PLAN_FILE):
        (tmp_path / name).write_text("{}")
    assert not has_earlier_run(tmp_path) and move_aside(tmp_path) is None
    assert (tmp_path / CONFIG_FILE).exists()


def test_an_earlier_run_moves_aside_with_its_rank_logs_but_not_a_jobs_log(tmp_path):
    for name in (METRICS_FILE, RUN_FILE, MODEL_CONFIG_FILE, "checkpoints/latest/state.pt",
                 "logs/rank0.log", "logs/job-42.out", "notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    assert has_earlier_run(tmp_path)
    aside = move_aside(tmp_path)
    assert aside.parent == tmp_path and aside.name.startswith("previous-")
    moved = sorted(str(p.relative_to(aside)) for p in aside.rglob("*") if p.is_file())
    assert moved == sorted([METRICS_FILE, RUN_FILE, MODEL_CONFIG_FILE,
                            "checkpoints/latest/state.pt", "logs/rank0.log"])
    assert (aside / "logs/rank0.log").read_text() == "logs/rank0.log"
    # what the run did not write stays: a job's own log, a person's notes
    assert (tmp_path / "logs/job-42.out").exists() and (tmp_path / "notes.txt").exists()
    assert not has_earlier_run(tmp_path)
    (tmp_path / METRICS_FILE).write_text("")
    assert move_aside(tmp_path) != aside  # a second move in the same second gets its own folder
