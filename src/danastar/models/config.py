"""The model configuration shared by every architecture, and the facts that describe a model
without building it: the architectures and how each grows with its number of heads, vocabulary
padding, which layers are mixtures of experts, and the parameter counts (exact, active, and the
LR laws' convention)."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

INITS = ("ScaledGPT", "KarpathyGPT2")
VOCAB_MULTIPLE = 64  # vocabularies are padded to a multiple of this for fast matmuls


@dataclasses.dataclass(frozen=True)
class Ladder:
    """How an architecture grows with its number of heads h: n_embd = h · head_dim,
    n_layer = ⌊h · layers_per_head⌋, MLP hidden = mlp_multiple · ⌈⌊mlp_ratio · n_embd⌋ /
    mlp_multiple⌉ (Llama rounds its 8d/3 up to a multiple of 256). ``defaults`` are the
    ModelConfig fields the architecture sets differently from the dataclass defaults."""

    head_dim: int
    layers_per_head: Fraction
    mlp_ratio: Fraction
    mlp_multiple: int = 1
    defaults: tuple[tuple[str, Any], ...] = ()

    def mlp_hidden(self, n_embd: int) -> int:
        return -(-math.floor(self.mlp_ratio * n_embd) // self.mlp_multiple) * self.mlp_multiple


# The architectures (build_model's registry has one class per name) and their ladders.
LADDERS: dict[str, Ladder] = {
    "enoki": Ladder(head_dim=64, layers_per_head=Fraction(3, 4), mlp_ratio=Fraction(4)),
    "qwen3": Ladder(head_dim=128, layers_per_head=Fraction(2), mlp_ratio=Fraction(3)),
    # the release's dense baseline: Enoki's ladder, SwiGLU hidden 256·⌈⌊8d/3⌋/256⌉, always
    # tied embeddings, no z-loss
    "llama": Ladder(head_dim=64, layers_per_head=Fraction(3, 4), mlp_ratio=Fraction(8, 3),
                    mlp_multiple=256, defaults=(("tie_embeddings", True), ("z_loss", 0.0))),
    # Qwen3 blocks with mixture-of-experts MLPs; the architecture implies moe
    "qwen3next": Ladder(head_dim=128, layers_per_head=Fraction(2), mlp_ratio=Fraction(3),
                        defaults=(("moe", True),)),
}
ARCHITECTURES = tuple(LADDERS)

MOE_SOFTMAX_ORDERS = ("topk_softmax", "softmax_topk")
MOE_ROUTER_LOSSES = ("load_balancing_z_loss", "load_balancing_only", "entropy")


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
    init: str = "ScaledGPT"
    residual_scale: float = 1.0
    z_loss: float = 1e-4
    loss_chunk: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # mixture of experts (models/moe.py): E experts of which S shared, k routed per token
    moe: bool = False
    moe_num_experts: int = 8
    moe_num_shared_experts: int = 0
    moe_num_experts_per_tok: int = 2
    moe_softmax_order: str = "topk_softmax"
    moe_router_loss: str = "load_balancing_z_loss"
    moe_aux_loss_factor: float = 0.1
    moe_z_loss_factor: float = 0.01
    moe_entropy_loss_factor: float = 0.01
    # qwen3next only: the gated shared expert and which layers are MoE
    use_gated_shared_expert: bool = False
    shared_expert_intermediate_size: int | None = None
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # expert parallelism only: per-destination buffer factor, 0 = dropless
    moe_expert_capacity_factor: float = 0.0

    def __post_init__(self) -> None:
        check_arch(self.arch)
        for name in ("n_layer", "n_head", "n_embd", "head_dim", "mlp_hidden", "vocab_size",
                     "max_seq_len", "loss_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.init not in INITS:
            raise ValueError(f"unknown init {self.init!r}; valid choices: {', '.join(INITS)}")
        if self.z_loss < 0:
            raise ValueError(f"z_loss must be >= 0, got {self.z_loss}")
        self.mlp_only_layers = tuple(self.mlp_only_layers)  # a list after JSON or YAML
        if self.moe:
            self._check_moe()
        elif self.use_gated_shared_expert:
            raise ValueError("use_gated_shared_expert needs moe; turn moe on or drop it")

    def _check_moe(self) -> None:
        experts, shared, k = (self.moe_num_experts, self.moe_num_shared_experts,
                              self.moe_num_experts_per_tok)
        for name, value, low in (("moe_num_experts", experts, 1),
                                 ("moe_num_shared_experts", shared, 0),
                                 ("moe_num_experts_per_tok", k, 1),
                                 ("decoder_sparse_step", self.decoder_sparse_step, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if shared >= experts:
            raise ValueError(f"moe_num_shared_experts ({shared}) must be below moe_num_experts "
                             f"({experts}); use fewer shared experts or more experts")
        if k > experts - shared:
            raise ValueError(f"moe_num_experts_per_tok ({k}) exceeds the {experts - shared} "
                             "routed experts (moe_num_experts - moe_num_shared_experts); "
                             "route fewer experts per token or add experts")
        if self.moe_softmax_order not in MOE_SOFTMAX_ORDERS:
            raise ValueError(f"unknown moe_softmax_order {self.moe_softmax_order!r}; valid "
                             f"choices: {', '.join(MOE_SOFTMAX_ORDERS)}")
        if self.moe_router_loss not in MOE_ROUTER_LOSSES:
            raise ValueError(f"unknown moe_router_loss {self.moe_router_loss!r}; valid "
                             f"choices: {', '.join(MOE_ROUTER_LOSSES)}")
        for name in ("moe_aux_loss_factor", "moe_z_loss_factor", "moe_entropy_loss_factor",
                     "moe_expert_capacity_factor"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        size = self.shared_expert_intermediate_size
        if size is not None and (not isinstance(size, int) or size < 1):
            raise ValueError(f"shared_expert_intermediate_size must be a positive integer, "
                             f"got {size!r}")
        if self.arch != "qwen3next":
            for name, default in (("use_gated_shared_expert", False),
                                  ("shared_expert_intermediate_size", None),
                                  ("decoder_sparse_step", 1), ("mlp_only_layers", ())):
                if getattr(self, name) != default:
                    raise ValueError(f"{name} applies to arch qwen3next only; drop it or use "
                                     "arch qwen3next")
        if self.use_gated_shared_expert and shared:
            raise ValueError("the gated shared expert replaces the shared experts; set "
                             "moe_num_shared_experts to 0")
        if size is not None and not self.use_gated_shared_expert:
            raise ValueError("shared_expert_intermediate_size sizes the gated shared expert; "
                             "turn on use_gated_shared_expert or drop it")
        bad = [i for i in self.mlp_only_layers
               if not isinstance(i, int) or not 0 <= i < self.n_layer]
        if bad:
            raise ValueError(f"mlp_only_layers {bad} are not layers of this {self.n_layer}-layer "
                             f"model; use indices 0..{self.n_layer - 1}")
        if not moe_layers(self):
            raise ValueError("mlp_only_layers and decoder_sparse_step leave no MoE layer; keep "
                             "at least one layer as a mixture of experts or turn moe off")

    @property
    def moe_routed_experts(self) -> int:
        """R = E − S, the experts the router chooses among."""
        return self.moe_num_experts - self.moe_num_shared_experts

    def is_moe_layer(self, layer: int) -> bool:
        """Whether block ``layer`` has a mixture of experts as its MLP. Enoki, Qwen3 and Llama:
        every block when ``moe``; qwen3next: also layer ∉ mlp_only_layers and
        layer % decoder_sparse_step == 0 (the release's rule; Hugging Face uses layer + 1)."""
        return (self.moe and layer not in self.mlp_only_layers
                and layer % self.decoder_sparse_step == 0)

    @property
    def padded_vocab_size(self) -> int:
        return padded_vocab_size(self.vocab_size)

    @classmethod
    def from_heads(cls, arch: str, heads: int, vocab_size: int, max_seq_len: int,
                   **overrides: Any) -> ModelConfig:
        """The ladder model with ``heads`` heads and the architecture's defaults (see
        ``LADDERS``)."""
        fields = dict(arch=arch, **dimensions(arch, heads), vocab_size=vocab_size,
                      max_seq_len=max_seq_len, **arch_defaults(arch))
        return cls(**{**fields, **overrides})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}; "
                             f"valid: {', '.join(sorted(known))}")
        return cls(**values)


def moe_layers(config: ModelConfig) -> tuple[int, ...]:
    """Indices of the blocks whose MLP is a mixture of experts."""
    return tuple(i for i in range(config.n_layer) if config.is_moe_layer(i))


def mlp_params(config: ModelConfig, hidden: int | None = None) -> int:
    """One MLP (= one expert): GELU d→h→d for Enoki (2dh), SwiGLU for the others (3dh)."""
    hidden = config.mlp_hidden if hidden is None else hidden
    return (2 if config.arch == "enoki" else 3) * config.n_embd * hidden


def dense_block_params(config: ModelConfig) -> int:
    """Exact parameters of one dense block: attention, its norms and the MLP."""
    d, inner, hd = config.n_embd, config.n_head * config.head_dim, config.head_dim
    attention = {  # input projections, o_proj, per-head q/k norm weights
        "enoki": 3 * d * inner + inner * d + 2 * hd,
        "qwen3": 2 * d * inner + 2 * d * inner + inner * d + 2 * hd,  # q_proj carries the gate
        "qwen3next": 2 * d * inner + 2 * d * inner + inner * d + 2 * hd,
        "llama": 3 * d * inner + inner * d,
    }[config.arch]
    return attention + 2 * d + mlp_params(config)


def param_counts(config: ModelConfig) -> dict[str, int]:
    """Parameter counts of ``config``'s model without building it.

    ``non_embedding`` and ``active_non_embedding`` are exact (everything but the embedding and
    head; active: what one token multiplies, its k routed experts instead of all R);
    ``lr_law_params`` is the LR laws' dense 12·d²·L and ``lr_law_params_active`` adds each MoE
    layer's extra active experts, 12·d²·L + L_m·(k+S−1)·P_x, P_x one expert (the router and
    the gated shared expert are not counted, as the LR laws count no norms);
    ``lr_law_params_total`` = 12·d²·L + L_m·((E−1)·P_x + d·R) is the spec's "total" in the
    same convention; ``embedding`` is the embedding and head (one matrix when tied).
    """
    dense = config.n_layer * dense_block_params(config) + config.n_embd  # + final norm
    expert = mlp_params(config)
    n_moe = len(moe_layers(config))
    routed, shared, k = (config.moe_routed_experts, config.moe_num_shared_experts,
                         config.moe_num_experts_per_tok)
    router = config.n_embd * routed
    gated = 0
    if config.use_gated_shared_expert:
        gated = mlp_params(config, config.shared_expert_intermediate_size) + config.n_embd
    lr_law = non_embedding_params(config.n_embd, config.n_layer)
    return {
        "non_embedding": dense + n_moe * ((config.moe_num_experts - 1) * expert + router + gated),
        "active_non_embedding": dense + n_moe * ((k + shared - 1) * expert + router + gated),
        "lr_law_params": lr_law,
        "lr_law_params_active": lr_law + n_moe * (k + shared - 1) * expert,
        "lr_law_params_total": lr_law + n_moe * ((config.moe_num_experts - 1) * expert + router),
        "embedding": embedding_params(config.n_embd, config.padded_vocab_size,
                                      config.tie_embeddings),
    }
