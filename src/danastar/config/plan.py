"""A configuration's plan: how the global batch splits over the ranks (`BatchLayout`), the
scaling plan with explicit settings taking precedence (`make_run_plan`), the model it builds,
and what the plan says about reading the corpus (epochs, repetition)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from danastar.config.schema import TrainConfig, named
from danastar.config.validate import flag_name
from danastar.errors import UserError
from danastar.models import ModelConfig
from danastar.models.config import dimensions
from danastar.scaling import Plan, PlanRequest, plan_for, useful_epochs


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


def model_options(config: TrainConfig) -> dict:
    """The `model` section's options of the model itself (a plan's model carries them, so that
    the model a plan counts is the one training builds)."""
    model = config.model
    options = {"z_loss": model.z_loss, "init": model.init,
               "tie_embeddings": model.tie_embeddings, "residual_scale": model.residual_scale}
    return {**options, "moe": model.moe.model_moe()} if model.moe.enabled else options


def model_config(config: TrainConfig, plan: Plan) -> ModelConfig:
    """The plan's model (its shape and mixture of experts) with the options of the `model`
    section."""
    return plan.model_config(**{name: value for name, value in model_options(config).items()
                                if name != "moe"})


def check_moe_layers(config: TrainConfig) -> None:
    """`--mlp_only_layers` names layers of the planned model and leaves at least one MoE layer."""
    model = config.model
    if not model.moe.enabled or not model.moe.mlp_only_layers:
        return
    n_layer = model.n_layer
    if n_layer is None:
        try:
            n_layer = dimensions(model.arch, model.heads)["n_layer"]
        except ValueError:
            return  # the plan says what is wrong with the heads
    try:
        model.moe.check(model.arch, n_layer, name=flag_name)
    except ValueError as error:
        raise UserError(str(error)) from None


def make_run_plan(config: TrainConfig, vocab_size: int, data_parallel_size: int) -> Plan:
    """The scaling plan of this run: what `--heads` implies, with explicit settings taking
    precedence."""
    check_moe_layers(config)
    try:
        plan = plan_for(plan_request(config, vocab_size, data_parallel_size))
    except ValueError as error:
        raise UserError(f"{str(error).rstrip('.')}.") from None
    check_plan(config, plan)
    return plan


def plan_request(config: TrainConfig, vocab_size: int, data_parallel_size: int) -> PlanRequest:
    """What this run asks of the scaling plan: its settings, each given ones an override."""
    overrides = {
        "lr": config.optim.lr,
        "weight_decay": config.optim.weight_decay,
        "warmup_steps": config.optim.warmup_steps,
        "iterations": config.train.iterations,
        "n_layer": config.model.n_layer,
        "n_embd": config.model.n_embd,
        "n_head": config.model.n_head,
    }
    return PlanRequest(
        config.model.arch, config.optim.name, config.model.heads,
        batch_size=config.train.batch_size, acc_steps=config.train.acc_steps,
        seq_len=config.train.sequence_length, vocab_size=vocab_size,
        world_size=data_parallel_size, kappa=config.optim.kappa, delta=config.optim.delta,
        omega=config.optim.omega, clipsnr=config.optim.clipsnr,
        model_options=model_options(config), moe_budget=config.model.moe.budget,
        overrides={key: value for key, value in overrides.items() if value is not None})


def check_plan(config: TrainConfig, plan: Plan) -> None:
    """What depends on the planned model and budget, checked before any process starts."""
    if plan.warmup_steps > plan.iterations:
        raise UserError(
            f"{named('optim.warmup_steps')} {plan.warmup_steps} is longer than the run's "
            f"{plan.iterations} iterations; use at most {plan.iterations} warm-up steps."
        )
    tp = config.parallel.tp_size
    for name, size in (("attention heads (n_head)", plan.model.n_head),
                       ("MLP hidden units (mlp_hidden)", plan.model.mlp_hidden)):
        if size % tp:
            raise UserError(
                f"parallel.tp_size {tp} does not divide the model's {size} {name}; choose a "
                f"tp_size that divides both {plan.model.n_head} and {plan.model.mlp_hidden}."
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
