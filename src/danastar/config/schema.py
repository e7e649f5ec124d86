"""The configuration's schema: one dataclass per section under `TrainConfig`, with the defaults
(the paper's launcher defaults), and the command line's flags, each mapped to its dotted key. The
model's options come from the model's own dataclasses (`danastar.models.config`): their defaults,
and for the mixture of experts the release's flag names, help and run-name tags."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from danastar.models import ModelConfig
from danastar.models.config import LADDERS, MoEConfig, option
from danastar.scaling import DEFAULT_OMEGA

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "configs"  # the presets, in the package
DEFAULT_PRESET = "cpu_shakespeare"


def model_default(name: str) -> Any:
    """A ModelConfig option's default: the model's dataclass states it, the section follows."""
    return next(f.default for f in dataclasses.fields(ModelConfig) if f.name == name)


@dataclass(frozen=True)
class MoESection(MoEConfig):
    """The model's mixture of experts (docs/moe.md) and what only the run reads: whether it is
    on, the routing, which count the token budget is of, and two flags of the release that it
    accepts and never reads."""

    enabled: bool = option(False, "moe", "mixture of experts in the blocks (docs/moe.md)")
    routing: str = option("standard_gating", "moe_routing",
                          "standard_gating (expert_choice is not built)")
    budget: str = option("active", "moe_budget", "MoE token budget: active (20 x (active + "
                         "embedding) params) | total", tag="budget")
    mlp_dim_exp_factor: float = option(1.0, "mlp_dim_exp_factor",
                                       "accepted as in the release, which never reads it")
    plot_router_logits: bool = option(False, "plot_router_logits", "accepted as in the "
                                      "release; the expert load is always logged")

    def model_moe(self) -> Optional[MoEConfig]:
        """The model's MoEConfig (None: dense)."""
        if not self.enabled:
            return None
        return MoEConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(MoEConfig)})


@dataclass
class ModelSection:
    arch: str = "enoki"  # one of danastar.models.config.LADDERS
    heads: int = 3  # every dimension follows from this through the scaling plan
    n_layer: Optional[int] = None  # explicit dimensions override what --heads implies
    n_embd: Optional[int] = None
    n_head: Optional[int] = None
    z_loss: float = model_default("z_loss")
    init: str = model_default("init")
    tie_embeddings: bool = model_default("tie_embeddings")
    residual_scale: float = model_default("residual_scale")
    moe: MoESection = field(default_factory=MoESection)


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
    # The optimizer state's dtype: float32, or bfloat16 with stochastic rounding (danastar's own
    # optimizers only; see docs/optimizers.md).
    state_dtype: str = "float32"
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
    # Continuing a run past the iterations it was planned for (docs/training.md, "Extending a
    # run"): the LR schedule's rule (None: none asked for, so a longer --iterations that would
    # change the schedule's past is refused), the weight decay's rule, and rewarm's climb.
    extend: Optional[str] = None  # stretch | reanchor | rewarm
    # keep | reanchor | planned; None: the measured best for the run's decay (`extend_decay_rule`)
    extend_decay: Optional[str] = None
    extend_rewarm: Optional[int] = None  # steps back up to the peak (None: the run's warm-up)


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
    # A `danastar export` directory whose weights a fresh run starts from (a resume ignores it:
    # the checkpoint holds the weights); the model flags must define the exported model.
    init_from: Optional[str] = None


@dataclass
class DataSection:
    dataset: str = (
        # a prepared directory, `shakespeare` or `prose` (prepared on first use), or `synthetic`
        "shakespeare"
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


# The LR rule of a bare `--extend`: the one measured best for a run that finished its schedule
# (docs/study-extend.md); the decay's default is `train.identity.extend_decay_rule`.
EXTEND_DEFAULT_RULE = "rewarm"
# Flags that may be given without a value: the value they then take, and what --help calls it.
BARE_FLAGS = {"extend": (EXTEND_DEFAULT_RULE, "RULE")}

# The original release's flags (and a few new ones), each mapped to its dotted key.
FLAGS: dict[str, tuple[str, type, str]] = {
    "arch": ("model.arch", str, "model architecture: " + "; ".join(
        f"{name}, {ladder.summary}" for name, ladder in LADDERS.items())),
    "heads": ("model.heads", int, "attention heads; sets every size, LR and WD, and with "
              "--dataset (no --config) the Chinchilla budget too"),
    "opt": ("optim.name", str, "optimizer name (adana, dana-mk4, dana-star-mk4, adamw, ...)"),
    "lr": ("optim.lr", float, "peak learning rate (default: the fitted law)"),
    "kappa": ("optim.kappa", float, "DANA log-time exponent κ"),
    "delta": ("optim.delta", float, "DANA damping δ"),
    "omega": ("optim.omega", float, "weight-decay strength ω"),
    "clipsnr": ("optim.clipsnr", float, "SNR clip of the *-mk4 optimizers"),
    "state_dtype": ("optim.state_dtype", str, "optimizer state dtype: float32 | bfloat16 "
                    "(stochastically rounded; danastar's own optimizers)"),
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
    "extend": ("optim.extend", str, "continue a stopped or finished run to a longer --iterations "
               "by this LR-schedule rule: stretch | reanchor | rewarm (--extend alone: "
               f"{EXTEND_DEFAULT_RULE}, measured best for a run that finished its schedule; none: "
               "refused where the schedule's past depends on the total)"),
    "extend_decay": ("optim.extend_decay", str, "with --extend, the weight decay's rule: "
                     "keep | reanchor (a log-time decay) | planned (default: keep for a "
                     "log-time decay, planned for AdamW's coupled one, as measured best)"),
    "extend_rewarm": ("optim.extend_rewarm", int, "with --extend rewarm, the steps back up to "
                      "the peak LR (the run's warm-up, or a 50th of the steps left where it had "
                      "none)"),
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
        "a prepared data directory, `shakespeare` or `prose` (prepared on first use), or "
        "`synthetic`",
    ),
    "run_dir": ("logging.run_dir", str, "where the run directory goes"),
    "init_from": ("train.init_from", str, "start from the weights of a `danastar export` "
                  "directory (Hugging Face format) instead of a random initialisation; the "
                  "model flags must define the exported model"),
}


# Switches (store_true), each mapped to its dotted key (the MoE ones are added below).
SWITCHES: dict[str, tuple[str, str]] = {}


def value_kind(hint: Any) -> tuple[type, bool]:
    """A field's type as values are read by it (tuple: whole numbers separated by commas), and
    whether it may be None."""
    if typing.get_origin(hint) is tuple:
        return tuple, False
    args = typing.get_args(hint)
    concrete = [arg for arg in args if arg is not type(None)]
    return (concrete[0] if concrete else hint), len(concrete) < len(args)


def moe_options(switches: bool) -> dict[str, tuple]:
    """The mixture of experts' flags (docs/moe.md) by the release's names, which its fields
    carry: the switches (flag → key, help) or the others (flag → key, type, help)."""
    hints = typing.get_type_hints(MoESection)
    options = {}
    for f in dataclasses.fields(MoESection):
        kind = value_kind(hints[f.name])[0]
        if (kind is bool) == switches:
            key, doc = f"model.moe.{f.name}", f.metadata["doc"]
            options[f.metadata["flat"]] = (key, doc) if switches else (key, kind, doc)
    return options


FLAGS.update(moe_options(switches=False))
SWITCHES.update(moe_options(switches=True))
FLAG_OF_KEY = {key: f"--{flag}" for flag, (key, _, _) in FLAGS.items()}
FLAG_OF_KEY.update({key: f"--{flag}" for flag, (key, _) in SWITCHES.items()})


def named(key: str) -> str:
    """A key as the user may have given it, e.g. `optim.lr (--lr)`."""
    flag = FLAG_OF_KEY.get(key)
    return f"{key} ({flag})" if flag else key


# The release's flat `model` keys (`moe`, `moe_num_experts`, `use_gated_shared_expert`, ...), which
# flags, presets and the config.yaml of older runs use, by the fields of `model.moe` they set.
RELEASE_MOE_KEYS = {f.metadata["flat"]: f.name for f in dataclasses.fields(MoESection)}


@lru_cache(maxsize=None)
def field_kinds(schema: type) -> dict[str, tuple[type, bool]]:
    """Each plain field of a section: (its type, whether it may be None)."""
    return {name: value_kind(hint) for name, hint in typing.get_type_hints(schema).items()}


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
