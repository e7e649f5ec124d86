"""The decoder-only transformer every architecture shares: token embedding → pre-norm blocks →
final norm → output head, plus initialisation, the loss (with the router losses of mixture-of-
experts layers), parameter groups, parameter counts, FLOPs and generation.

An architecture subclasses :class:`Transformer` and supplies ``make_block`` and ``make_norm``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from danastar.models import moe
from danastar.models.config import ModelConfig, embedding_params, param_counts
from danastar.models.layers import KVCache, RMSNorm, rope_frequencies
from danastar.models.loss import LossOutput, chunked_cross_entropy
from danastar.optim.weight_decay import param_groups


class Transformer(nn.Module):
    # Whether the loss's elementwise work runs compiled (set when the blocks are compiled).
    compile_loss: bool = False

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        vocab = config.padded_vocab_size
        self.embed = nn.Embedding(vocab, config.n_embd)
        self.blocks = nn.ModuleList(self.make_block(config, i) for i in range(config.n_layer))
        self.norm = self.make_norm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, vocab, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("rope", self.rope_table(config), persistent=False)
        if not self.rope.is_meta:  # a meta model has no values to set (see rope_table)
            self.init_weights()

    # -- supplied by each architecture --------------------------------------------------------

    # block submodules that tensor parallelism splits by output (colwise) and by input (rowwise)
    tp_colwise: tuple[str, ...] = ()
    tp_rowwise: tuple[str, ...] = ()
    tp_per_head_norms: tuple[str, ...] = ()  # norms applied per head (weight shared by heads)

    @staticmethod
    def make_block(config: ModelConfig, layer: int) -> nn.Module:
        raise NotImplementedError

    @staticmethod
    def make_norm(dim: int, eps: float) -> nn.Module:
        raise NotImplementedError

    # -- initialisation -----------------------------------------------------------------------

    @staticmethod
    def rope_table(config: ModelConfig) -> torch.Tensor:
        """The RoPE table on the default device; on the meta device (a model built for its
        shapes), computed on the CPU and moved there: torch's meta kernels of these factory
        ops import its compiler (torch._dynamo), two seconds at the start of a command."""
        if torch.get_default_device().type != "meta":
            return rope_frequencies(config.head_dim, config.max_seq_len, config.rope_theta)
        return rope_frequencies(config.head_dim, config.max_seq_len, config.rope_theta,
                                device=torch.device("cpu")).to("meta")

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter and the RoPE tables (also after meta-device creation).

        ScaledGPT: Linear N(0, 1/fan_in), embedding N(0, 1/d), residual outputs
        N(0, 1/(2·fan_in·n_layer)). KarpathyGPT2: N(0, 0.02²), residual outputs
        N(0, (0.02/√(2·n_layer))²). Norm weights are 1. Stacked experts: each slice as a Linear.
        """
        config = self.config
        scaled = config.init == "ScaledGPT"
        depth = 2 * config.n_layer
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.weight is not self.embed.weight:
                fan_in = module.in_features
                std = fan_in ** -0.5 if scaled else 0.02
                if getattr(module, "is_residual_output", False):
                    std /= math.sqrt(depth)
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, moe.Experts):
                module.init_weights(scaled, depth)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=config.n_embd ** -0.5 if scaled else 0.02)
            elif isinstance(module, (nn.LayerNorm, RMSNorm)):
                module.reset_parameters()
        self.rope.copy_(rope_frequencies(config.head_dim, config.max_seq_len, config.rope_theta,
                                         device=self.rope.device))

    # -- forward ------------------------------------------------------------------------------

    def hidden_states(self, idx: torch.Tensor, caches: list[KVCache] | None = None,
                      pos: int = 0) -> torch.Tensor:
        """Final-norm output (B, T, d) for tokens ``idx`` (B, T) at positions pos..pos+T."""
        seq_len = idx.shape[1]
        if pos + seq_len > self.config.max_seq_len:
            raise ValueError(f"sequence of {pos + seq_len} tokens exceeds max_seq_len "
                             f"{self.config.max_seq_len}")
        rope = self.rope[pos:pos + seq_len]
        x = self.embed(idx)
        for i, block in enumerate(self.blocks):
            x = block(x, rope, None if caches is None else caches[i], pos)
        return self.norm(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (B, T, padded V) or, with targets (−1 = ignore), the chunked ``LossOutput``."""
        hidden = self.hidden_states(idx)
        if targets is None:
            return self.lm_head(hidden)
        loss, ce, z, _ = chunked_cross_entropy(hidden, self.lm_head.weight, targets,
                                               z_loss=self.config.z_loss,
                                               chunk=self.config.loss_chunk,
                                               compiled=self.compile_loss)
        # mixtures of experts: Σ factor·L / n_layer in training, statistics always
        router_term, stats = moe.collect(self, self.config.n_layer, self.config, self.training)
        return LossOutput(loss + router_term, ce, z, stats)

    # -- bookkeeping --------------------------------------------------------------------------

    def param_groups(self, weight_decay: float) -> list[dict]:
        """Two groups, by the optimizers' rule (``danastar.optim.param_groups``): Linear weights
        (incl. an untied head) and stacked experts decay; embeddings (a tied head is the
        embedding), norms and 1-D parameters don't."""
        return param_groups(self, weight_decay)

    def num_params(self, exact: bool = True, non_embedding: bool = False,
                   active: bool = False) -> int:
        """Parameter count: the real one (``exact``) or the LR laws' 12·d²·L (+ 2·d·V).

        ``active``: what one token multiplies, counting k of each MoE layer's R routed experts
        (exact), or 12·d²·L + L_m·(k+S−1)·P_x (the LR laws' convention)."""
        config = self.config
        if exact:
            total = sum(p.numel() for p in self.parameters())
            if active:
                for module in self.modules():
                    if isinstance(module, moe.MoE):
                        per_expert = sum(p[0].numel() for p in module.experts.parameters())
                        total -= (module.num_routed - module.top_k) * per_expert
            if non_embedding:
                total -= sum(p.numel() for p in {self.embed.weight, self.lm_head.weight})
            return total
        counts = param_counts(config)
        count = counts.lr_law_params_active if active else counts.lr_law_params
        if not non_embedding:
            count += embedding_params(config.n_embd, config.padded_vocab_size,
                                      config.tie_embeddings)
        return count

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token: 6·N for the weights every token multiplies (all active
        parameters, router and head included, but not the embedding lookup) plus
        12·L·H·hd·T for attention scores and values (the full T×T, as in PaLM's MFU)."""
        config = self.config
        matmul_params = self.num_params(active=True)
        if not config.tie_embeddings:
            matmul_params -= self.embed.weight.numel()
        attention = 12 * config.n_layer * config.n_head * config.head_dim * seq_len
        return 6 * matmul_params + attention

    # -- sampling -----------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None) -> torch.Tensor:
        """Continue ``idx`` (B, T) by ``max_new_tokens`` tokens with a KV cache.

        ``temperature == 0`` is greedy; ``top_k`` keeps the k most likely tokens. Only real
        (unpadded) vocabulary entries are sampled.
        """
        total = idx.shape[1] + max_new_tokens
        if total > self.config.max_seq_len:
            raise ValueError(f"prompt plus new tokens ({total}) exceeds max_seq_len "
                             f"{self.config.max_seq_len}")
        caches = [KVCache(total) for _ in self.blocks]
        pos, step_input = 0, idx
        for _ in range(max_new_tokens):
            hidden = self.hidden_states(step_input, caches, pos)
            logits = self.lm_head(hidden[:, -1]).float()[:, :self.config.vocab_size]
            pos += step_input.shape[1]
            step_input = sample(logits, temperature, top_k)
            idx = torch.cat((idx, step_input), dim=1)
        return idx


def sample(logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    """One token per row of ``logits`` (B, V) → (B, 1)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
