"""Scaling rules: a whole run (shape, parameter counts, peak LR, weight decay, step budget) from
the number of attention heads.

The fitted numbers live in ``scaling_rules.yaml``; this module only applies them. What an
optimizer takes from the plan (its weight-decay style and hyperparameters) is the optimizer
registry's to say (``danastar.optim.registry``).

* shape: ``dimensions(arch, heads)``, each architecture's ladder (owned by ``danastar.models``);
* parameter counts: the LR laws' convention ``P = 12·d²·n_layer`` and the exact count of the
  model itself, built on the meta device;
* peak LR ``γ*(P) = a·(b + P)^d`` looked up by architecture (llama reads Enoki's table and
  qwen3next Qwen3's), global batch, optimizer and κ;
* Chinchilla iterations ``T = ⌊20·N / tokens_per_step⌋``, warm-up ``⌊T/50⌋``;
* mixtures of experts (a heuristic: the fitted laws are dense): the LR law at the active count
  ``P_act = 12·d²·L + L_m·(k+S−1)·P_x`` and ``N`` the active parameters with the embeddings
  (``moe_budget="active"``, the default) or all of them (``"total"``);
* weight decay from ω: independent (``wd_ts = ⌊T/10⌋``, ``λ = ω/wd_ts``, the optimizers' own
  ``danastar.optim.log_time_weight_decay``) or coupled (``λ = ω/(γ*·T)``).

``make_plan`` returns all of it as one :class:`Plan`.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from importlib import resources
from typing import Any

import torch
import yaml

from danastar.models import ModelConfig
from danastar.models.config import (
    ARCHITECTURES,
    arch_defaults,
    check_arch,
    dimensions,
    moe_layers,
    param_counts,
)
from danastar.models.meta import build_meta_model
from danastar.optim import registry
from danastar.optim.dana_family import DEFAULT_CLIPSNR, DEFAULT_DELTA, DEFAULT_KAPPA
from danastar.optim.weight_decay import PAPER_OMEGA, log_time_weight_decay

REFERENCE_BATCH = 32  # the global batch of the main LR table, and the fallback for any other
DEFAULT_OMEGA = PAPER_OMEGA  # weight-decay strength ω


@lru_cache(maxsize=1)
def rules() -> dict[str, Any]:
    """The parsed ``scaling_rules.yaml`` (read once)."""
    text = resources.files("danastar").joinpath("scaling_rules.yaml").read_text()
    return yaml.safe_load(text)


def useful_epochs() -> float:
    """Epochs of a corpus past which a plan warns: repeated tokens are then worth much less than
    new ones (``budget.useful_epochs`` in ``scaling_rules.yaml``, with its source)."""
    return float(rules()["budget"]["useful_epochs"])


def architectures() -> list[str]:
    return sorted(ARCHITECTURES)


def optimizers() -> list[str]:
    """Optimizer names with a known weight-decay rule (plus ``torch:*``/``pytorch_optimizer:*``)."""
    return sorted(registry.OPTIMIZERS)


def _check_opt(opt: str) -> None:
    if registry.is_prefixed(opt):
        return
    if opt not in registry.OPTIMIZERS:
        valid = ", ".join(optimizers() + ["torch:<Name>", "pytorch_optimizer:<name>"])
        raise ValueError(f"unknown optimizer {opt!r}; valid choices: {valid}")


def exact_non_embedding_params(arch: str, n_layer: int, n_head: int, n_embd: int,
                               head_dim: int, mlp_hidden: int) -> int:
    """Every parameter of the model except the token embedding and output head."""
    check_arch(arch)
    return counted_non_embedding_params(ModelConfig(
        arch=arch, n_layer=n_layer, n_head=n_head, n_embd=n_embd, head_dim=head_dim,
        mlp_hidden=mlp_hidden, vocab_size=1, max_seq_len=2))


def counted_non_embedding_params(config: ModelConfig) -> int:
    """The non-embedding parameters of the model itself (`meta_model`)."""
    return meta_model(config).num_params(non_embedding=True)


def meta_model(config: ModelConfig) -> torch.nn.Module:
    """The model of ``config`` built on the meta device (no memory, no initialisation cost),
    once per configuration: a plan counts its parameters, a dry run builds its optimizer over
    its parameter groups, and a sweep plans the same few models for each of its runs (each
    build a tenth of a second). Kept for the `META_MODELS_KEPT` configurations used last."""
    key = repr(config)  # every field, nested ones too
    model = _META_MODELS.pop(key, None)
    if model is None:
        model = build_meta_model(config)
    _META_MODELS[key] = model  # the newest last
    while len(_META_MODELS) > META_MODELS_KEPT:
        del _META_MODELS[next(iter(_META_MODELS))]
    return model


META_MODELS_KEPT = 16
_META_MODELS: dict[str, torch.nn.Module] = {}  # repr(ModelConfig) -> its meta-device model


def _law_rows(arch: str, global_batch: int, opt: str) -> tuple[str, list[dict[str, float]]]:
    """The LR-law rows for (arch, global batch, opt), falling back to batch 32, then Enoki. An
    architecture without laws of its own reads another's (``lr_table_of``)."""
    laws = rules()["lr_laws"]
    arch = rules().get("lr_table_of", {}).get(arch, arch)
    for table_arch, batch in ((arch, global_batch), (arch, REFERENCE_BATCH),
                              ("enoki", REFERENCE_BATCH)):
        rows = laws.get(table_arch, {}).get(batch, {}).get(opt)
        if rows:
            return f"{table_arch}/batch{batch}", rows
    return "", []


def lr_law(arch: str, opt: str, non_embedding: int, *, global_batch: int = REFERENCE_BATCH,
           kappa: float = DEFAULT_KAPPA) -> tuple[float, str] | None:
    """Peak LR γ*(P) = a·(b + P)^d and a label of the row used, or None if no law exists.

    Rows with a κ are looked up as the original release does: the row whose κ has the same two
    decimals, else the nearest κ (distances compared in floating point), the row listed first
    at a tie.
    """
    found = lr_law_coefficients(arch, opt, global_batch=global_batch, kappa=kappa)
    if found is None:
        return None
    (a, b, d), label = found
    return a * (b + non_embedding) ** d, label


def lr_law_coefficients(arch: str, opt: str, *, global_batch: int = REFERENCE_BATCH,
                        kappa: float = DEFAULT_KAPPA
                        ) -> tuple[tuple[float, float, float], str] | None:
    """The (a, b, d) of the law γ*(P) = a·(b + P)^d that ``lr_law`` uses, and its row's label;
    None if no law exists."""
    table, rows = _law_rows(arch, global_batch, opt)
    if not rows:
        return None
    row = _kappa_row(rows, kappa)
    label = f"{table}/{opt}" + (f"/kappa{row['kappa']}" if "kappa" in row else "")
    return (float(row["a"]), float(row["b"]), float(row["d"])), label


def _kappa_row(rows: list[dict[str, float]], kappa: float) -> dict[str, float]:
    if "kappa" not in rows[0]:
        return rows[0]
    text = f"{float(kappa):.2f}"  # the release keys its table by κ with two decimals
    for row in rows:
        if f"{float(row['kappa']):.2f}" == text:
            return row
    return min(rows, key=lambda row: abs(float(row["kappa"]) - float(kappa)))  # first at a tie


PLAN_OVERRIDES = ("n_layer", "n_head", "n_embd", "head_dim", "mlp_hidden", "tokens", "iterations",
                  "warmup_steps", "lr", "wd_ts", "weight_decay")
MOE_BUDGETS = ("active", "total")


# The plan's mixture-of-experts settings, reported flat in `Plan.to_dict()` when the model is one
# (the router's options, which change no count, are the model's alone).
MOE_SHAPE = ("moe_num_experts", "moe_num_shared_experts", "moe_num_experts_per_tok",
             "use_gated_shared_expert", "shared_expert_intermediate_size", "decoder_sparse_step",
             "mlp_only_layers")


# The plan's model fields, reported flat in `Plan.to_dict()` (the dry run's JSON).
MODEL_SHAPE = ("arch", "n_layer", "n_head", "n_embd", "head_dim", "mlp_hidden", "vocab_size")


@dataclasses.dataclass(frozen=True)
class PlanCounts:
    """A plan's parameter counts, by the names plan.json gives them. The LR laws' convention
    counts the dense part as 12·d²·L; the exact counts are the model's own. A mixture of experts
    counts its parameters twice: all of them (total) and those one token multiplies (active: k
    routed experts of R); a dense model has active = total."""

    non_embedding_params: int  # 12·d²·L, the LR laws' convention (a MoE's dense part)
    exact_non_embedding_params: int  # the model's real count without embedding and head
    total_params: int  # total_non_embedding_params + d·V per embedding matrix (the budget's)
    exact_total_params: int  # the model's real count
    total_non_embedding_params: int  # + L_m·((E−1)·P_x + d·R)
    active_non_embedding_params: int  # + L_m·(k+S−1)·P_x: where the LR law is evaluated
    active_params: int  # active_non_embedding_params + embeddings
    exact_active_non_embedding_params: int
    exact_active_params: int


def plan_counts(model: ModelConfig) -> PlanCounts:
    """The counts of ``model``: the LR laws' from its shape, the exact ones from the model built
    on the meta device."""
    counts = param_counts(model)
    exact_non_embedding = counted_non_embedding_params(model)
    embedding = counts.embedding
    exact_active = counts.active_non_embedding + exact_non_embedding - counts.non_embedding
    return PlanCounts(
        non_embedding_params=counts.lr_law_params,
        exact_non_embedding_params=exact_non_embedding,
        total_params=counts.lr_law_params_total + embedding,
        exact_total_params=exact_non_embedding + embedding,
        total_non_embedding_params=counts.lr_law_params_total,
        active_non_embedding_params=counts.lr_law_params_active,
        active_params=counts.lr_law_params_active + embedding,
        exact_active_non_embedding_params=exact_active,
        exact_active_params=exact_active + embedding)


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """What a plan is made from (`plan_for`): the architecture, optimizer and heads, the batch
    (``batch_size · acc_steps`` is the global batch), the vocabulary, the data-parallel size,
    the optimizer's run settings (κ, δ, ω, the SNR clip: None takes the optimizer's default),
    ``model_options`` (further :class:`ModelConfig` fields that change the counts, flat or nested
    as ``ModelConfig.from_dict`` reads them), which count of a MoE the token budget is 20 times
    (``moe_budget``), and ``overrides`` (any of ``PLAN_OVERRIDES``), which replace a derived
    value, everything derived from it following (``iterations`` sets the warm-up, ``wd_ts``
    and the weight decay)."""

    arch: str
    opt: str
    heads: int
    batch_size: int = 32
    acc_steps: int = 1
    seq_len: int = 2048
    vocab_size: int = 50257
    world_size: int = 1
    kappa: float | None = None
    delta: float | None = None
    omega: float = DEFAULT_OMEGA
    clipsnr: float | None = None
    model_options: dict[str, Any] | None = None
    moe_budget: str = "active"
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a run derives from (arch, opt, heads, batch, sequence length, vocabulary).

    The model's shape is its :class:`ModelConfig`, ``plan.model`` (``plan.model.n_layer``), and
    its parameter counts a :class:`PlanCounts`, ``plan.params``: neither is copied here."""

    model: ModelConfig  # the shape; max_seq_len is seq_len
    opt: str
    heads: int
    params: PlanCounts
    moe_budget: str  # chinchilla_tokens from the "active" or the "total" parameters
    batch_size: int  # sequences per micro-step, all ranks together
    acc_steps: int
    seq_len: int
    world_size: int
    batch_size_per_rank: int
    tokens_per_step: int  # batch_size · acc_steps · seq_len
    chinchilla_tokens: int  # 20 · active_params (moe_budget "active") or 20 · total_params
    iterations: int
    tokens: int  # tokens actually trained: iterations · tokens_per_step
    warmup_steps: int
    lr: float
    lr_rule: str  # which LR-law row gave lr ("override" when given)
    weight_decay: float
    wd_ts: int | None
    kappa: float
    delta: float
    omega: float
    clipsnr: float | None
    optimizer_hparams: dict[str, Any]  # kwargs for build_optimizer(opt, params, lr, **these)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary (tuples become lists), with the model's shape flat in it."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del fields["model"]
        fields = {**dataclasses.asdict(fields.pop("params")), **fields}  # flat, first
        flat = self.model.to_dict()
        shape = {name: flat[name] for name in (*MODEL_SHAPE, "moe")}
        if self.model.moe:
            shape.update({name: flat[name] for name in MOE_SHAPE})
            shape["moe_layers"] = list(moe_layers(self.model))
        opt, heads = fields.pop("opt"), fields.pop("heads")
        return json_ready({"arch": shape.pop("arch"), "opt": opt, "heads": heads, **shape,
                           "padded_vocab_size": self.model.padded_vocab_size, **fields})

    def model_config(self, **overrides: Any) -> ModelConfig:
        """The :class:`danastar.models.ModelConfig` of this plan's model (``overrides`` replace
        its options, e.g. ``z_loss``)."""
        return dataclasses.replace(self.model, **overrides)


def json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value


def make_plan(arch: str, opt: str, heads: int, **settings: Any) -> Plan:
    """The run plan for ``heads`` heads: ``plan_for(PlanRequest(arch, opt, heads, ...))``, with
    ``settings`` the request's fields by name and any other keyword one of its ``overrides``
    (``make_plan("enoki", "adana", 4, batch_size=64, iterations=1000)``)."""
    fields = {field.name for field in dataclasses.fields(PlanRequest)} - {"overrides"}
    given = {key: settings.pop(key) for key in list(settings) if key in fields}
    return plan_for(PlanRequest(arch, opt, heads, **given, overrides=settings))


def plan_for(request: PlanRequest) -> Plan:
    """The run plan `request` asks for. κ, δ and the SNR clip given to an optimizer that does
    not use them are refused (ValueError) rather than ignored."""
    r = request
    overrides = r.overrides
    check_plan_inputs(r.opt, overrides, r.moe_budget, batch_size=r.batch_size,
                      acc_steps=r.acc_steps, seq_len=r.seq_len, vocab_size=r.vocab_size,
                      world_size=r.world_size)
    kappa, delta, clipsnr = optimizer_settings(r.opt, r.kappa, r.delta, r.clipsnr)
    model = planned_model(r.arch, r.heads, r.vocab_size, r.seq_len, r.model_options, overrides)
    counts = plan_counts(model)

    budget = rules()["budget"]
    global_batch = r.batch_size * r.acc_steps
    tokens_per_step = global_batch * r.seq_len
    chinchilla_tokens = budget["tokens_per_param"] * (
        counts.active_params if r.moe_budget == "active" else counts.total_params)
    iterations = overrides.get("iterations",
                               overrides.get("tokens", chinchilla_tokens) // tokens_per_step)
    if iterations < 1:
        raise ValueError(f"the token budget gives {iterations} iterations; pass iterations >= 1")
    warmup_steps = overrides.get("warmup_steps", iterations // budget["warmup_divisor"])
    lr, lr_rule = peak_lr(r.arch, r.opt, counts.active_non_embedding_params, global_batch,
                          kappa, overrides)
    weight_decay, wd_ts = planned_weight_decay(r.opt, r.omega, lr, iterations, overrides)
    hparams = registry.run_hparams(r.opt, registry.RunSettings(
        iterations=iterations, kappa=kappa, delta=delta, clipsnr=clipsnr,
        weight_decay=weight_decay, wd_ts=wd_ts, weight_decay_given="weight_decay" in overrides))
    return Plan(
        model=model, opt=r.opt, heads=r.heads, params=counts, moe_budget=r.moe_budget,
        batch_size=r.batch_size, acc_steps=r.acc_steps, seq_len=r.seq_len,
        world_size=r.world_size, batch_size_per_rank=r.batch_size // r.world_size,
        tokens_per_step=tokens_per_step, chinchilla_tokens=chinchilla_tokens,
        iterations=iterations, tokens=iterations * tokens_per_step, warmup_steps=warmup_steps,
        lr=lr, lr_rule=lr_rule, weight_decay=weight_decay, wd_ts=wd_ts, kappa=kappa,
        delta=delta, omega=r.omega, clipsnr=clipsnr, optimizer_hparams=hparams,
    )


def check_plan_inputs(opt: str, overrides: dict[str, Any], moe_budget: str,
                      **sizes: int) -> None:
    """The optimizer, the override names, the budget and the batch sizes a plan can take."""
    _check_opt(opt)
    unknown = sorted(set(overrides) - set(PLAN_OVERRIDES))
    if unknown:
        raise ValueError(f"unknown plan overrides {unknown}; valid: {', '.join(PLAN_OVERRIDES)}")
    if moe_budget not in MOE_BUDGETS:
        raise ValueError(f"unknown moe_budget {moe_budget!r}; valid: {', '.join(MOE_BUDGETS)}")
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if sizes["batch_size"] % sizes["world_size"]:
        raise ValueError(f"batch_size {sizes['batch_size']} must be divisible by world_size "
                         f"{sizes['world_size']}")


def optimizer_settings(opt: str, kappa: float | None, delta: float | None,
                       clipsnr: float | None) -> tuple[float, float, float | None]:
    """κ, δ and the SNR clip ``opt`` runs with: the optimizer's defaults where not given, and a
    ValueError for one given to an optimizer that does not take it."""
    snr_clipped = registry.snr_clipped(opt)
    if clipsnr is not None and not snr_clipped:
        clipped = [name for name in registry.OPTIMIZERS if registry.snr_clipped(name)]
        raise ValueError(f"clipsnr applies only to {', '.join(clipped)}, not {opt}; drop it or "
                         "choose one of those optimizers")
    for name, value in (("kappa", kappa), ("delta", delta)):
        if value is not None and not takes_run_setting(opt, name):
            users = [other for other in registry.OPTIMIZERS if takes_run_setting(other, name)]
            raise ValueError(f"{name} applies only to {', '.join(users)}, not {opt}; drop it or "
                             "choose one of those optimizers")
    return (DEFAULT_KAPPA if kappa is None else kappa, DEFAULT_DELTA if delta is None else delta,
            DEFAULT_CLIPSNR if snr_clipped and clipsnr is None else clipsnr)


def planned_model(arch: str, heads: int, vocab_size: int, seq_len: int,
                  model_options: dict[str, Any] | None, overrides: dict[str, Any]) -> ModelConfig:
    """The ladder model of ``heads`` heads, explicit dimensions in ``overrides`` taking
    precedence, with the architecture's defaults and then ``model_options``."""
    shape = {**dimensions(arch, heads),
             **{k: overrides[k] for k in ("n_layer", "n_head", "n_embd", "head_dim", "mlp_hidden")
                if k in overrides}}
    return ModelConfig.from_dict({"arch": arch, **shape, "vocab_size": vocab_size,
                                  "max_seq_len": seq_len, **arch_defaults(arch),
                                  **(model_options or {})})


def peak_lr(arch: str, opt: str, lr_law_params: int, global_batch: int, kappa: float,
            overrides: dict[str, Any]) -> tuple[float, str]:
    """The peak LR and the rule that gave it: ``overrides["lr"]`` or the fitted law at the LR
    laws' (active) parameter count."""
    if "lr" in overrides:
        return float(overrides["lr"]), "override"
    law = lr_law(arch, opt, lr_law_params, global_batch=global_batch, kappa=kappa)
    if law is None:
        raise ValueError(f"optimizer {opt!r} has no learning-rate law; pass lr explicitly "
                         "(--lr on the command line)")
    return law


def planned_weight_decay(opt: str, omega: float, lr: float, iterations: int,
                         overrides: dict[str, Any]) -> tuple[float, int | None]:
    """λ and wd_ts from ω by the optimizer's weight-decay style (``weight_decay`` in
    ``overrides`` replaces λ): independent, the optimizers' own paper form wd_ts = ⌊T/10⌋ (at
    least 1), λ = ω/wd_ts; coupled, λ = ω/(γ*·T); none, 0."""
    style = registry.weight_decay_style(opt)
    wd_ts = None
    weight_decay = 0.0
    if style == "independent":
        weight_decay, wd_ts = log_time_weight_decay(omega, iterations, overrides.get("wd_ts"))
    elif style == "coupled":
        weight_decay = omega / (lr * iterations)
    return float(overrides.get("weight_decay", weight_decay)), wd_ts


def takes_run_setting(opt: str, name: str) -> bool:
    """Whether the run setting ``name`` (``kappa`` or ``delta``) reaches optimizer ``opt``: its
    hyperparameters change when the setting does (the registry's functions are the one source)."""
    base = registry.RunSettings(iterations=1000, kappa=DEFAULT_KAPPA, delta=DEFAULT_DELTA,
                                clipsnr=None, weight_decay=0.0, wd_ts=100,
                                weight_decay_given=False)
    changed = dataclasses.replace(base, **{name: getattr(base, name) / 2})
    return registry.run_hparams(opt, base) != registry.run_hparams(opt, changed)


def ladder_table(arch: str, opt: str, heads: list[int], **plan_kwargs: Any) -> str:
    """A markdown table of the ladder ``heads`` (as shown in docs/models.md)."""
    lines = ["| heads | n_layer | n_embd | P = 12·d²·L | exact non-emb. | total | iterations "
             "| warm-up | peak LR | weight decay |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for h in heads:
        p = make_plan(arch, opt, h, **plan_kwargs)
        counts = p.params
        lines.append(f"| {h} | {p.model.n_layer} | {p.model.n_embd} "
                     f"| {_millions(counts.non_embedding_params)} "
                     f"| {_millions(counts.exact_non_embedding_params)} "
                     f"| {_millions(counts.total_params)} "
                     f"| {p.iterations} | {p.warmup_steps} | {p.lr:.3g} | {p.weight_decay:.3g} |")
    return "\n".join(lines)


def _millions(count: int) -> str:
    return f"{count / 1e9:.3g}B" if count >= 1e9 else f"{count / 1e6:.3g}M"


if __name__ == "__main__":  # python -m danastar.scaling: the ladders in docs/models.md
    for arch, opt, ladder in (("enoki", "adamw", [3, 4, 6, 8, 12, 16, 24, 32, 40]),
                              ("enoki", "adana", [3, 4, 6, 8, 12, 16, 24, 32, 40]),
                              ("qwen3", "dana-star-mk4", [2, 3, 4, 6, 8, 12, 16])):
        print(f"\n{arch}, {opt} (κ 0.85 where it applies), batch 32 × 2048, GPT-2 vocabulary\n")
        print(ladder_table(arch, opt, ladder))
