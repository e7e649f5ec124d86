"""Run configuration: nested dataclasses merged from defaults ← YAML ← flags ← dotted overrides.

One root `TrainConfig` holds a section per component. `load_config(argv)` parses the command
line of `danastar train` and returns the merged, validated config:

    defaults (the dataclasses below: the paper's launcher defaults)
      ← the YAML file given by --config; without --config and without --heads, the CPU preset
        configs/cpu_shakespeare.yaml (so that `danastar train` alone is a few-minute CPU run,
        while `danastar train --heads 12 ...` plans a paper-style run from the launcher defaults)
      ← command-line flags (the original release's names: --heads, --lr, --batch_size, ...)
      ← dotted `section.key=value` overrides, last.

Unknown keys anywhere are errors that name the closest valid key. Values left as `None` are
filled in later from the scaling plan (`--heads` → dimensions, LR, weight decay, iterations).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from danastar.errors import UserError
from danastar.models import ARCHITECTURES, ModelConfig
from danastar.optim.dana_family import DEFAULT_DELTA, DEFAULT_KAPPA
from danastar.optim.schedules import SCHEDULES
from danastar.scaling import DEFAULT_OMEGA, Plan, make_plan

CONFIGS_DIR = Path(__file__).resolve().parent / "configs"  # the presets, shipped inside the package
DEFAULT_PRESET = "cpu_shakespeare"


@dataclass
class ModelSection:
    arch: str = "enoki"  # enoki | qwen3
    heads: int = 3  # every dimension follows from this through the scaling plan
    n_layer: Optional[int] = None  # explicit dimensions override what --heads implies
    n_embd: Optional[int] = None
    n_head: Optional[int] = None
    z_loss: float = 1e-4
    init: str = "ScaledGPT"  # ScaledGPT | KarpathyGPT2
    tie_embeddings: bool = False
    residual_scale: float = 1.0


@dataclass
class OptimSection:
    name: str = "adana"  # any name build_optimizer knows
    lr: Optional[float] = None  # None: the fitted law γ*(P) of the scaling plan
    weight_decay: Optional[float] = None  # None: from omega (see the scaling plan)
    omega: float = DEFAULT_OMEGA
    kappa: float = DEFAULT_KAPPA
    delta: float = DEFAULT_DELTA
    clipsnr: Optional[float] = None  # *-mk4 optimizers only; None: their default 2.0
    grad_clip: float = 0.5  # global L2 norm; 0 disables clipping (the norm is still logged)
    scheduler: str = "cos_inf"
    warmup_steps: Optional[int] = None  # None: iterations // 50


@dataclass
class TrainSection:
    iterations: Optional[int] = None  # None: the Chinchilla budget of the scaling plan
    iterations_to_run: Optional[int] = None  # stop cleanly after this many steps of this process
    batch_size: int = 32  # GLOBAL sequences per micro-step, split over the data-parallel ranks
    acc_steps: int = 1  # micro-steps per optimizer step; global batch = batch_size × acc_steps
    sequence_length: int = 2048
    seed: int = 0
    eval_interval: int = 115
    eval_batches: int = 64  # fixed validation batches at each periodic evaluation
    final_eval_batches: Optional[int] = None  # None: the whole validation set at the end
    log_interval: int = 10
    max_nonfinite_steps: int = 10  # stop after this many non-finite steps in a row
    device: str = "auto"  # auto | cpu | cuda
    autocast: str = "auto"  # auto (bf16 on CUDA, off on CPU) | bf16 | off
    compile: bool = False
    peak_flops: Optional[float] = None  # device peak for MFU; None: looked up from the device name
    sample_tokens: int = 200  # a generated sample printed at the end; 0 disables
    sample_prompt: str = "\n"


@dataclass
class DataSection:
    dataset: str = (
        "shakespeare"  # a prepared directory, `shakespeare` (prepared on first use), or `synthetic`
    )
    data_seed: Optional[int] = None  # None: train.seed


@dataclass
class ParallelSection:
    nproc: int = 1  # processes on this machine; >1 launches torchrun
    backend: str = "auto"  # auto (single or ddp) | single | ddp | fsdp | zero2 | hsdp
    tp_size: int = 1  # tensor-parallel degree, composed with FSDP2
    hsdp_replicas: int = 1  # replicate groups of an HSDP mesh (shard within each)
    activation_checkpointing: int = 0  # checkpoint every n-th block; 0 disables
    reduce_dtype: str = (
        "auto"  # FSDP gradient reduction: auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32
    )


@dataclass
class CheckpointSection:
    latest_every: int = 100  # write `latest` every N steps; -1 disables
    permanent_every: int = 0  # keep a permanent checkpoint every M steps; 0 disables
    keep_latest: int = 2  # latest checkpoints kept, so a corrupt one can be skipped
    auto_resume: bool = True


@dataclass
class LoggingSection:
    run_dir: Optional[str] = None  # None: runs/<name from the run's meaning> (default_run_dir)
    wandb: bool = False
    wandb_project: str = "danastar"
    wandb_offline: bool = False  # also honoured: WANDB_MODE=offline
    tensorboard: bool = False
    progress: bool = True


@dataclass
class TrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    optim: OptimSection = field(default_factory=OptimSection)
    train: TrainSection = field(default_factory=TrainSection)
    data: DataSection = field(default_factory=DataSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    logging: LoggingSection = field(default_factory=LoggingSection)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# The original release's flags (and a few new ones), each mapped to its dotted key.
FLAGS: dict[str, tuple[str, type, str]] = {
    "arch": ("model.arch", str, "model architecture: enoki | qwen3"),
    "heads": ("model.heads", int, "attention heads; sets every size, LR, WD and budget"),
    "opt": ("optim.name", str, "optimizer name (adana, dana-mk4, dana-star-mk4, adamw, ...)"),
    "lr": ("optim.lr", float, "peak learning rate (default: the fitted law)"),
    "kappa": ("optim.kappa", float, "DANA log-time exponent κ"),
    "delta": ("optim.delta", float, "DANA damping δ"),
    "omega": ("optim.omega", float, "weight-decay strength ω"),
    "clipsnr": ("optim.clipsnr", float, "SNR clip of the *-mk4 optimizers"),
    "grad_clip": ("optim.grad_clip", float, "global gradient-norm clip (0 disables)"),
    "scheduler": (
        "optim.scheduler",
        str,
        "LR schedule: cos_inf | cos | linear | wsd | powerlaw | none",
    ),
    "warmup_steps": ("optim.warmup_steps", int, "warm-up steps (default: iterations // 50)"),
    "iterations": ("train.iterations", int, "optimizer steps (default: the Chinchilla budget)"),
    "iterations_to_run": (
        "train.iterations_to_run",
        int,
        "stop cleanly after N steps of this process",
    ),
    "batch_size": ("train.batch_size", int, "GLOBAL sequences per micro-step, split over ranks"),
    "acc_steps": ("train.acc_steps", int, "gradient-accumulation micro-steps per optimizer step"),
    "sequence_length": ("train.sequence_length", int, "tokens per sequence"),
    "seed": ("train.seed", int, "random seed (model init and data order)"),
    "eval_interval": ("train.eval_interval", int, "evaluate every N steps"),
    "log_interval": ("train.log_interval", int, "log training metrics every N steps"),
    "nproc": ("parallel.nproc", int, "processes on this machine (launches torchrun when > 1)"),
    "distributed_backend": ("parallel.backend", str, "auto | single | ddp | fsdp | zero2 | hsdp"),
    "dataset": (
        "data.dataset",
        str,
        "a prepared data directory, `shakespeare` (prepared on first use) or `synthetic`",
    ),
    "run_dir": ("logging.run_dir", str, "where the run directory goes"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="danastar train",
        description="Train a language model. With no arguments: a small Enoki model with ADana on "
        "the embedded Shakespeare corpus, on the CPU, in a few minutes.",
        epilog="Any config key can also be set as section.key=value, e.g. train.eval_batches=8 "
        "checkpoint.latest_every=50. See docs/training.md.",
        argument_default=argparse.SUPPRESS,  # only flags actually given take part in the merge
    )
    parser.add_argument(
        "--config",
        help="YAML config file or preset name from configs/ (without --config and --heads: "
             "cpu_shakespeare)",
    )
    parser.add_argument(
        "--dry_run", action="store_true", help="print the resolved plan as JSON and exit"
    )
    for flag, (_, kind, help_text) in FLAGS.items():
        parser.add_argument(f"--{flag}", type=kind, help=help_text)
    parser.add_argument(
        "--no_wandb", dest="wandb", action="store_false", help="disable Weights & Biases"
    )
    parser.add_argument(
        "--wandb", dest="wandb", action="store_true", help="log to Weights & Biases"
    )
    parser.add_argument(
        "--auto_resume",
        dest="auto_resume",
        action="store_true",
        help="resume from the run directory's latest good checkpoint (the default)",
    )
    parser.add_argument(
        "--no_auto_resume",
        dest="auto_resume",
        action="store_false",
        help="start afresh even if the run directory holds checkpoints",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="section.key=value", help="dotted overrides"
    )
    return parser


def preset_path(name_or_path: str) -> Path:
    """A YAML file by path, or a preset name from configs/ (e.g. `cpu_shakespeare`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    candidate = CONFIGS_DIR / f"{name_or_path.removesuffix('.yaml')}.yaml"
    if candidate.is_file():
        return candidate
    raise UserError(
        f"config file {name_or_path!r} does not exist; pass a YAML path or a preset name from "
        "configs/."
    )


def load_config(argv: list[str]) -> tuple[TrainConfig, argparse.Namespace]:
    """Parse `danastar train` arguments into a merged, validated config (plus the raw namespace)."""
    args = build_parser().parse_intermixed_args(argv)
    flags, dotted = flags_to_dict(args), dotted_to_dict(getattr(args, "overrides", []))
    config_file = getattr(args, "config", None)
    if (
        config_file is None
        and "heads" not in flags.get("model", {})
        and "heads" not in dotted.get("model", {})
    ):
        config_file = DEFAULT_PRESET  # no --config and no --heads: the CPU run on Shakespeare
    layers = [read_yaml(preset_path(config_file))] if config_file else []
    return merge([*layers, flags, dotted]), args


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise UserError(
            f"config file {path} is not valid YAML ({str(error).splitlines()[0]}); fix its syntax."
        ) from None
    if not isinstance(loaded, dict):
        raise UserError(
            f"config file {path} must hold a mapping of sections (model:, optim:, train:, ...)."
        )
    return loaded


def flags_to_dict(args: argparse.Namespace) -> dict[str, Any]:
    dotted = {FLAGS[flag][0]: value for flag, value in vars(args).items() if flag in FLAGS}
    if hasattr(args, "wandb"):
        dotted["logging.wandb"] = args.wandb
    if hasattr(args, "auto_resume"):
        dotted["checkpoint.auto_resume"] = args.auto_resume
    return nest(dotted)


def dotted_to_dict(overrides: list[str]) -> dict[str, Any]:
    dotted = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(
                f"cannot read {item!r}; overrides are written section.key=value (e.g. "
                "train.seed=1)."
            )
        dotted[key.strip()] = yaml.safe_load(value) if value.strip() else None
    return nest(dotted)


def nest(dotted: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in dotted.items():
        *sections, leaf = key.split(".")
        node = nested
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return nested


def merge(layers: list[dict[str, Any]]) -> TrainConfig:
    """Merge the layers over the dataclass defaults, strictly, and validate the result."""
    merged = OmegaConf.structured(TrainConfig)
    for layer in layers:
        check_keys(layer, TrainConfig)
        try:
            merged = OmegaConf.merge(merged, OmegaConf.create(layer))
        except OmegaConfBaseException as error:
            key = getattr(error, "full_key", "") or "a config value"
            reason = str(error).splitlines()[0]
            raise UserError(
                f"{key} has the wrong type ({reason}); give a value of the declared type."
            ) from None
    config = OmegaConf.to_object(merged)
    validate(config)
    return config


def check_keys(layer: dict[str, Any], schema: type, prefix: str = "") -> None:
    """Unknown keys fail with the closest valid key, e.g. `train.iteratons` → `train.iterations`."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key, value in layer.items():
        if key not in fields:
            valid = [f"{prefix}{name}" for name in fields]
            close = difflib.get_close_matches(f"{prefix}{key}", valid + all_keys(), n=1, cutoff=0.6)
            hint = (
                f"did you mean {close[0]!r}?" if close else f"valid keys here: {', '.join(valid)}."
            )
            raise UserError(f"unknown config key '{prefix}{key}'; {hint}")
        section = section_type(fields[key])
        if section is not None:
            if not isinstance(value, dict):
                raise UserError(
                    f"{prefix}{key} is a section; give it as a mapping of keys, not {value!r}."
                )
            check_keys(value, section, f"{prefix}{key}.")


def section_type(f: dataclasses.Field) -> Optional[type]:
    """The dataclass of a nested section, or None for a plain value."""
    factory = f.default_factory
    return (
        factory
        if factory is not dataclasses.MISSING and dataclasses.is_dataclass(factory)
        else None
    )


def all_keys(schema: type = TrainConfig, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(schema):
        section = section_type(f)
        keys += all_keys(section, f"{prefix}{f.name}.") if section else [f"{prefix}{f.name}"]
    return keys


BACKENDS = ("auto", "single", "ddp", "fsdp", "zero2", "hsdp")


def validate(config: TrainConfig) -> None:
    """Checks that need no world size; the batch layout is checked by `batch_layout`."""
    choose("model.arch", config.model.arch, ARCHITECTURES)
    choose("parallel.backend", config.parallel.backend, BACKENDS)
    choose("train.device", config.train.device, ("auto", "cpu", "cuda"))
    choose("train.autocast", config.train.autocast, ("auto", "bf16", "off"))
    choose("parallel.reduce_dtype", config.parallel.reduce_dtype, ("auto", "bf16", "fp32"))
    choose("optim.scheduler", config.optim.scheduler, tuple(SCHEDULES))
    positive = {
        "model.heads": config.model.heads,
        "train.batch_size": config.train.batch_size,
        "train.acc_steps": config.train.acc_steps,
        "train.sequence_length": config.train.sequence_length,
        "train.eval_interval": config.train.eval_interval,
        "train.log_interval": config.train.log_interval,
        "train.eval_batches": config.train.eval_batches,
        "parallel.nproc": config.parallel.nproc,
        "parallel.tp_size": config.parallel.tp_size,
        "parallel.hsdp_replicas": config.parallel.hsdp_replicas,
        "train.max_nonfinite_steps": config.train.max_nonfinite_steps,
        "checkpoint.keep_latest": config.checkpoint.keep_latest,
    }
    for key, value in positive.items():
        if value < 1:
            raise UserError(f"{key} must be at least 1 (got {value}).")
    for key, value in {
        "train.iterations": config.train.iterations,
        "train.iterations_to_run": config.train.iterations_to_run,
    }.items():
        if value is not None and value < 1:
            raise UserError(
                f"{key} must be at least 1 (got {value}); leave it unset for the default."
            )
    if config.checkpoint.latest_every == 0 or config.checkpoint.latest_every < -1:
        raise UserError(
            "checkpoint.latest_every must be a positive number of steps, or -1 to disable."
        )
    if config.parallel.tp_size > 1 and config.parallel.backend not in ("fsdp", "zero2", "hsdp"):
        raise UserError(
            "tensor parallelism composes with FSDP2; add --distributed_backend fsdp (or zero2, "
            "hsdp)."
        )
    if config.parallel.hsdp_replicas > 1 and config.parallel.backend != "hsdp":
        raise UserError("parallel.hsdp_replicas needs --distributed_backend hsdp.")


def choose(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        close = difflib.get_close_matches(value, choices, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"choose one of: {', '.join(choices)}."
        raise UserError(f"{key} {value!r} is not known; {hint}")


@dataclass(frozen=True)
class BatchLayout:
    """How the global batch is split: the user states it once, the code divides it."""

    world_size: int
    data_parallel_size: int  # ranks that see different data (world / tp_size)
    global_batch: int  # sequences per optimizer step = batch_size × acc_steps
    micro_batch_per_rank: int  # sequences per rank per micro-step
    acc_steps: int
    sequence_length: int

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.sequence_length

    def to_dict(self) -> dict[str, int]:
        return {**dataclasses.asdict(self), "tokens_per_step": self.tokens_per_step}


def batch_layout(config: TrainConfig, world_size: int) -> BatchLayout:
    """Split `--batch_size` (global, per micro-step) over the data-parallel ranks, or say why
    not."""
    tp, replicas = config.parallel.tp_size, config.parallel.hsdp_replicas
    if world_size % tp:
        raise UserError(
            f"parallel.tp_size {tp} does not divide the world of {world_size} processes; "
            f"choose a tp_size that divides it."
        )
    data_parallel = world_size // tp
    if data_parallel % replicas:
        raise UserError(
            f"parallel.hsdp_replicas {replicas} does not divide the {data_parallel} data-parallel "
            f"ranks; choose a divisor."
        )
    batch = config.train.batch_size
    if batch % data_parallel:
        raise UserError(
            f"--batch_size {batch} (global sequences per micro-step) does not split over "
            f"{data_parallel} data-parallel ranks; use a multiple of {data_parallel}."
        )
    return BatchLayout(
        world_size,
        data_parallel,
        batch * config.train.acc_steps,
        batch // data_parallel,
        config.train.acc_steps,
        config.train.sequence_length,
    )


def default_run_dir(config: TrainConfig) -> Path:
    """runs/<name>, the name made from what the run means: dataset, architecture, heads (and any
    explicit dimension), optimizer and every setting given away from its default, global batch,
    schedule and seed. Never the world size, the micro-batch split or the cluster, so that a run
    moved to another GPU count or cluster finds its checkpoints again."""
    dataset = Path(config.data.dataset).name or "data"
    model, optim, train = config.model, config.optim, config.train
    parts = [dataset, model.arch, f"h{model.heads}"]
    parts += [f"{key}{getattr(model, key)}" for key in ("n_layer", "n_embd", "n_head")
              if getattr(model, key) is not None]
    parts.append(optim.name)
    defaults = OptimSection()
    short = {"lr": "lr", "weight_decay": "wd", "omega": "om", "kappa": "k", "delta": "d",
             "clipsnr": "snr", "warmup_steps": "wu"}
    parts += [f"{tag}{getattr(optim, key):g}" for key, tag in short.items()
              if getattr(optim, key) is not None and getattr(optim, key) != getattr(defaults, key)]
    parts += [f"b{train.batch_size * train.acc_steps}x{train.sequence_length}", optim.scheduler]
    parts.append(f"s{train.seed}")  # not the iterations: extending a run keeps its directory
    return Path("runs") / "-".join(parts)


def save_yaml(config: TrainConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))


def model_config(config: TrainConfig, plan: Plan) -> ModelConfig:
    """The plan's model (its shape) with the options of the `model` section."""
    model = config.model
    return plan.model_config(
        z_loss=model.z_loss,
        init=model.init,
        tie_embeddings=model.tie_embeddings,
        residual_scale=model.residual_scale,
    )


def make_run_plan(config: TrainConfig, vocab_size: int, data_parallel_size: int) -> Plan:
    """The scaling plan of this run: what `--heads` implies, with explicit settings taking
    precedence."""
    overrides = {
        "lr": config.optim.lr,
        "weight_decay": config.optim.weight_decay,
        "warmup_steps": config.optim.warmup_steps,
        "iterations": config.train.iterations,
        "n_layer": config.model.n_layer,
        "n_embd": config.model.n_embd,
        "n_head": config.model.n_head,
    }
    try:
        return make_plan(
            config.model.arch,
            config.optim.name,
            config.model.heads,
            batch_size=config.train.batch_size,
            acc_steps=config.train.acc_steps,
            seq_len=config.train.sequence_length,
            vocab_size=vocab_size,
            world_size=data_parallel_size,
            kappa=config.optim.kappa,
            delta=config.optim.delta,
            omega=config.optim.omega,
            clipsnr=config.optim.clipsnr,
            **{key: value for key, value in overrides.items() if value is not None},
        )
    except ValueError as error:
        raise UserError(f"{str(error).rstrip('.')}.") from None
