"""Where a run's files go: `--run_dir`, or runs/<a name made from what the run means>, kept
within the file system's limits; and the checks that the directory can be written."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Optional

from danastar.config.schema import ModelSection, OptimSection, TrainConfig
from danastar.config.validate import schedule_options
from danastar.errors import UserError
from danastar.optim.schedules import SCHEDULE_OPTIONS
from danastar.rundir.files import CHECKPOINTS_DIR


def default_run_dir(config: TrainConfig) -> Path:
    """runs/<name>, the name made from what the run means: dataset, architecture, heads (and any
    explicit dimension), optimizer and every setting given away from its default, global batch,
    schedule, seed and the export it starts from (`--init_from`). Never the world size, the
    micro-batch split or the cluster, so that a run moved to another GPU count or cluster finds
    its checkpoints again."""
    dataset = Path(config.data.dataset).name or "data"
    model, optim, train = config.model, config.optim, config.train
    parts = [dataset, model.arch, f"h{model.heads}"]
    parts += [f"{key}{getattr(model, key)}" for key in ("n_layer", "n_embd", "n_head")
              if getattr(model, key) is not None]
    parts += moe_name_parts(model)
    parts.append(optim.name)
    defaults = OptimSection()
    short = {"lr": "lr", "weight_decay": "wd", "omega": "om", "kappa": "k", "delta": "d",
             "clipsnr": "snr", "warmup_steps": "wu"}
    parts += [f"{tag}{getattr(optim, key):g}" for key, tag in short.items()
              if getattr(optim, key) is not None and getattr(optim, key) != getattr(defaults, key)]
    if optim.state_dtype != defaults.state_dtype:
        parts.append(f"state-{optim.state_dtype}")
    parts += [f"b{train.batch_size * train.acc_steps}x{train.sequence_length}", optim.scheduler]
    parts += [f"{name}{value:g}" if isinstance(value, float) else f"{name}{value}"
              for name, value in schedule_options(config).items()
              if value != SCHEDULE_OPTIONS[optim.scheduler][name]]
    parts.append(f"s{train.seed}")  # not the iterations: extending a run keeps its directory
    if train.init_from:  # other starting weights: never the directory of a random start
        parts.append(f"from-{Path(train.init_from).expanduser().resolve().name or 'export'}")
    return Path("runs") / fit_name("-".join(parts))


NAME_MAX = 255  # bytes in one name of a path on the common file systems (ext4, xfs, Lustre, ...)


def fit_name(name: str) -> str:
    """A default run name within NAME_MAX bytes: one that is longer (a long dataset folder's
    name, many settings away from their defaults) keeps its beginning and ends in a hash of the
    whole, so that it stays the same for the same settings (a resume finds it) and differs for
    others."""
    if len(os.fsencode(name)) <= NAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    head = os.fsencode(name)[: NAME_MAX - len(digest) - 1].decode(errors="ignore")
    return f"{head}-{digest}"


def moe_name_parts(model: ModelSection) -> list[str]:
    """A MoE run's part of its default name: E and k, then each setting with a tag (see
    `danastar.models.config.option`) given away from its default, so that runs with other
    experts do not share a directory."""
    moe = model.moe
    if not moe.enabled:
        return []
    parts = [f"moe{moe.num_experts}x{moe.num_experts_per_tok}"]
    for f in dataclasses.fields(moe):
        value = getattr(moe, f.name)
        if f.metadata["tag"] is None or value == f.default:
            continue
        if isinstance(value, bool):
            value = ""
        elif isinstance(value, float):
            value = f"{value:g}"
        elif isinstance(value, tuple):
            value = "_".join(map(str, value))
        parts.append(f"{f.metadata['tag']}{value}")
    return parts


def run_directory(config: TrainConfig) -> Path:
    """Where this run's files go: --run_dir, or runs/<a name from the run's meaning> (see
    `default_run_dir`)."""
    return Path(config.logging.run_dir) if config.logging.run_dir else default_run_dir(config)


def check_run_dir(run_dir: Path) -> None:
    """Refuse a run directory that cannot be created or written, before anything is started or
    written (a dry run creates nothing: the nearest existing directory must be writable)."""
    fix = "pass another --run_dir"
    too_long = name_too_long(run_dir)
    if too_long:
        raise UserError(f"run directory {run_dir} {too_long}; {fix} with shorter names.")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} is a file; {fix} or move the file away.")
    existing = next(path for path in (run_dir, *run_dir.parents) if path.exists())
    if not existing.is_dir():
        raise UserError(f"run directory {run_dir} cannot be created because {existing} is a "
                        f"file; {fix}.")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is" if existing == run_dir else f"cannot be created in {existing}, which is"
        raise UserError(f"run directory {run_dir} {what} not writable; {fix} or make it "
                        "writable.")
    # Found at the first save, a checkpoints/ folder that takes no files would lose every step
    # since the last checkpoint.
    checkpoints = run_dir / CHECKPOINTS_DIR
    if checkpoints.exists() and not checkpoints.is_dir():
        raise UserError(f"{checkpoints} is a file, where the run's checkpoints go; move it away "
                        f"or {fix}.")
    if checkpoints.is_dir() and not os.access(checkpoints, os.W_OK | os.X_OK):
        raise UserError(f"{checkpoints} is not writable, so no checkpoint could be saved; make "
                        f"it writable or {fix}.")


def name_too_long(path: Path) -> Optional[str]:
    """What is wrong with a name in `path` longer than its file system allows, or None."""
    existing = next((parent for parent in path.parents if os.path.isdir(parent)), Path("."))
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = NAME_MAX
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > limit:
            return (f"has a name of {size} bytes ({part[:24]}...), longer than the {limit} its "
                    f"file system allows")
    return None
