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

from danastar.config import TrainConfig, batch_layout, load_config, make_run_plan, model_config
from danastar.data.prepared import META_FILE, RAW_META, prepared_format


def main(argv: list[str]) -> int:
    config, args = load_config(argv)
    if getattr(args, "dry_run", False):
        print(json.dumps(dry_run(config), indent=2))
        return 0
    from danastar.launch.local import launch, under_torchrun

    if config.parallel.nproc > 1 and not under_torchrun():
        return launch(config.parallel.nproc, argv)
    return run_training(config)


def run_training(config: TrainConfig) -> int:
    """Train in this process. A user error that every rank raises is printed by rank 0 alone;
    Ctrl-C pressed twice (or before training starts) stops at once with exit 130, no traceback."""
    from danastar.errors import UserError
    from danastar.launch.local import is_main_process
    from danastar.train.signals import INTERRUPTED_EXIT_CODE

    try:
        from danastar.train.loop import train

        return train(config)
    except UserError as error:
        if getattr(error, "reported_by_rank_0", False):
            return error.exit_code
        raise
    except KeyboardInterrupt:
        if is_main_process():
            print("\nCtrl-C: stopped at once; checkpoints are written atomically, so none is "
                  "left half-written: run the same command again to resume from the last one.",
                  file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT_CODE


def dry_run(config: TrainConfig) -> dict:
    """The resolved plan, batch layout and config as JSON-ready data; needs no data on disk."""
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
            meta = json.loads((directory / META_FILE).read_text())
            return int(meta["vocab_size"]), f"{directory / META_FILE}"
        if layout == "raw":
            return gpt2_vocab_size, "raw GPT-2 train.bin/val.bin"
    if dataset == "synthetic":
        from danastar.train.data import SYNTHETIC_VOCAB_SIZE

        return SYNTHETIC_VOCAB_SIZE, "the synthetic source"
    if dataset in sources.SOURCES and dataset != "fineweb":
        return sources.Corpus.default_vocab_size, f"the BPE {dataset} is prepared with on first use"
    return gpt2_vocab_size, "GPT-2 (fineweb's tokenizer; assumed for data not prepared yet)"
