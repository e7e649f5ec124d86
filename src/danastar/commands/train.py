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
from pathlib import Path

from danastar.config import TrainConfig, batch_layout, load_config, make_run_plan, model_config
from danastar.data.prepared import META_FILE, RAW_META, prepared_format


def main(argv: list[str]) -> int:
    config, args = load_config(argv)
    # srun/mpirun workers: ranks from the launcher's variables, exported as torch's (train reads
    # only those, so the engine stays launcher-agnostic).
    from danastar.launch.env import export_torch_environment

    export_torch_environment()
    if getattr(args, "dry_run", False):
        print(json.dumps(dry_run(config), indent=2))
        return 0
    from danastar.launch.local import launch, under_torchrun

    if config.parallel.nproc > 1 and not under_torchrun():
        from danastar.config import default_run_dir  # the workers' stop file goes there

        run_dir = config.logging.run_dir or default_run_dir(config)
        return launch(config.parallel.nproc, argv, Path(run_dir))
    from danastar.train.loop import train

    return train(config)


def dry_run(config: TrainConfig, world_size: int | None = None) -> dict:
    """The resolved plan, batch layout and config as JSON-ready data; needs no data on disk."""
    if world_size is None:  # `danastar submit` knows the world it asks SLURM for
        world_size = int(os.environ.get("WORLD_SIZE", config.parallel.nproc))
    layout = batch_layout(config, world_size)
    vocab_size, vocab_from = planned_vocab_size(config.data.dataset)
    plan = make_run_plan(config, vocab_size, layout.data_parallel_size)
    check_optimizer_settings(plan, config)
    return {
        "plan": plan.to_dict(),
        "batch_layout": layout.to_dict(),
        "dataset": config.data.dataset,
        "vocab_size_from": vocab_from,
        "config": config.to_dict(),
    }


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
