"""Planning a run without training it: the library that `danastar train`, `submit` and `sweep`
call. `planned_run` resolves the plan, the batch layout, the corpus epochs, the compute and the
run directory, refusing (one sentence, before any process starts or file is written) what
training would refuse (data it cannot open); `checked_start` adds what `danastar train` checks of
its run directory before it starts, with `--dry_run` or without: another process training
there (the lock, probed, not taken) and a resume it would refuse (`check_resume`);
what a plan assumes of data not prepared yet is `danastar.data.planned`'s, the memory check
`train.memory`'s and the time estimate `train.estimate`'s."""

from __future__ import annotations

import os
from pathlib import Path

from danastar.config import (
    TrainConfig,
    batch_layout,
    check_run_dir,
    make_run_plan,
    model_config,
    repetition_warning,
    schedule_options,
)
from danastar.data import prepare, sources
from danastar.data.planned import planned_train_tokens, planned_vocab_size
from danastar.hparams import short_run_warning
from danastar.rundir.lock import check_free
from danastar.scaling import Plan, meta_model
from danastar.train import identity
from danastar.train.data import open_tokens
from danastar.train.identity import planned_run_dir
from danastar.train.optimizer import make_optimizer


def planned_run(config: TrainConfig, world_size: int | None = None, run_dir: Path | None = None,
                run_dir_note: str | None = None) -> tuple[Plan, dict]:
    """The run's plan, and with it the dry run's JSON-ready record (see `dry_run`)."""
    if world_size is None:  # `danastar submit` knows the world it asks SLURM for
        world_size = int(os.environ.get("WORLD_SIZE", config.parallel.nproc))
    layout = batch_layout(config, world_size)
    vocab_size, vocab_from = planned_vocab_size(config.data.dataset)
    plan = make_run_plan(config, vocab_size, layout.data_parallel_size)
    model = check_optimizer_settings(plan, config)
    check_dataset(config.data.dataset)
    if run_dir is None:
        chosen = planned_run_dir(config, world_size)
        run_dir, run_dir_note = chosen.path, chosen.note
    check_run_dir(run_dir)
    corpus_tokens, corpus_from = planned_train_tokens(config.data.dataset)
    flops_per_token = model.flops_per_token(layout.sequence_length)
    return plan, {
        "plan": plan.to_dict(),
        "batch_layout": layout.to_dict(),
        "schedule": {"name": config.optim.scheduler, **schedule_options(config)},
        "dataset": config.data.dataset,
        "vocab_size_from": vocab_from,
        # how many times the run reads the corpus (None: not known before it is prepared)
        "corpus": {"train_tokens": corpus_tokens, "train_tokens_from": corpus_from,
                   "epochs": plan.tokens / corpus_tokens if corpus_tokens else None},
        # training FLOPs: 6·N per token for the weights, plus attention (as for the MFU)
        "compute": {"flops_per_token": flops_per_token, "flops": flops_per_token * plan.tokens},
        "run_dir": str(run_dir),
        "run_dir_note": run_dir_note,
        "config": config.to_dict(),
    }


def dry_run(config: TrainConfig, world_size: int | None = None, run_dir: Path | None = None,
            run_dir_note: str | None = None) -> dict:
    """The resolved plan, batch layout, corpus epochs, compute, run directory and config as
    JSON-ready data; needs no data on disk. `run_dir` (with its `planned_run_dir` note): where
    the caller will run it; None: where `danastar train` would."""
    return planned_run(config, world_size, run_dir, run_dir_note)[1]


# What `danastar train` changes when a run is too short for its log-time weight decay.
SHORT_RUN_FIX = "a longer --iterations, a smaller --omega, or --omega 0 (no decay) for a smoke test"


def decay_warning(weight_decay, wd_ts) -> str | None:
    """The optimizers' short-run weight-decay warning in the command's words, as a line (the
    dry run prints it, a run logs it at its start)."""
    decay = short_run_warning(weight_decay, wd_ts, SHORT_RUN_FIX)
    return f"warning: {decay}." if decay else None


def planned_warning(planned: dict) -> str | None:
    """The plan's warnings, a line each: when it reads its corpus too many times (see
    `repetition_warning`), and when the run is too short for its log-time weight decay
    (`decay_warning`; not for an extended run, whose decay is the one it was continued with,
    past the start the warning is about)."""
    plan = planned["plan"]
    decay = None if planned.get("extensions") else decay_warning(plan["weight_decay"],
                                                                 plan["wd_ts"])
    lines = [repetition_warning(plan["tokens"], plan["tokens_per_step"],
                                planned["corpus"]["train_tokens"], planned["dataset"]), decay]
    return "\n".join(line for line in lines if line) or None


def checked_start(config: TrainConfig, run_dir: Path, run_dir_note: str | None = None
                  ) -> tuple[Plan, dict]:
    """`planned_run`, with what `danastar train` checks of `run_dir` before it starts: one
    function for the dry run and the real start, so that a dry run passes only what training
    would. Refuses a directory another live process holds (its lock probed, not taken: training
    takes it when it starts) and a resume training would refuse; writes nothing."""
    check_free(run_dir, "use another --run_dir")  # said first, before any planning
    plan, planned = planned_run(config, run_dir=run_dir, run_dir_note=run_dir_note)
    # the extensions past its planned total the run continues under (the dry run's line)
    planned["extensions"] = check_resume(config, run_dir, planned["batch_layout"]["world_size"])
    return plan, planned


def check_dataset(dataset: str) -> None:
    """Refuse, with training's own sentence, data that training could neither open nor prepare:
    a folder that does not exist or holds no prepared data, under a name that is no source. A
    source named but not prepared yet is planned from its name (a plan needs no data; a run here
    does: `train.data.check_prepared_here` refuses a source training would not prepare)."""
    if dataset != "synthetic" and dataset not in sources.SOURCES:
        prepare.ensure_prepared(dataset)  # a name that is no source: opened as it is, or refused


def check_resume(config: TrainConfig, run_dir: Path, world_size: int) -> list[dict]:
    """Refuse, as training would when it resumes (the same sentence), to continue the run that
    `run_dir` holds with settings that change its trajectory; returns the extensions past its
    planned total that the run would continue under (`identity.run_extensions`).
    Reads the directory, writes nothing; data not prepared yet is compared by training once it
    is."""
    if not config.checkpoint.auto_resume or not identity.has_earlier_run(run_dir):
        return []  # training starts afresh there, moving an earlier run aside
    tokens = open_tokens(config, prepare=False)
    if tokens is None:
        return []
    current = identity.planned_identity(config, world_size, tokens)
    changes = identity.recorded_changes(run_dir, current, identity.extension_keys(config))
    if changes is None:
        return []
    step, refused, _accepted = changes
    if refused:
        raise identity.refusal(run_dir, step, refused)
    return identity.run_extensions(identity.read_run_file(run_dir), current, step, config)


def check_optimizer_settings(plan, config: TrainConfig):
    """Build the planned optimizer and schedule over the real model's parameter groups, with the
    model built on the meta device (no memory, no initialisation), so that a dry run rejects the
    settings training would reject; returns that model (for its FLOPs)."""
    model = meta_model(model_config(config, plan))  # the one the plan counted
    make_optimizer(plan, config, model.param_groups(plan.weight_decay))
    return model
