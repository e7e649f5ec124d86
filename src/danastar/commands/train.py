"""`danastar train`: parse the configuration, then plan (`--dry_run`), launch (`--nproc N`) or
train.

    danastar train                                   # the CPU preset on Shakespeare
    danastar train --arch enoki --opt adana --heads 3 --dataset fineweb --dry_run
    danastar train --heads 2 --nproc 2 --distributed_backend fsdp
    torchrun --nproc_per_node 8 -m danastar train --heads 12 --distributed_backend fsdp

Every flag and key is documented in docs/training.md (`danastar train --help` lists the flags).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import NoReturn

from danastar.config import (
    TrainConfig,
    batch_layout,
    check_run_dir,
    load_config,
    make_run_plan,
    model_config,
    run_directory,
    schedule_options,
)
from danastar.data.prepared import META_FILE, RAW_META, prepared_format
from danastar.errors import UserError, report


def main(argv: list[str]) -> int:
    config, args = load_config(argv)
    # srun/mpirun workers: ranks from the launcher's variables, exported as torch's (train reads
    # only those, so the engine stays launcher-agnostic).
    from danastar.launch.env import export_torch_environment

    export_torch_environment()
    from danastar.launch.local import launch, under_torchrun

    worker = under_torchrun()  # one of N processes: rank 0 decides about the run directory
    planning = getattr(args, "dry_run", False)
    if not planning and not worker:
        # A run directory in use by another live process is said first (rank 0 takes its lock
        # when the run starts; this only looks).
        from danastar.rundir.lock import check_free

        check_free(run_directory(config), "use another --run_dir")
    # What training would refuse is refused here, as the dry run does: once (not by each of N
    # workers), before data is prepared, a process is started or a file is written.
    planned = dry_run(config)
    if not worker:
        check_resume(config, run_directory(config), planned["batch_layout"]["world_size"])
    if planning:
        print(json.dumps(planned, indent=2))
        return 0
    if not under_torchrun():
        # Facts of this machine, which a dry run (planning for any machine) does not check: here
        # they are refused once rather than by each worker, and before data is prepared.
        check_this_machine(config)
    if config.parallel.nproc > 1 and not under_torchrun():
        if config.data.dataset != "synthetic":
            from danastar.data.prepare import ensure_prepared

            ensure_prepared(config.data.dataset)  # missing data is one message; prepared once
        # The workers' stop file goes in the run directory.
        return launch(config.parallel.nproc, argv, run_directory(config))
    return run_training(config)


def run_training(config: TrainConfig) -> int:
    """Train in this process. A user error that every rank raises is printed by rank 0 alone;
    Ctrl-C pressed twice (or before training starts) stops at once with exit 130, no traceback."""
    from danastar.launch.local import under_torchrun

    if not (under_torchrun() and int(os.environ["WORLD_SIZE"]) > 1):
        return train_here(config)
    try:
        code = train_here(config)
    except UserError as error:  # said here, so that rank 0 too leaves through leave_worker
        code = report(error, "train")
    leave_worker(code)  # after a complete run, a stop, a refusal or Ctrl-C alike


def train_here(config: TrainConfig) -> int:
    from danastar.launch.local import is_main_process
    from danastar.train.signals import INTERRUPTED_EXIT_CODE

    try:
        from danastar.train.loop import train

        return train(config)
    except UserError as error:
        if error.reported_by_rank_0:
            return error.exit_code
        raise
    except KeyboardInterrupt:
        if is_main_process():
            print("\nCtrl-C: stopped at once; checkpoints are written atomically, so none is "
                  "left half-written: run the same command again to resume from the last one.",
                  file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT_CODE


def leave_worker(code: int) -> NoReturn:
    """End a distributed worker whose run is over (complete, stopped or refused): every file is
    closed and the process group destroyed, but the model, its meshes and sharded modules still hold
    the group, and the interpreter's exit would tear it down again, which now and then aborts
    inside gloo's threads ("terminate called without an active exception") and fails the job
    after a complete run. Flush what is buffered and leave without that second teardown."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def dry_run(config: TrainConfig, world_size: int | None = None) -> dict:
    """The resolved plan, batch layout and config as JSON-ready data; needs no data on disk."""
    if world_size is None:  # `danastar submit` knows the world it asks SLURM for
        world_size = int(os.environ.get("WORLD_SIZE", config.parallel.nproc))
    layout = batch_layout(config, world_size)
    vocab_size, vocab_from = planned_vocab_size(config.data.dataset)
    plan = make_run_plan(config, vocab_size, layout.data_parallel_size)
    check_optimizer_settings(plan, config)
    check_run_dir(run_directory(config))
    return {
        "plan": plan.to_dict(),
        "batch_layout": layout.to_dict(),
        "schedule": {"name": config.optim.scheduler, **schedule_options(config)},
        "dataset": config.data.dataset,
        "vocab_size_from": vocab_from,
        "config": config.to_dict(),
    }


def check_resume(config: TrainConfig, run_dir: Path, world_size: int) -> None:
    """Refuse, as training would when it resumes (the same sentence), to continue the run that
    `run_dir` holds with settings that change its trajectory. Reads the directory, writes nothing;
    data not prepared yet is compared by training once it is."""
    from danastar.train import identity
    from danastar.train.data import open_tokens

    if not config.checkpoint.auto_resume or not identity.has_earlier_run(run_dir):
        return  # training starts afresh there, moving an earlier run aside
    tokens = open_tokens(config, prepare=False)
    if tokens is None:
        return
    changes = identity.recorded_changes(run_dir, identity.planned_identity(config, world_size,
                                                                          tokens))
    if changes is not None and changes[1]:
        step, refused, _accepted = changes
        raise identity.refusal(run_dir, step, refused)


def check_this_machine(config: TrainConfig) -> None:
    """This machine has the devices the processes will ask for and the trackers asked for."""
    import importlib.util

    import torch

    from danastar.train.parallel import choose_device

    device = choose_device(config.train.device)
    nproc, gpus = config.parallel.nproc, torch.cuda.device_count()
    if device.type == "cuda" and nproc > gpus:
        raise UserError(f"--nproc {nproc} starts one process per GPU but this machine has {gpus}; "
                        f"use --nproc {gpus} or less (or train.device=cpu).")
    if config.logging.wandb and importlib.util.find_spec("wandb") is None:
        raise UserError("wandb is not installed; pip install 'danastar[wandb]' or pass --no_wandb.")
    if config.logging.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise UserError("TensorBoard is not installed; pip install 'danastar[tensorboard]' or drop "
                        "logging.tensorboard.")


def check_optimizer_settings(plan, config: TrainConfig) -> None:
    """Build the planned optimizer and schedule over the real model's parameter groups, with the
    model built on the meta device (no memory, no initialisation), so that a dry run rejects the
    settings training would reject."""
    import torch

    from danastar.models import build_model
    from danastar.train.loop import make_optimizer

    with torch.device("meta"):
        model = build_model(model_config(config, plan))
    make_optimizer(plan, config, model.param_groups(plan.weight_decay))


def planned_vocab_size(dataset: str) -> tuple[int, str]:
    """(vocabulary size, where it comes from) of a dataset, prepared or not."""
    from danastar.data import prepare, sources

    gpt2_vocab_size = RAW_META["vocab_size"]  # what raw token files hold (FineWeb's tokenizer too)
    path = Path(dataset).expanduser()
    for directory in (path, prepare.default_data_dir(dataset)):
        layout = prepared_format(directory) if directory.is_dir() else None
        if layout == "meta":
            meta = prepare.read_meta(directory)
            if meta is None or not isinstance(meta.get("vocab_size"), int):
                if dataset in prepare.AUTO_PREPARED and directory != path:
                    continue  # training prepares this default directory again before it starts
                from danastar.data.prepared import repair_command
                from danastar.errors import UserError

                raise UserError(f"{directory / META_FILE} is unreadable; repair the directory "
                                f"with {repair_command(directory, meta)}.")
            return int(meta["vocab_size"]), f"{directory / META_FILE}"
        if layout == "raw":
            return gpt2_vocab_size, "raw GPT-2 train.bin/val.bin"
    if dataset == "synthetic":
        from danastar.train.data import SYNTHETIC_VOCAB_SIZE

        return SYNTHETIC_VOCAB_SIZE, "the synthetic source"
    if dataset in sources.SOURCES and dataset != "fineweb":
        return sources.Corpus.default_vocab_size, f"the BPE {dataset} is prepared with on first use"
    return gpt2_vocab_size, "GPT-2 (fineweb's tokenizer; assumed for data not prepared yet)"
