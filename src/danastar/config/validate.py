"""Validation of a merged configuration: every value training could not honour is refused, with
one sentence naming the fix, before anything is planned, started or written. What needs the world
size is checked by `plan.batch_layout`, what needs the model's shape by `plan.make_run_plan`."""

from __future__ import annotations

import dataclasses
import difflib
import math
from itertools import chain
from typing import Any

from danastar.config.schema import OptimSection, TrainConfig, model_default, named
from danastar.errors import UserError
from danastar.models import ARCHITECTURES
from danastar.models.config import MOE_FLAT_NAMES, arch_defaults, check_options
from danastar.optim import registry
from danastar.optim.base import STATE_DTYPES
from danastar.optim.extension import DECAY_RULES
from danastar.optim.schedules import DECAY_TYPES, LR_RULES, SCHEDULE_OPTIONS, SCHEDULES
from danastar.scaling import MOE_BUDGETS, optimizers


def resolve_architecture(config: TrainConfig) -> None:
    """What an architecture fixes (its ladder's defaults), set in the config so that config.yaml
    and the dry run show it: `qwen3next` is a MoE model (the release builds it dense without
    --moe; here it implies it), and `llama` always ties its embeddings and has no z-loss, as in
    the release. A value given against it is refused rather than silently replaced."""
    model = config.model
    if model.arch not in ARCHITECTURES:
        return  # `validate` names the valid ones
    for name, value in arch_defaults(model.arch).items():
        if name == "moe":
            model.moe = dataclasses.replace(model.moe, enabled=True)
            continue
        given = getattr(model, name)
        if given not in (value, model_default(name)):
            raise UserError(f"--arch {model.arch} fixes model.{name} at {value!r}, as in the "
                            f"release (model.{name} {given!r} given); drop model.{name}.")
        setattr(model, name, value)


BACKENDS = ("auto", "single", "ddp", "fsdp", "zero2", "hsdp")
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
    ("model.moe.mlp_dim_exp_factor", *POSITIVE, "it has no effect, as in the release"),
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


def value_at(config: Any, key: str) -> Any:
    for name in key.split("."):
        config = getattr(config, name)
    return config


def validate(config: TrainConfig) -> None:
    """Everything that needs neither the world size nor the plan: the batch layout is checked by
    `batch_layout`, what depends on the model's shape by `make_run_plan`."""
    check_choices(config)
    check_numbers(config)
    check_schedule_options(config)
    check_paths_and_cadence(config)
    check_parallel(config)
    check_moe(config)
    check_expert_parallel(config)


def check_choices(config: TrainConfig) -> None:
    """Each named choice (architecture, init, backend, device, optimizer, schedule, ...)."""
    choose("model.arch", config.model.arch, ARCHITECTURES)
    model = config.model
    try:
        check_options(model.init, model.z_loss, model.residual_scale, name=lambda f: f"model.{f}")
    except ValueError as error:
        raise UserError(str(error)) from None
    choose("parallel.backend", config.parallel.backend, BACKENDS)
    choose("train.device", config.train.device, ("auto", "cpu", "cuda"))
    if config.train.collect_tau_stats and not config.optim.name.startswith("dana-star"):
        raise UserError(f"--collect_tau_stats needs a Dana-Star optimizer (dana-star or "
                        f"dana-star-mk4), not {config.optim.name}; drop it or change --opt.")
    choose("train.autocast", config.train.autocast, ("auto", "bf16", "off"))
    choose("parallel.reduce_dtype", config.parallel.reduce_dtype, ("auto", "bf16", "fp32"))
    choose("optim.scheduler", config.optim.scheduler, tuple(SCHEDULES))
    choose("optim.decay_type", config.optim.decay_type, tuple(DECAY_TYPES))
    if config.optim.extend is not None:
        choose("optim.extend", config.optim.extend, LR_RULES)
    if config.optim.extend_decay is not None:
        choose("optim.extend_decay", config.optim.extend_decay, DECAY_RULES)
    if config.optim.extend_rewarm is not None and config.optim.extend != "rewarm":
        rule = f"--extend {config.optim.extend}" if config.optim.extend else "no --extend"
        raise UserError(f"--extend_rewarm sets how many steps --extend rewarm climbs back to the "
                        f"peak LR, and this run continues by {rule}; pass --extend rewarm, or "
                        f"drop --extend_rewarm.")
    if not registry.is_prefixed(config.optim.name):
        choose("optim.name (--opt)", config.optim.name, tuple(optimizers()),
               also="torch:<Name> or pytorch_optimizer:<name>")
    choose("optim.state_dtype", config.optim.state_dtype, tuple(STATE_DTYPES))
    if config.optim.state_dtype != "float32" and not registry.takes_state_dtype(
            config.optim.name):
        raise UserError(f"--state_dtype {config.optim.state_dtype} needs one of danastar's own "
                        f"optimizers ({', '.join(registry.state_dtype_optimizers())}), not "
                        f"{config.optim.name}; drop it or change --opt.")


def check_numbers(config: TrainConfig) -> None:
    """Each number of NUMBER_RULES that is set."""
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


def check_paths_and_cadence(config: TrainConfig) -> None:
    if not config.data.dataset.strip():
        raise UserError("data.dataset (--dataset) is empty; give a prepared data directory, "
                        "shakespeare, prose or synthetic.")
    if config.logging.run_dir is not None and not config.logging.run_dir.strip():
        raise UserError("logging.run_dir (--run_dir) is empty; give a directory, or leave it "
                        "unset for runs/<dataset>-<arch>-<opt>-h<heads>-s<seed>.")
    if config.train.init_from is not None and not config.train.init_from.strip():
        raise UserError("train.init_from (--init_from) is empty; give a directory that "
                        "`danastar export` wrote, or leave it unset for a random start.")
    if config.checkpoint.latest_every == 0 or config.checkpoint.latest_every < -1:
        raise UserError(
            "checkpoint.latest_every must be a positive number of steps, or -1 to disable."
        )


def check_parallel(config: TrainConfig) -> None:
    """Tensor parallelism and HSDP replicas need their backends."""
    if config.parallel.tp_size > 1 and config.parallel.backend not in ("fsdp", "zero2", "hsdp"):
        raise UserError(
            "tensor parallelism composes with FSDP2; add --distributed_backend fsdp (or zero2, "
            "hsdp)."
        )
    if config.parallel.hsdp_replicas > 1 and config.parallel.backend != "hsdp":
        raise UserError("parallel.hsdp_replicas needs --distributed_backend hsdp.")


# The ModelConfig's MoE fields by their flat names, as run identities record them.
MODEL_MOE_FIELDS = ("moe", *MOE_FLAT_NAMES)


def flag_name(flat: str) -> str:
    """A setting as the command line says it (`--moe_num_experts`)."""
    return f"--{flat}"


def check_moe(config: TrainConfig) -> None:
    """The mixture-of-experts settings, each refusal one sentence, before any model exists (what
    needs the number of layers is checked by `check_plan`)."""
    moe = config.model.moe
    if not moe.enabled:
        given = [f.name for f in dataclasses.fields(moe)
                 if f.name != "enabled" and getattr(moe, f.name) != f.default]
        if given:
            raise UserError(f"{named('model.moe.' + given[0])} configures a mixture of experts; "
                            f"add --moe (or drop it).")
        return
    if moe.routing == "expert_choice":
        raise UserError("--moe_routing expert_choice is not built (the release builds it only "
                        "for a model danastar does not have); use standard_gating.")
    choose(named("model.moe.routing"), moe.routing, ("standard_gating",))
    choose(named("model.moe.budget"), moe.budget, MOE_BUDGETS)
    try:
        moe.check(config.model.arch, name=flag_name)
    except ValueError as error:
        raise UserError(str(error)) from None
    if config.parallel.tp_size > 1:
        raise UserError("tensor parallelism with MoE is not supported, as in the release; use "
                        "FSDP or --ep_size.")


def config_notes(config: TrainConfig) -> list[str]:
    """What the run should say about settings it accepts but treats specially."""
    moe, notes = config.model.moe, []
    if moe.mlp_dim_exp_factor != 1.0:
        notes.append(f"--mlp_dim_exp_factor {moe.mlp_dim_exp_factor:g} has no effect: each "
                     f"expert is the full MLP (the release parses the flag and never reads it).")
    if moe.plot_router_logits:
        notes.append("--plot_router_logits: the per-layer expert load is logged in "
                     "metrics.jsonl at every log interval (moe_load); no plot is made.")
    return notes


def check_expert_parallel(config: TrainConfig) -> None:
    """--ep_size splits the routed experts of a MoE model over data-parallel ranks (what needs
    the world size is checked by `batch_layout`)."""
    ep, moe = config.parallel.ep_size, config.model.moe
    capacity = moe.expert_capacity_factor
    if ep == 1 and capacity and moe.enabled:  # without --moe the MoE-flag check says it
        raise UserError(f"--moe_expert_capacity_factor {capacity:g} caps the buffers of expert "
                        f"parallelism, which is off; add --ep_size N (N > 1) or drop the flag.")
    if ep == 1:
        return
    if not moe.enabled:
        raise UserError(f"--ep_size {ep} splits the experts of a MoE model; add --moe or drop "
                        f"--ep_size.")
    # tensor parallelism with MoE is refused by `check_moe`, as in the release
    if config.parallel.backend == "hsdp":
        raise UserError("expert parallelism does not compose with HSDP; use --distributed_backend "
                        "fsdp (or ddp) with --ep_size.")
    routed = moe.routed_experts
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
