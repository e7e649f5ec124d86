import json

import pytest

from danastar.config import merge
from danastar.errors import UserError
from danastar.rundir.files import SUPERSEDED_FILE
from danastar.rundir.metrics import records as read_metrics
from danastar.rundir.metrics import truncate as truncate_metrics
from danastar.train.logging import RunLogger, tracker_scalars


def make_logger(run_dir, resumed=False, start_step=0, **logging_keys):
    config = merge([{"logging": {"progress": False, **logging_keys}}])
    return RunLogger(
        run_dir, config, rank=0, total_steps=10, start_step=start_step, resumed=resumed
    )


def test_metrics_lines_and_rank_log(tmp_path):
    logger = make_logger(tmp_path)
    logger.log({"step": 0, "val_loss": 2.5})
    logger.log({"step": 1, "train_loss": 2.4, "lr": 1e-3})
    logger.info("hello")
    logger.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [
        {"step": 0, "val_loss": 2.5},
        {"step": 1, "train_loss": 2.4, "lr": 1e-3},
    ]
    assert "hello" in (tmp_path / "logs" / "rank0.log").read_text()


def test_resume_moves_lines_after_the_checkpoint_aside_and_never_truncates(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "train_loss": 1.0}) + "\n" for s in range(8)))
    truncate_metrics(path, 5)
    assert [m["step"] for m in read_metrics(path)] == list(range(6))
    make_logger(tmp_path, resumed=True, start_step=3).close()
    assert [m["step"] for m in read_metrics(path)] == list(range(4))
    # the dropped lines are kept, in the order they were dropped
    assert [m["step"] for m in read_metrics(tmp_path / SUPERSEDED_FILE)] == [6, 7, 4, 5]
    make_logger(tmp_path, resumed=False).close()  # appends (an earlier run is moved aside first)
    assert [m["step"] for m in read_metrics(path)] == list(range(4))


@pytest.mark.parametrize("key, package", [("wandb", "wandb"), ("tensorboard", "tensorboard")])
def test_trackers_are_optional_and_asked_for(tmp_path, key, package):
    try:
        __import__(package)
    except ImportError:
        with pytest.raises(UserError, match="not installed"):
            make_logger(tmp_path, **{key: True})
    else:
        make_logger(
            tmp_path, **{key: True}, **({"wandb_offline": True} if key == "wandb" else {})
        ).close()


def test_trackers_get_numbers_and_each_moe_layers_largest_load():
    line = {"step": 4, "train_loss": 2.5, "final": True, "moe_max_load": 1.5,
            "moe_load": [[0.25, 0.25, 0.5, 0.0], [0.125, 0.375, 0.25, 0.25]],
            "experts": [{"routed_share": [1.0, 0.5]}]}
    assert tracker_scalars(line) == {"train_loss": 2.5, "moe_max_load": 1.5,
                                     "moe_max_load/layer0": 2.0, "moe_max_load/layer1": 1.5}


def test_output_that_is_not_a_terminal_gets_plain_lines_not_a_bar(tmp_path, capsys):
    """pytest's captured stdout is not a terminal, as a pipe or a file is not: the progress
    is a plain line per logged step, with no bar's carriage returns."""
    logger = make_logger(tmp_path, progress=True)
    logger.info("run directory here")
    logger.progress(5, {"step": 5, "train_loss": 2.345678, "lr": 1e-3, "grad_norm": 0.5})
    logger.close()
    out = capsys.readouterr().out
    assert out == ("run directory here\n"
                   "step 5/10: train_loss 2.346, lr 0.001, grad_norm 0.5\n")
