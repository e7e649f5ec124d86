"""A trained run's weights, read once for every reader (`danastar generate`, `export`, `eval`).

    weights = load_weights(Path("runs/my-run"))          # its newest complete checkpoint
    model = build_model(weights.model_config); model.load_state_dict(weights.state_dict)

A path is a run directory (its newest checkpoint that verifies) or one checkpoint folder.
Single-file (`state.pt`) and sharded (`torch.distributed.checkpoint`) checkpoints both load, the
shards of every rank read whole into this one process. The model's shape comes from the run's
`model_config.json` where training wrote one, else it is rebuilt from `config.yaml` and
`plan.json` (runs trained before the file existed). Weights holding a NaN or an infinity (a
checkpoint saved while a run diverged) are refused: nothing computed from them means anything.
Nothing is written.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml

from danastar.config import load_config, make_run_plan, model_config
from danastar.errors import UserError
from danastar.models.config import ModelConfig
from danastar.models.meta import build_meta_model
from danastar.rundir import metrics
from danastar.rundir.files import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    METRICS_FILE,
    MODEL_CONFIG_FILE,
    PLAN_FILE,
    RUN_FILE,
    checkpoint_dirs,
)
from danastar.train.checkpoint import META_FILE, STATE_FILE, distributed_checkpoint, verify


@dataclasses.dataclass
class Weights:
    """A checkpoint's model: its shape, plain CPU tensors, and what the run says of itself."""

    model_config: ModelConfig
    state_dict: dict[str, torch.Tensor]
    run_dir: Path
    checkpoint: Path
    step: int
    layout: str  # "single" or "dcp"
    identity: dict[str, Any]  # run.json's identity: optimizer, LR, dataset, tokenizer...
    val_loss: float | None  # the last validation loss logged at or before `step`
    dataset: str | None  # the run's data (a source name or a prepared directory)
    # run.json's `extensions`: where the run was continued past its planned steps (--extend)
    extensions: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def tokens(self) -> int | None:
        """Training tokens seen by `step` (the plan's tokens per step times the step)."""
        per_step = self.identity.get("global_batch"), self.identity.get("sequence_length")
        return self.step * per_step[0] * per_step[1] if all(per_step) else None


def load_weights(path: Path, *, say=None, using: str = "using") -> Weights:
    """The weights of the run directory or checkpoint folder ``path`` (see the module doc).

    ``say`` receives a sentence for each newer checkpoint skipped because it does not verify
    ("...; <using> the older latest-00000002 instead.")."""
    run_dir, checkpoint, meta = find_checkpoint(Path(path), say or _say, using)
    config = _model_config(run_dir)
    state_dict = _read_state(checkpoint, meta["layout"], config)
    damaged = non_finite(state_dict)
    if damaged:
        raise UserError(f"checkpoint {checkpoint} holds non-finite weights (NaN or infinity in "
                        f"{len(damaged)} tensor(s), first {damaged[0]}), saved while the run "
                        f"diverged; name an earlier checkpoint folder of "
                        f"{run_dir / CHECKPOINTS_DIR}, or train the run again with a lower --lr.")
    return Weights(model_config=config, state_dict=state_dict, run_dir=run_dir,
                   checkpoint=checkpoint, step=int(meta.get("step", 0)),
                   layout=meta["layout"], identity=_identity(run_dir),
                   val_loss=_last_val_loss(run_dir, int(meta.get("step", 0))),
                   dataset=_dataset(run_dir),
                   extensions=_read_json(run_dir / RUN_FILE).get("extensions", []))


def non_finite(state: dict[str, torch.Tensor]) -> list[str]:
    """The names of the tensors of `state` that hold a NaN or an infinity (integer tensors never
    do), in order."""
    return [name for name, tensor in state.items()
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]


def _say(message: str) -> None:
    print(f"danastar: {message}", file=sys.stderr, flush=True)


def find_checkpoint(path: Path, say=_say, using: str = "using") -> tuple[Path, Path, dict]:
    """(run directory, checkpoint folder, its meta) for a run directory or a checkpoint folder."""
    if (path / META_FILE).is_file():
        meta, problem = verify(path)
        if meta is None:
            raise UserError(f"checkpoint {path} cannot be used ({problem}); name another "
                            f"checkpoint or the run directory.")
        return path.parent.parent, path, meta
    if not (path / CONFIG_FILE).is_file():
        raise UserError(f"{path} is neither a run directory (with {CONFIG_FILE}) nor a checkpoint "
                        f"folder (with {META_FILE}); give one of them.")
    # Not Checkpointer.find_latest: that sets corrupt checkpoints aside, and this only reads.
    skipped = []
    for candidate in reversed(checkpoint_dirs(path / CHECKPOINTS_DIR)):
        meta, problem = verify(candidate)
        if meta is not None:
            for newer, why in skipped:
                say(f"checkpoint {newer} cannot be used ({why}); {using} the older "
                    f"{candidate.name} instead.")
            return path, candidate, meta
        skipped.append((candidate, problem))
    if skipped:
        listed = "; ".join(f"{c.name}: {why}" for c, why in skipped)
        raise UserError(f"run {path} has no usable checkpoint ({listed}); train it further or "
                        f"name another checkpoint folder.")
    raise UserError(f"run {path} has no complete checkpoint yet; train it further or name a "
                    f"checkpoint folder.")


def _model_config(run_dir: Path) -> ModelConfig:
    saved = run_dir / MODEL_CONFIG_FILE
    if saved.is_file():
        try:
            return ModelConfig.from_dict(json.loads(saved.read_text()))
        except (OSError, ValueError, TypeError) as error:
            raise UserError(f"{saved} cannot be read ({error}); restore it from the run's "
                            "copy or delete it to rebuild the model from config.yaml.") from None
    # Older runs: the model config as training built it, from the run's settings and plan.
    try:
        config, _ = load_config(["--config", str(run_dir / CONFIG_FILE)])
        saved_plan = json.loads((run_dir / PLAN_FILE).read_text())
    except (OSError, ValueError) as error:
        raise UserError(f"run {run_dir} has no readable plan.json ({error}); give a run "
                        f"directory written by danastar train.") from None
    plan = make_run_plan(config, saved_plan["plan"]["vocab_size"],
                         saved_plan["batch_layout"]["data_parallel_size"])
    return model_config(config, plan)


def _read_state(checkpoint: Path, layout: str, config: ModelConfig) -> dict[str, torch.Tensor]:
    if layout == "single":
        state = torch.load(checkpoint / STATE_FILE, map_location="cpu", weights_only=False)
        return state["model"]
    # DCP fills tensors of the right shapes in place: the model's own, built without memory
    template = build_meta_model(config).state_dict()
    weights = {"model": {name: torch.empty_like(tensor, device="cpu")
                         for name, tensor in template.items()}}
    dcp, _, _ = distributed_checkpoint()
    with warnings.catch_warnings():  # "assuming ... a single process": that is the intent
        warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
        dcp.load(weights, checkpoint_id=str(checkpoint))
    return weights["model"]


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _identity(run_dir: Path) -> dict[str, Any]:
    return _read_json(run_dir / RUN_FILE).get("identity", {})


def _dataset(run_dir: Path) -> str | None:
    """The run's ``data.dataset`` setting, from its config.yaml (every run directory has one)."""
    try:
        settings = yaml.safe_load((run_dir / CONFIG_FILE).read_text()) or {}
    except (OSError, yaml.YAMLError):
        settings = {}
    return (settings.get("data") or {}).get("dataset") or _identity(run_dir).get("dataset")


def _last_val_loss(run_dir: Path, step: int) -> float | None:
    try:
        logged = metrics.records(run_dir / METRICS_FILE)
    except OSError:
        return None
    losses = [record["val_loss"] for record in logged
              if "val_loss" in record and record.get("step", 0) <= step]
    return losses[-1] if losses else None
