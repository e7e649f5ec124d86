"""Mixture of experts: the MLP of a MoE block, token-choice top-k routing over stacked experts.

For hidden states x (N = B·T rows of d), a bias-free router gives logits ℓ (N, R) over the
R = E − S routed experts. Each token picks the k experts of largest logit; their weights are

* ``topk_softmax`` (default): softmax over the k chosen logits (sum 1; with k = 1 the weight is
  always 1 and the LM loss sends no gradient to the router, so a warning says so);
* ``softmax_topk``: the k largest entries of softmax(ℓ) over all R experts (sum < 1).

Both orders select the same experts. The output is y_t = Σ_{s<S} MLP_s(x_t) + Σ_j w_tj ·
MLP_{I_tj}(x_t), plus σ(x_t·w_g)·SE(x_t) with Qwen3-Next's gated shared expert. An expert is
the architecture's own MLP (GELU d→h→d for Enoki, SwiGLU otherwise), stored stacked: one
(experts, out, in) parameter per projection (`Experts`), each slice initialised like a Linear.

Router, softmax, top-k and the router losses run in float32 whatever the autocast; the experts
run in the autocast dtype. The (token, expert) pairs are sorted by expert, each expert
multiplies its contiguous block of rows, and the weighted rows are added back with
``index_add`` (in float32). An expert that receives no row still takes part in the graph with
zero rows, so its gradient is an exact zero tensor, never ``None``: the optimizers' per-
coordinate clocks (Dana-Star's τ) keep advancing for it.

The per-expert matmuls use ``torch._grouped_mm`` (one kernel for all experts, the path
torchtitan takes) where it runs forward and backward, checked once per (device, dtype, shape) by
a trial: bfloat16 with 16-byte-aligned rows (torch.compile's shape checks admit nothing else),
on CUDA and, in torch 2.13, on CPU. Elsewhere (float32, float64) a loop of one matmul per
expert, run eagerly under torch.compile. Measured on a shared 2-core CPU, torch 2.13, forward +
backward of one expert MLP, 4096 rows, d 128, h 512 (the machine had no GPU to time the CUDA
kernel): with 64 experts, the grouped kernel is about 6x faster than the loop
(`benchmarks/moe_experts.py`, numbers in docs/benchmarks.md). In float32 it is not used because
torch.compile refuses it, and the loop keeps float64 (the tests' precision) exact.

Router losses of one layer (the release's definitions; their weighted sum over MoE layers,
divided by n_layer, is added to the training loss by the model):

* load balancing L_aux = Σ_e f_e·P_e, f_e the fraction of tokens routing to e (Σf = k, no
  gradient), P_e = mean_t softmax(ℓ_t)_e; balanced routing gives k/R;
* z-loss L_z = mean_t (logsumexp ℓ_t)²;
* entropy L_ent = Σ_e p̄_e·ln p̄_e of the batch-mean routing p̄ = P (minimum −ln R).
"""

from __future__ import annotations

import functools
import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from danastar.models.config import ModelConfig
from danastar.models.layers import GeluMLP, SwiGLU


def make_mlp(config: ModelConfig, layer: int) -> nn.Module:
    """Block ``layer``'s MLP: a `MoE` where the config says so, else the architecture's MLP."""
    if config.is_moe_layer(layer):
        return MoE(config)
    if config.ladder.mlp == "gelu":
        return GeluMLP(config.n_embd, config.mlp_hidden)
    return SwiGLU(config.n_embd, config.mlp_hidden)


# -- per-expert matmuls ------------------------------------------------------------------------

_GROUPED_MM_WORKS: dict[tuple, bool] = {}


class _ContiguousGradient(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous: ``_grouped_mm``'s
    backward refuses expanded gradients (those of a ``sum()``, say) on some devices."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def _grouped(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    offsets = counts.cumsum(0).to(torch.int32)
    return _ContiguousGradient.apply(torch._grouped_mm(x, weight.transpose(-2, -1),
                                                       offs=offsets))


# Run eagerly under torch.compile: the split sizes are data, and tracing them would specialise
# the graph on each step's expert counts (a recompile per step).
def eager_only(function):
    """``torch.compiler.disable(function)``, made on the first call: the decorator imports
    torch._dynamo, a second or more at the start of every process that merely imports the
    models (command-line tools, analysis) and never compiles. By the time torch.compile traces
    a caller, the first eager call (or the trace itself) has made the disabled function."""
    disabled = None

    @functools.wraps(function)
    def call(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(function)
        return disabled(*args, **kwargs)

    return call


@eager_only
def _looped(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    # every expert is multiplied, also on zero rows: its gradient is then an exact zero
    chunks = torch.split(x, counts.tolist())
    return torch.cat([chunk @ weight[e].T for e, chunk in enumerate(chunks)])


def grouped_mm_works(device: torch.device, dtype: torch.dtype, size_in: int,
                     size_out: int) -> bool:
    """Whether ``torch._grouped_mm`` runs here, forward and backward, agrees with the loop and
    gives an expert without rows an exact-zero gradient (tried once per key)."""
    key = (device.type, device.index, dtype, size_in, size_out)
    works = _GROUPED_MM_WORKS.get(key)  # a plain look-up, which torch.compile traces
    return _try_grouped_mm(key, device, dtype, size_in, size_out) if works is None else works


@eager_only
def _try_grouped_mm(key: tuple, device: torch.device, dtype: torch.dtype, size_in: int,
                    size_out: int) -> bool:
    if key not in _GROUPED_MM_WORKS:
        # torch.compile's shape checks admit bfloat16 with 16-byte-aligned rows only, whatever
        # the eager kernel of the device accepts
        works = (hasattr(torch, "_grouped_mm") and dtype == torch.bfloat16
                 and size_in % 8 == 0 and size_out % 8 == 0)
        if works:
            try:
                with torch.enable_grad(), torch.autocast(device.type, enabled=False):
                    generator = torch.Generator(device).manual_seed(0)
                    x = torch.randn(24, size_in, device=device, dtype=dtype, generator=generator)
                    w = torch.randn(3, size_out, size_in, device=device, dtype=dtype,
                                    generator=generator)
                    counts = torch.tensor([16, 0, 8], device=device)
                    grads = []
                    for function in (_grouped, _looped):
                        weight = w.clone().requires_grad_()
                        function(x, weight, counts).sum().backward()
                        grads.append(weight.grad)
                tolerance = 1e-2 * grads[1].abs().max().item()
                works = (bool(torch.all(grads[0][1] == 0))
                         and (grads[0] - grads[1]).abs().max().item() <= tolerance)
            except (RuntimeError, NotImplementedError, TypeError, ValueError):
                works = False
        _GROUPED_MM_WORKS[key] = works
    return _GROUPED_MM_WORKS[key]


def expert_matmul(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor,
                  grouped: bool | None = None) -> torch.Tensor:
    """Rows of ``x`` (M, in), sorted by expert with ``counts[e]`` rows for expert e, times
    their expert's ``weight[e]`` (out, in) transposed: (M, out).

    Under autocast both run in the autocast dtype. ``grouped`` forces (True) or forbids
    (False) ``torch._grouped_mm``; None chooses it where it works (see the module docstring).
    """
    device = x.device
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
        x, weight = x.to(dtype), weight.to(dtype)
    if grouped is None:
        grouped = grouped_mm_works(device, x.dtype, weight.shape[2], weight.shape[1])
    return (_grouped if grouped else _looped)(x, weight, counts)


class Experts(nn.Module):
    """``num_experts`` MLPs stored stacked: ``up_proj`` (E, h, d), ``down_proj`` (E, d, h) and,
    for SwiGLU, ``gate_proj`` (E, h, d); slice e is expert e's Linear weight."""

    def __init__(self, num_experts: int, dim: int, hidden: int, swiglu: bool):
        super().__init__()
        self.swiglu = swiglu
        if swiglu:
            self.gate_proj = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.up_proj = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.down_proj = nn.Parameter(torch.empty(num_experts, dim, hidden))

    @property
    def num_experts(self) -> int:
        return self.up_proj.shape[0]

    @torch.no_grad()
    def init_weights(self, scaled: bool, depth: int) -> None:
        """Each slice as a Linear: N(0, 1/fan_in) (``scaled``) or N(0, 0.02²); ``down_proj``, a
        residual output, further divided by √depth."""
        for name, param in self.named_parameters():
            std = param.shape[2] ** -0.5 if scaled else 0.02
            if name == "down_proj":
                std /= math.sqrt(depth)
            nn.init.normal_(param, std=std)

    def forward(self, x: torch.Tensor, counts: torch.Tensor,
                grouped: bool | None = None) -> torch.Tensor:
        """Expert e applied to its block of ``counts[e]`` consecutive rows of ``x`` (M, d)."""
        up = expert_matmul(x, self.up_proj, counts, grouped)
        if self.swiglu:
            hidden = F.silu(expert_matmul(x, self.gate_proj, counts, grouped)) * up
        else:
            hidden = F.gelu(up)
        return expert_matmul(hidden, self.down_proj, counts, grouped)

    def every_expert(self, x: torch.Tensor) -> torch.Tensor:
        """Σ_e expert_e(x) for every row of ``x`` (N, d): the shared experts."""
        rows = x.shape[0]
        counts = torch.full((self.num_experts,), rows, dtype=torch.long, device=x.device)
        out = self(x.repeat(self.num_experts, 1), counts)
        return out.view(self.num_experts, rows, -1).sum(0)


def router_losses(logits: torch.Tensor, counts: torch.Tensor) -> dict[str, torch.Tensor]:
    """The three router losses of one layer from float32 ``logits`` (N, R) and the number of
    tokens routed to each expert ``counts`` (R,)."""
    fraction = counts.float() / logits.shape[0]  # f_e, Σ = k
    mean_probs = torch.softmax(logits, dim=-1).mean(0)  # P_e = p̄_e
    return {
        "aux": (fraction * mean_probs).sum(),
        "z": torch.logsumexp(logits, dim=-1).square().mean(),
        "entropy": torch.special.xlogy(mean_probs, mean_probs).sum(),
    }


class MoE(nn.Module):
    """A block's MLP as a mixture of experts (see the module docstring).

    After each forward, ``router_losses`` holds the layer's three losses (with gradients),
    ``load`` the fraction of routed (token, expert) pairs per expert (R,) and ``dropped`` the
    pairs a capacity dropped and all pairs; the model collects them. ``dispatcher`` (None:
    local experts) lets expert parallelism run the experts: it is called as
    ``dispatcher(x_sorted, counts, experts, token_order=order)`` (``order``: each sorted row's
    position among the token-major pairs) and returns ``(out, dropped_pairs)``.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        dim, hidden = config.n_embd, config.mlp_hidden
        swiglu = config.ladder.mlp == "swiglu"
        moe = config.moe
        self.num_routed = moe.routed_experts
        self.top_k = moe.num_experts_per_tok
        self.softmax_order = moe.softmax_order
        if self.top_k == 1 and self.softmax_order == "topk_softmax":
            warnings.warn("with one expert per token and moe_softmax_order topk_softmax the "
                          "routing weight is always 1, so the LM loss gives the router no "
                          "gradient (only the router losses train it); use softmax_topk to "
                          "train it by the LM loss", stacklevel=2)
        self.router = nn.Linear(dim, self.num_routed, bias=False)
        self.experts = Experts(self.num_routed, dim, hidden, swiglu)
        self.shared_experts = (Experts(moe.num_shared_experts, dim, hidden, swiglu)
                               if moe.num_shared_experts else None)
        if moe.use_gated_shared_expert:
            self.shared_expert = SwiGLU(dim, moe.shared_expert_intermediate_size or hidden)
            self.shared_expert_gate = nn.Linear(dim, 1, bias=False)
        else:
            self.shared_expert = self.shared_expert_gate = None
        self.dispatcher = None
        self.router_losses: dict[str, torch.Tensor] = {}
        self.load: torch.Tensor | None = None
        self.dropped: tuple[int, int] = (0, 0)

    def __getstate__(self) -> dict:
        # the last forward's losses belong to its graph: copies and pickles start without them
        return {**super().__getstate__(), "router_losses": {}}

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """float32 router logits (N, R), weights (N, k) and expert indices (N, k)."""
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(x.float(), self.router.weight.float())
            if self.softmax_order == "topk_softmax":
                top_logits, indices = logits.topk(self.top_k, dim=-1)
                weights = torch.softmax(top_logits, dim=-1)
            else:
                weights, indices = torch.softmax(logits, dim=-1).topk(self.top_k, dim=-1)
        return logits, weights, indices

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits, weights, indices = self.route(x)
        flat = indices.flatten()  # (N·k) pairs, token-major
        order = flat.argsort(stable=True)
        token = order // self.top_k
        # tokens per expert, in a shape torch.compile knows (bincount's depends on the data)
        counts = flat.new_zeros(self.num_routed).index_add_(0, flat, torch.ones_like(flat))
        x_sorted = x[token]
        if self.dispatcher is None:
            out, dropped = self.experts(x_sorted, counts), 0
        else:
            # the pairs' token-major order: a capacity drops the last pairs in token order
            out, dropped = self.dispatcher(x_sorted, counts, self.experts, token_order=order)
        weighted = out.float() * weights.flatten()[order, None]
        y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        y = y.index_add(0, token, weighted)
        if self.shared_experts is not None:
            y = y + self.shared_experts.every_expert(x).float()
        if self.shared_expert is not None:
            with torch.autocast(x.device.type, enabled=False):
                gate = torch.sigmoid(F.linear(x.float(), self.shared_expert_gate.weight.float()))
            y = y + gate * self.shared_expert(x).float()

        with torch.autocast(x.device.type, enabled=False):
            self.router_losses = router_losses(logits, counts)
        self.load = (counts.float() / flat.numel()).detach()
        self.dropped = (dropped, flat.numel())
        return y.to(out.dtype).view(shape)


def collect(model: nn.Module, n_layer: int, config: ModelConfig,
            training: bool) -> tuple[torch.Tensor | float, dict[str, torch.Tensor]]:
    """The router-loss term of the training loss, Σ_layers factor·L / n_layer (0 unless
    ``training``), and the detached ``moe`` statistics of the model's last forward."""
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    if not layers:
        return 0.0, {}
    totals = {name: torch.stack([m.router_losses[name] for m in layers]).sum()
              for name in ("aux", "z", "entropy")}
    for layer in layers:  # the loss holds them now; the layers keep no graph alive
        layer.router_losses = {}
    term: torch.Tensor | float = 0.0
    if training:
        moe = config.moe
        if moe.router_loss == "entropy":
            term = moe.entropy_loss_factor * totals["entropy"]
        else:
            term = moe.aux_loss_factor * totals["aux"]
            if moe.router_loss == "load_balancing_z_loss":
                term = term + moe.z_loss_factor * totals["z"]
        term = term / n_layer
    load = torch.stack([m.load for m in layers])
    dropped = sum(m.dropped[0] for m in layers)
    pairs = sum(m.dropped[1] for m in layers)
    stats = {
        "moe_aux_loss": totals["aux"].detach(),
        "moe_z_loss": totals["z"].detach(),
        "moe_entropy_loss": totals["entropy"].detach(),
        "moe_load": load,
        "moe_max_load": load.max() * load.shape[1],  # f_e·R/k with load = f_e/k
        "moe_dropped_fraction": torch.tensor(float(dropped) / max(pairs, 1)),
    }
    return term, stats
