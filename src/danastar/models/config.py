"""The model configuration shared by every architecture, and the facts that describe a model
without building it: the architectures and how each grows with its number of heads, vocabulary
padding, which layers are mixtures of experts, and the parameter counts (exact, active, and the
LR laws' convention)."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

INITS = ("ScaledGPT", "KarpathyGPT2")
VOCAB_MULTIPLE = 64  # vocabularies are padded to a multiple of this for fast matmuls

MOE_SOFTMAX_ORDERS = ("topk_softmax", "softmax_topk")
MOE_ROUTER_LOSSES = ("load_balancing_z_loss", "load_balancing_only", "entropy")


def option(default: Any, flat: str, doc: str, tag: str | None = None,
           gated: bool = False) -> Any:
    """A MoE field with what the rest of the package derives from it: ``flat``, its name in the
    original release's flags and in the flat records (run.json, plan.json, model_config.json);
    ``doc``, what it does; ``tag``, its short mark in a run's default directory name when given
    away from its default (None: never named there); ``gated``, whether only the architectures
    whose ladder has ``gated_moe`` take it."""
    return dataclasses.field(default=default, metadata=dict(flat=flat, doc=doc, tag=tag,
                                                            gated=gated))


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """A mixture of experts in the MLPs (models/moe.py): E experts of which S shared, k routed per
    token out of the R = E − S others; the release's names and defaults except the capacity
    factor (0, dropless, here; the release's 1.5 remains an option). ``check`` holds every rule."""

    num_experts: int = option(8, "moe_num_experts", "experts E per MoE layer, shared included (8)")
    num_shared_experts: int = option(0, "moe_num_shared_experts",
                                     "shared experts S, every token, weight 1 (0)", tag="s")
    num_experts_per_tok: int = option(2, "moe_num_experts_per_tok",
                                      "routed experts k per token (2)")
    softmax_order: str = option("topk_softmax", "moe_softmax_order",
                                "topk_softmax | softmax_topk", tag="")
    router_loss: str = option("load_balancing_z_loss", "moe_router_loss",
                              "load_balancing_z_loss | load_balancing_only | entropy", tag="")
    aux_loss_factor: float = option(0.1, "moe_aux_loss_factor", "load-balancing factor (0.1)",
                                    tag="aux")
    z_loss_factor: float = option(0.01, "moe_z_loss_factor", "router z-loss factor (0.01)",
                                  tag="rz")
    entropy_loss_factor: float = option(0.01, "moe_entropy_loss_factor",
                                        "router entropy-loss factor (0.01)", tag="ent")
    expert_capacity_factor: float = option(
        0.0, "moe_expert_capacity_factor", "expert parallelism: tokens per expert buffer; 0 = "
        "dropless (the default; the release's is 1.5)", tag="cap")
    use_gated_shared_expert: bool = option(
        False, "use_gated_shared_expert", "qwen3next: a sigmoid-gated shared expert (S is then 0)",
        tag="gse", gated=True)
    shared_expert_intermediate_size: int | None = option(
        None, "shared_expert_intermediate_size",
        "qwen3next: hidden size of the gated shared expert (default: the MLP's)", tag="gse",
        gated=True)
    decoder_sparse_step: int = option(
        1, "decoder_sparse_step", "qwen3next: MoE in every layer i with i % step == 0 (1)",
        tag="step", gated=True)
    mlp_only_layers: tuple[int, ...] = option(
        (), "mlp_only_layers", "qwen3next: comma-separated dense layers, e.g. 0,5,11",
        tag="dense", gated=True)

    def __post_init__(self) -> None:
        # a list after JSON or YAML; a tuple keeps the dataclass hashable and comparable
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))

    @property
    def routed_experts(self) -> int:
        """R = E − S, the experts the router chooses among."""
        return self.num_experts - self.num_shared_experts

    def is_moe_layer(self, layer: int) -> bool:
        """Block ``layer`` is a mixture of experts unless listed in ``mlp_only_layers`` or off
        the ``decoder_sparse_step`` (the release's rule; Hugging Face uses layer + 1)."""
        return layer not in self.mlp_only_layers and layer % self.decoder_sparse_step == 0

    def check(self, arch: str, n_layer: int | None = None,
              name: Callable[[str], str] = str) -> None:
        """Refuse what no model could honour, one sentence (ValueError) naming the fix.
        ``name`` says a field by its flat name as the caller's user knows it (``--moe_num_experts``
        on the command line); without ``n_layer`` the layer indices are left unchecked."""
        flat = {f.name: f.metadata["flat"] for f in dataclasses.fields(self)}
        says = {key: name(value) for key, value in flat.items()}
        self._check_arch(arch, says, name)
        self._check_counts(says)
        for field, choices in (("softmax_order", MOE_SOFTMAX_ORDERS),
                               ("router_loss", MOE_ROUTER_LOSSES)):
            value = getattr(self, field)
            if value not in choices:
                close = difflib.get_close_matches(value, choices, n=1)
                hint = f"did you mean {close[0]!r}?" if close else \
                    f"choose one of: {', '.join(choices)}."
                raise ValueError(f"{says[field]} {value!r} is not known; {hint}")
        for field in ("aux_loss_factor", "z_loss_factor", "entropy_loss_factor",
                      "expert_capacity_factor"):
            value = getattr(self, field)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{says[field]} must be a finite number >= 0 (got "
                                 f"{value!r}); 0 turns it off.")
        if n_layer is not None:
            self._check_layers(n_layer, says)

    def _check_arch(self, arch: str, says: dict[str, str], name: Callable[[str], str]) -> None:
        if LADDERS[arch].gated_moe:
            return
        takers = " or ".join(other for other, ladder in LADDERS.items() if ladder.gated_moe)
        for f in dataclasses.fields(self):
            if f.metadata["gated"] and getattr(self, f.name) != f.default:
                raise ValueError(f"{says[f.name]} applies to {name('arch')} {takers} only, as "
                                 f"in the release; drop it or use {name('arch')} {takers}.")

    def _check_counts(self, says: dict[str, str]) -> None:
        for field, low in (("num_experts", 1), ("num_shared_experts", 0),
                           ("decoder_sparse_step", 1), ("num_experts_per_tok", None)):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or \
                    (low is not None and value < low):
                raise ValueError(f"{says[field]} {value!r} must be at least {low or 1}, a whole "
                                 "number.")
        size = self.shared_expert_intermediate_size
        if size is not None and (not isinstance(size, int) or size < 1):
            raise ValueError(f"{says['shared_expert_intermediate_size']} {size!r} must be a "
                             "whole number of at least 1; leave it unset for the MLP's hidden "
                             "size.")
        shared, experts = self.num_shared_experts, self.num_experts
        if self.use_gated_shared_expert and shared:
            raise ValueError(f"{says['use_gated_shared_expert']} replaces the shared experts (the "
                             f"release sets S to 0), so {says['num_shared_experts']} {shared} "
                             f"has no place; set {says['num_shared_experts']} to 0 or drop "
                             f"{says['use_gated_shared_expert']}.")
        if size is not None and not self.use_gated_shared_expert:
            raise ValueError(f"{says['shared_expert_intermediate_size']} sizes the gated shared "
                             f"expert; add {says['use_gated_shared_expert']} or drop it.")
        if shared >= experts:
            raise ValueError(f"{says['num_shared_experts']} {shared} leaves no routed expert out "
                             f"of {says['num_experts']} {experts}; keep "
                             f"{says['num_shared_experts']} below {says['num_experts']}.")
        k = self.num_experts_per_tok
        if not 1 <= k <= self.routed_experts:
            raise ValueError(f"{says['num_experts_per_tok']} {k} must be between 1 and the "
                             f"{self.routed_experts} routed experts ({says['num_experts']} minus "
                             f"{says['num_shared_experts']}); route fewer experts per token or "
                             "add experts.")

    def _check_layers(self, n_layer: int, says: dict[str, str]) -> None:
        layers, given = self.mlp_only_layers, says["mlp_only_layers"]
        outside = [i for i in layers if not isinstance(i, int) or not 0 <= i < n_layer]
        if outside:
            raise ValueError(f"{given} {','.join(map(str, layers))} names layer {outside[0]}, but "
                             f"the model has layers 0 to {n_layer - 1}; give indices in that "
                             "range.")
        if not any(self.is_moe_layer(i) for i in range(n_layer)):
            raise ValueError(f"{given} {','.join(map(str, layers))} with "
                             f"{says['decoder_sparse_step']} {self.decoder_sparse_step} leaves no "
                             f"MoE layer in the {n_layer} layers; keep at least one layer out of "
                             f"{given}.")

    def flat(self) -> dict[str, Any]:
        """The fields by their flat names (the records' form)."""
        return {f.metadata["flat"]: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def by_field(cls, flat: dict[str, Any]) -> dict[str, Any]:
        """Values given by their flat names, by field name (unknown names are left out)."""
        field_of = {f.metadata["flat"]: f.name for f in dataclasses.fields(cls)}
        return {field_of[key]: value for key, value in flat.items() if key in field_of}


# The flat names of the MoE fields, in order (the records' keys).
MOE_FLAT_NAMES = tuple(f.metadata["flat"] for f in dataclasses.fields(MoEConfig))


@dataclasses.dataclass(frozen=True)
class Ladder:
    """An architecture's facts: how it grows with its number of heads h (n_embd = h · head_dim,
    n_layer = ⌊h · layers_per_head⌋, MLP hidden = mlp_multiple · ⌈⌊mlp_ratio · n_embd⌋ /
    mlp_multiple⌉: Llama rounds its 8d/3 up to a multiple of 256), what its blocks hold (the MLP
    kind, a gate carried by the query projection, per-head q/k norms), ``defaults``, the
    ModelConfig fields it sets differently from the dataclass defaults, and ``summary``, what
    `--arch` says of it."""

    head_dim: int
    layers_per_head: Fraction
    mlp_ratio: Fraction
    summary: str
    mlp_multiple: int = 1
    mlp: str = "swiglu"  # one of MLP_MATRICES
    gated_attention: bool = False  # q_proj also computes the attention output's gate
    qk_norm: bool = True  # a norm weight per head dimension on queries and keys
    # the release's Qwen3-Next MoE options: a gated shared expert, the choice of MoE layers
    gated_moe: bool = False
    defaults: tuple[tuple[str, Any], ...] = ()

    def mlp_hidden(self, n_embd: int) -> int:
        return -(-math.floor(self.mlp_ratio * n_embd) // self.mlp_multiple) * self.mlp_multiple

    def attention_params(self, n_embd: int, n_head: int, head_dim: int) -> int:
        """One block's attention: the q, k, v (and gate) projections, o_proj, the q/k norms."""
        inner = n_head * head_dim
        projections = (4 if self.gated_attention else 3) * n_embd * inner + inner * n_embd
        return projections + (2 * head_dim if self.qk_norm else 0)


# An MLP's weight matrices: GELU d→h→d, SwiGLU's gate, up and down.
MLP_MATRICES = {"gelu": 2, "swiglu": 3}

# The architectures (build_model's registry has one class per name) and their ladders.
LADDERS: dict[str, Ladder] = {
    "enoki": Ladder(head_dim=64, layers_per_head=Fraction(3, 4), mlp_ratio=Fraction(4),
                    mlp="gelu", summary="the paper's model (GELU MLP, LayerNorm, QK-norm)"),
    "qwen3": Ladder(head_dim=128, layers_per_head=Fraction(2), mlp_ratio=Fraction(3),
                    gated_attention=True, summary="Qwen3 blocks with gated attention"),
    # the release's dense baseline: Enoki's ladder, SwiGLU hidden 256·⌈⌊8d/3⌋/256⌉, always
    # tied embeddings, no z-loss
    "llama": Ladder(head_dim=64, layers_per_head=Fraction(3, 4), mlp_ratio=Fraction(8, 3),
                    mlp_multiple=256, qk_norm=False,
                    defaults=(("tie_embeddings", True), ("z_loss", 0.0)),
                    summary="the release's dense baseline (tied embeddings, no z-loss)"),
    # Qwen3 blocks with mixture-of-experts MLPs; the architecture implies moe
    "qwen3next": Ladder(head_dim=128, layers_per_head=Fraction(2), mlp_ratio=Fraction(3),
                        gated_attention=True, gated_moe=True, defaults=(("moe", MoEConfig()),),
                        summary="Qwen3 blocks with mixture-of-experts MLPs (implies --moe)"),
}
ARCHITECTURES = tuple(LADDERS)


def check_arch(arch: str) -> Ladder:
    if arch not in LADDERS:
        raise ValueError(f"unknown arch {arch!r}; valid choices: {', '.join(ARCHITECTURES)}")
    return LADDERS[arch]


def dimensions(arch: str, heads: int) -> dict[str, int]:
    """Model shape for ``heads`` attention heads: n_layer, n_head, n_embd, head_dim, mlp_hidden."""
    ladder = check_arch(arch)
    if not isinstance(heads, int) or heads < 1:
        raise ValueError(f"heads must be an integer >= 1, got {heads!r}")
    n_layer = math.floor(heads * ladder.layers_per_head)
    if n_layer < 1:
        raise ValueError(f"{arch} with {heads} heads has no layers; use more heads")
    n_embd = heads * ladder.head_dim
    return dict(n_layer=n_layer, n_head=heads, n_embd=n_embd, head_dim=ladder.head_dim,
                mlp_hidden=ladder.mlp_hidden(n_embd))


def arch_defaults(arch: str) -> dict[str, Any]:
    """The ModelConfig fields ``arch`` sets by default (llama: tied embeddings, no z-loss;
    qwen3next: moe)."""
    return dict(check_arch(arch).defaults)


def padded_vocab_size(vocab_size: int) -> int:
    """Round up to a multiple of 64 (GPT-2: 50257 → 50304)."""
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def non_embedding_params(n_embd: int, n_layer: int) -> int:
    """The LR laws' parameter count P = 12·d²·n_layer (exact for Enoki's matrices)."""
    return 12 * n_embd**2 * n_layer


def embedding_params(n_embd: int, padded_vocab: int, tie_embeddings: bool = False) -> int:
    """The token embedding and the output head (one matrix when tied)."""
    return (1 if tie_embeddings else 2) * n_embd * padded_vocab


@dataclasses.dataclass
class ModelConfig:
    """Shape and options of a decoder-only language model.

    ``vocab_size`` is the tokenizer's; the embedding and head use ``padded_vocab_size``.
    ``moe`` (None: dense) makes the MLPs of the layers it selects mixtures of experts.
    ``to_dict`` is flat, with the MoE fields by their release names (the records' form);
    ``from_dict`` reads that form and the nested one.
    """

    arch: str
    n_layer: int
    n_head: int
    n_embd: int
    head_dim: int
    mlp_hidden: int
    vocab_size: int
    max_seq_len: int
    tie_embeddings: bool = False
    init: str = "ScaledGPT"  # ScaledGPT | KarpathyGPT2
    residual_scale: float = 1.0
    z_loss: float = 1e-4
    loss_chunk: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    moe: MoEConfig | None = None

    def __post_init__(self) -> None:
        check_arch(self.arch)
        for name in ("n_layer", "n_head", "n_embd", "head_dim", "mlp_hidden", "vocab_size",
                     "max_seq_len", "loss_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        check_options(self.init, self.z_loss, self.residual_scale)
        if isinstance(self.moe, dict):  # nested, as JSON or YAML give it
            self.moe = MoEConfig(**self.moe)
        if self.moe is not None:
            self.moe.check(self.arch, self.n_layer)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether block ``layer`` has a mixture of experts as its MLP: every block of a MoE
        model unless ``moe`` leaves it dense (qwen3next's ``mlp_only_layers`` and
        ``decoder_sparse_step``)."""
        return self.moe is not None and self.moe.is_moe_layer(layer)

    @property
    def padded_vocab_size(self) -> int:
        return padded_vocab_size(self.vocab_size)

    @property
    def ladder(self) -> Ladder:
        """The architecture's facts (see ``LADDERS``)."""
        return LADDERS[self.arch]

    @classmethod
    def from_heads(cls, arch: str, heads: int, vocab_size: int, max_seq_len: int,
                   **overrides: Any) -> ModelConfig:
        """The ladder model with ``heads`` heads and the architecture's defaults (see
        ``LADDERS``); ``overrides`` are fields, flat or nested as ``from_dict`` reads them."""
        fields = dict(arch=arch, **dimensions(arch, heads), vocab_size=vocab_size,
                      max_seq_len=max_seq_len, **arch_defaults(arch))
        return cls.from_dict({**fields, **overrides})

    def to_dict(self) -> dict[str, Any]:
        """Every field, flat: ``moe`` a bool and the MoE fields by their release names (their
        defaults for a dense model), as run.json, plan.json and model_config.json hold them."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["moe"] = self.moe is not None
        return {**values, **(self.moe or MoEConfig()).flat()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """From ``to_dict``'s flat form (``moe`` a bool; the MoE fields, ignored when it is
        false) or the nested one (``moe`` a MoEConfig, its dict, or None)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known - set(MOE_FLAT_NAMES))
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}; "
                             f"valid: {', '.join(sorted(known | set(MOE_FLAT_NAMES)))}")
        fields = {key: value for key, value in values.items() if key in known}
        flat = {key: value for key, value in values.items() if key in MOE_FLAT_NAMES}
        moe = fields.get("moe")
        if isinstance(moe, dict):
            moe = MoEConfig(**moe)
        if moe is True or (isinstance(moe, MoEConfig) and flat):
            moe = dataclasses.replace(moe if isinstance(moe, MoEConfig) else MoEConfig(),
                                      **MoEConfig.by_field(flat))
        fields["moe"] = moe or None  # False: dense, its flat fields ignored
        return cls(**fields)


def check_options(init: str, z_loss: float, residual_scale: float,
                  name: Callable[[str], str] = str) -> None:
    """The model's options that every architecture takes, one sentence (ValueError) for each
    refusal; ``name`` says a field as the caller's user knows it."""
    if init not in INITS:
        raise ValueError(f"{name('init')} {init!r} is not known; choose one of: "
                         f"{', '.join(INITS)}.")
    for field, value, low, fix in (("z_loss", z_loss, 0, "0 turns the z-loss off"),
                                   ("residual_scale", residual_scale, None, "1.0 is the default")):
        finite = isinstance(value, (int, float)) and math.isfinite(value)
        if finite and (value >= 0 if low == 0 else value > 0):
            continue
        requirement = ("a finite number" if not finite
                       else "at least 0" if low == 0 else "greater than 0")
        raise ValueError(f"{name(field)} must be {requirement} (got {value!r}); {fix}.")


def moe_layers(config: ModelConfig) -> tuple[int, ...]:
    """Indices of the blocks whose MLP is a mixture of experts."""
    return tuple(i for i in range(config.n_layer) if config.is_moe_layer(i))


def mlp_params(config: ModelConfig, hidden: int | None = None) -> int:
    """One MLP (= one expert): GELU d→h→d for Enoki (2dh), SwiGLU for the others (3dh)."""
    hidden = config.mlp_hidden if hidden is None else hidden
    return MLP_MATRICES[config.ladder.mlp] * config.n_embd * hidden


def dense_block_params(config: ModelConfig) -> int:
    """Exact parameters of one dense block: attention, its two norms and the MLP."""
    attention = config.ladder.attention_params(config.n_embd, config.n_head, config.head_dim)
    return attention + 2 * config.n_embd + mlp_params(config)


@dataclasses.dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a model, in two conventions.

    ``non_embedding`` and ``active_non_embedding`` are exact (everything but the embedding and
    head; active: what one token multiplies, its k routed experts instead of all R);
    ``lr_law_params`` is the LR laws' dense 12·d²·L and ``lr_law_params_active`` adds each MoE
    layer's extra active experts, 12·d²·L + L_m·(k+S−1)·P_x, P_x one expert (the router and
    the gated shared expert are not counted, as the LR laws count no norms);
    ``lr_law_params_total`` = 12·d²·L + L_m·((E−1)·P_x + d·R) is the spec's "total" in the
    same convention; ``embedding`` is the embedding and head (one matrix when tied).
    """

    non_embedding: int
    active_non_embedding: int
    lr_law_params: int
    lr_law_params_active: int
    lr_law_params_total: int
    embedding: int


def param_counts(config: ModelConfig) -> ParamCounts:
    """Parameter counts of ``config``'s model without building it (see ``ParamCounts``)."""
    dense = config.n_layer * dense_block_params(config) + config.n_embd  # + final norm
    expert = mlp_params(config)
    n_moe = len(moe_layers(config))
    moe = config.moe or MoEConfig()  # a dense model has no MoE layer: n_moe is 0
    experts, shared, k = moe.num_experts, moe.num_shared_experts, moe.num_experts_per_tok
    router = config.n_embd * moe.routed_experts
    gated = 0
    if moe.use_gated_shared_expert:
        gated = mlp_params(config, moe.shared_expert_intermediate_size) + config.n_embd
    lr_law = non_embedding_params(config.n_embd, config.n_layer)
    return ParamCounts(
        non_embedding=dense + n_moe * ((experts - 1) * expert + router + gated),
        active_non_embedding=dense + n_moe * ((k + shared - 1) * expert + router + gated),
        lr_law_params=lr_law,
        lr_law_params_active=lr_law + n_moe * (k + shared - 1) * expert,
        lr_law_params_total=lr_law + n_moe * ((experts - 1) * expert + router),
        embedding=embedding_params(config.n_embd, config.padded_vocab_size,
                                   config.tie_embeddings),
    )
