"""Scaling rules: a whole run (shape, parameter counts, peak LR, weight decay, step budget) from
the number of attention heads.

The fitted numbers live in ``scaling_rules.yaml``; this module only applies them:

* shape: ``dimensions(arch, heads)`` (n_layer, n_embd, head_dim, MLP hidden per architecture);
* parameter counts: the LR laws' convention ``P = 12·d²·n_layer`` and the exact model count;
* peak LR ``γ*(P) = a·(b + P)^d`` looked up by architecture, global batch, optimizer and κ;
* Chinchilla iterations ``T = ⌊20·N / tokens_per_step⌋``, warm-up ``⌊T/50⌋``;
* weight decay from ω: independent (``wd_ts = ⌊T/10⌋``, ``λ = ω/wd_ts``) or coupled
  (``λ = ω/(γ*·T)``).

``make_plan`` returns all of it as one :class:`Plan`.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

VOCAB_MULTIPLE = 64  # vocabularies are padded to a multiple of this for fast matmuls
REFERENCE_BATCH = 32  # the global batch of the main LR table, and the fallback for any other
DEFAULT_CLIPSNR = 2.0  # launcher default for the SNR-clipped (*-mk4) optimizers
PREFIXED_OPTIMIZERS = ("torch:", "pytorch_optimizer:")  # registry pass-throughs, no LR law


@lru_cache(maxsize=1)
def rules() -> dict[str, Any]:
    """The parsed ``scaling_rules.yaml`` (read once)."""
    text = resources.files("danastar").joinpath("scaling_rules.yaml").read_text()
    return yaml.safe_load(text)


def architectures() -> list[str]:
    return sorted(rules()["architectures"])


def optimizers() -> list[str]:
    """Optimizer names with a known weight-decay rule (plus ``torch:*``/``pytorch_optimizer:*``)."""
    return sorted(rules()["weight_decay_style"])


def padded_vocab_size(vocab_size: int) -> int:
    """Round up to a multiple of 64 (GPT-2: 50257 → 50304)."""
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def _check_arch(arch: str) -> dict[str, Any]:
    table = rules()["architectures"]
    if arch not in table:
        raise ValueError(f"unknown arch {arch!r}; valid choices: {', '.join(sorted(table))}")
    return table[arch]


def _check_opt(opt: str) -> None:
    if opt.startswith(PREFIXED_OPTIMIZERS) and opt.split(":", 1)[1]:
        return
    if opt not in rules()["weight_decay_style"]:
        valid = ", ".join(optimizers() + ["torch:<Name>", "pytorch_optimizer:<name>"])
        raise ValueError(f"unknown optimizer {opt!r}; valid choices: {valid}")


def dimensions(arch: str, heads: int) -> dict[str, int]:
    """Model shape for ``heads`` attention heads: n_layer, n_head, n_embd, head_dim, mlp_hidden."""
    shape = _check_arch(arch)
    if not isinstance(heads, int) or heads < 1:
        raise ValueError(f"heads must be an integer >= 1, got {heads!r}")
    n_layer = math.floor(heads * Fraction(shape["layers_per_head"]))
    if n_layer < 1:
        raise ValueError(f"{arch} with {heads} heads has no layers; use more heads")
    head_dim = shape["head_dim"]
    n_embd = heads * head_dim
    return dict(n_layer=n_layer, n_head=heads, n_embd=n_embd, head_dim=head_dim,
                mlp_hidden=shape["mlp_ratio"] * n_embd)


def non_embedding_params(n_embd: int, n_layer: int) -> int:
    """The LR laws' parameter count P = 12·d²·n_layer (exact for Enoki's matrices)."""
    return 12 * n_embd**2 * n_layer


def exact_non_embedding_params(arch: str, n_layer: int, n_head: int, n_embd: int,
                               head_dim: int, mlp_hidden: int) -> int:
    """Every parameter of the model except the token embedding and output head."""
    _check_arch(arch)
    inner = n_head * head_dim  # attention width
    norms = 2 * n_embd + 2 * head_dim  # two pre-norms and the per-head q/k norms
    if arch == "enoki":
        attention = n_embd * 3 * inner + inner * n_embd  # fused qkv + out
        mlp = 2 * n_embd * mlp_hidden  # up + down
    else:  # qwen3: q_proj carries the output gate (2·inner); SwiGLU has three matrices
        attention = n_embd * 2 * inner + 2 * n_embd * inner + inner * n_embd
        mlp = 3 * n_embd * mlp_hidden
    return n_layer * (attention + mlp + norms) + n_embd  # + final norm


def embedding_params(n_embd: int, padded_vocab: int, tie_embeddings: bool = False) -> int:
    return (1 if tie_embeddings else 2) * n_embd * padded_vocab


def _law_rows(arch: str, global_batch: int, opt: str) -> tuple[str, list[dict[str, float]]]:
    """The LR-law rows for (arch, global batch, opt), falling back to batch 32, then Enoki."""
    laws = rules()["lr_laws"]
    for table_arch, batch in ((arch, global_batch), (arch, REFERENCE_BATCH),
                              ("enoki", REFERENCE_BATCH)):
        rows = laws.get(table_arch, {}).get(batch, {}).get(opt)
        if rows:
            return f"{table_arch}/batch{batch}", rows
    return "", []


def lr_law(arch: str, opt: str, non_embedding: int, *, global_batch: int = REFERENCE_BATCH,
           kappa: float = 0.85) -> tuple[float, str] | None:
    """Peak LR γ*(P) = a·(b + P)^d and a label of the row used, or None if no law exists.

    Rows with a κ apply to the nearest κ (ties go to the larger κ).
    """
    table, rows = _law_rows(arch, global_batch, opt)
    if not rows:
        return None
    row = min(rows, key=lambda r: (round(abs(r.get("kappa", kappa) - kappa), 9),
                                   -r.get("kappa", 0.0)))
    a, b, d = float(row["a"]), float(row["b"]), float(row["d"])
    label = f"{table}/{opt}" + (f"/kappa{row['kappa']}" if "kappa" in row else "")
    return a * (b + non_embedding) ** d, label


PLAN_OVERRIDES = ("n_layer", "n_head", "n_embd", "head_dim", "mlp_hidden", "tokens", "iterations",
                  "warmup_steps", "lr", "wd_ts", "weight_decay")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a run derives from (arch, opt, heads, batch, sequence length, vocabulary)."""

    arch: str
    opt: str
    heads: int
    n_layer: int
    n_head: int
    n_embd: int
    head_dim: int
    mlp_hidden: int
    vocab_size: int
    padded_vocab_size: int
    non_embedding_params: int  # 12·d²·L, the LR laws' convention
    exact_non_embedding_params: int  # the model's real count without embedding and head
    total_params: int  # non_embedding_params + 2·d·V (the convention the budget uses)
    exact_total_params: int  # the model's real count (untied)
    batch_size: int  # sequences per micro-step, all ranks together
    acc_steps: int
    seq_len: int
    world_size: int
    batch_size_per_rank: int
    tokens_per_step: int  # batch_size · acc_steps · seq_len
    chinchilla_tokens: int  # 20 · total_params
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
        """JSON-ready dictionary (tuples become lists)."""
        return json_ready(dataclasses.asdict(self))

    def model_config(self, **overrides: Any):
        """The :class:`danastar.models.ModelConfig` of this plan's model."""
        from danastar.models import ModelConfig

        fields = dict(arch=self.arch, n_layer=self.n_layer, n_head=self.n_head,
                      n_embd=self.n_embd, head_dim=self.head_dim, mlp_hidden=self.mlp_hidden,
                      vocab_size=self.vocab_size, max_seq_len=self.seq_len)
        return ModelConfig(**{**fields, **overrides})


def json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value


def make_plan(arch: str, opt: str, heads: int, *, batch_size: int = 32, acc_steps: int = 1,
              seq_len: int = 2048, vocab_size: int = 50257, world_size: int = 1,
              kappa: float = 0.85, delta: float = 8.0, omega: float = 4.0,
              clipsnr: float | None = None, **overrides: Any) -> Plan:
    """The run plan for ``heads`` heads; ``batch_size · acc_steps`` is the global batch.

    ``overrides`` (any of ``PLAN_OVERRIDES``) replace a derived value, and everything derived
    from it follows: e.g. ``iterations`` sets warm-up, ``wd_ts`` and the weight decay.
    """
    _check_opt(opt)
    unknown = sorted(set(overrides) - set(PLAN_OVERRIDES))
    if unknown:
        raise ValueError(f"unknown plan overrides {unknown}; valid: {', '.join(PLAN_OVERRIDES)}")
    for name, value in dict(batch_size=batch_size, acc_steps=acc_steps, seq_len=seq_len,
                            vocab_size=vocab_size, world_size=world_size).items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if batch_size % world_size:
        raise ValueError(f"batch_size {batch_size} must be divisible by world_size {world_size}")
    snr_clipped = opt in rules()["snr_clipped"]
    if clipsnr is not None and not snr_clipped:
        raise ValueError(f"clipsnr applies only to {', '.join(rules()['snr_clipped'])}")
    if snr_clipped and clipsnr is None:
        clipsnr = DEFAULT_CLIPSNR

    shape = {**dimensions(arch, heads),
             **{k: overrides[k] for k in ("n_layer", "n_head", "n_embd", "head_dim", "mlp_hidden")
                if k in overrides}}
    padded_vocab = padded_vocab_size(vocab_size)
    non_embedding = non_embedding_params(shape["n_embd"], shape["n_layer"])
    exact_non_embedding = exact_non_embedding_params(arch, **shape)
    embedding = embedding_params(shape["n_embd"], padded_vocab)
    total = non_embedding + embedding

    budget = rules()["budget"]
    global_batch = batch_size * acc_steps
    tokens_per_step = global_batch * seq_len
    chinchilla_tokens = budget["tokens_per_param"] * total
    iterations = overrides.get("iterations",
                               overrides.get("tokens", chinchilla_tokens) // tokens_per_step)
    if iterations < 1:
        raise ValueError(f"the token budget gives {iterations} iterations; pass iterations >= 1")
    warmup_steps = overrides.get("warmup_steps", iterations // budget["warmup_divisor"])

    if "lr" in overrides:
        lr, lr_rule = float(overrides["lr"]), "override"
    else:
        law = lr_law(arch, opt, non_embedding, global_batch=global_batch, kappa=kappa)
        if law is None:
            raise ValueError(f"optimizer {opt!r} has no learning-rate law; pass lr explicitly (--lr on the command line)")
        lr, lr_rule = law

    style = rules()["weight_decay_style"].get(opt, "none")
    wd_ts = None
    weight_decay = 0.0
    if style == "independent":
        # max(1, ·) keeps runs shorter than 10 steps finite; the rule itself is ⌊T/10⌋
        wd_ts = overrides.get("wd_ts", max(1, iterations // budget["wd_ts_divisor"]))
        weight_decay = omega / wd_ts
    elif style == "coupled":
        weight_decay = omega / (lr * iterations)
    weight_decay = float(overrides.get("weight_decay", weight_decay))

    hparams = _optimizer_hparams(opt, style, iterations=iterations, kappa=kappa, delta=delta,
                                 clipsnr=clipsnr, weight_decay=weight_decay, wd_ts=wd_ts,
                                 weight_decay_given="weight_decay" in overrides)
    return Plan(
        arch=arch, opt=opt, heads=heads, **shape, vocab_size=vocab_size,
        padded_vocab_size=padded_vocab, non_embedding_params=non_embedding,
        exact_non_embedding_params=exact_non_embedding, total_params=total,
        exact_total_params=exact_non_embedding + embedding, batch_size=batch_size,
        acc_steps=acc_steps, seq_len=seq_len, world_size=world_size,
        batch_size_per_rank=batch_size // world_size, tokens_per_step=tokens_per_step,
        chinchilla_tokens=chinchilla_tokens, iterations=iterations,
        tokens=iterations * tokens_per_step, warmup_steps=warmup_steps, lr=lr, lr_rule=lr_rule,
        weight_decay=weight_decay, wd_ts=wd_ts, kappa=kappa, delta=delta, omega=omega,
        clipsnr=clipsnr, optimizer_hparams=hparams,
    )


def _optimizer_hparams(opt: str, style: str, *, iterations: int, kappa: float, delta: float,
                       clipsnr: float | None, weight_decay: float, wd_ts: int | None,
                       weight_decay_given: bool) -> dict[str, Any]:
    """The keyword arguments ``danastar.optim.build_optimizer`` takes for ``opt``."""
    if opt in ("adana", "dana-mk4", "dana-star", "dana-star-mk4"):
        hparams = dict(delta=delta, kappa=kappa, weight_decay=weight_decay, wd_ts=wd_ts)
        if clipsnr is not None:
            hparams["clipsnr"] = clipsnr
        return hparams
    if opt in ("ademamix", "ademamix-decaying-wd"):
        # the paper's log-time AdEMAMix: slow EMA horizon and mixing weight grow with the run
        hparams = dict(betas=(0.9, 0.999, 1.0 - delta / iterations),
                       alpha=iterations ** (1.0 - kappa), alpha_warmup=iterations,
                       beta3_warmup=iterations, weight_decay=weight_decay)
        if style == "independent":
            hparams.update(wd_ts=wd_ts, decaying_wd=True)
        return hparams
    if style == "independent":  # adamw-decaying-wd
        return dict(weight_decay=weight_decay, wd_ts=wd_ts)
    if style == "coupled" or weight_decay_given:  # adamw, muon; or an explicit value
        return dict(weight_decay=weight_decay)
    return {}


def ladder_table(arch: str, opt: str, heads: list[int], **plan_kwargs: Any) -> str:
    """A markdown table of the ladder ``heads`` (as shown in docs/models.md)."""
    lines = ["| heads | n_layer | n_embd | P = 12·d²·L | exact non-emb. | total | iterations "
             "| warm-up | peak LR | weight decay |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for h in heads:
        p = make_plan(arch, opt, h, **plan_kwargs)
        lines.append(f"| {h} | {p.n_layer} | {p.n_embd} | {_millions(p.non_embedding_params)} "
                     f"| {_millions(p.exact_non_embedding_params)} | {_millions(p.total_params)} "
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
