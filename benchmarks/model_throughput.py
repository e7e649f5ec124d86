"""Forward + backward throughput of Enoki and Qwen3 against the same models written the plain
nanoGPT way, measured in the same run.

The plain versions below compute the same function (same shapes, norms, RoPE, gate, loss) the
straightforward way: one module per idea, llama-style complex RoPE, and the loss from the full
(B, T, V) logits with F.cross_entropy; loaded with danastar's weights it must give the same
loss. Iterations alternate between the two implementations (in
alternating order) so that a shared, noisy machine slows both alike; the medians are reported.

    python benchmarks/model_throughput.py                      # CPU-sized models, fp32
    python benchmarks/model_throughput.py --device cuda        # 124M-class, bf16 + compile
    python benchmarks/model_throughput.py --device cuda --batch 32 --seq_len 2048 --models enoki:12
    python benchmarks/model_throughput.py --evaluation         # forward alone, under no_grad

On CUDA the optimizer step (ADana, compiled) is timed as well, so that forward + backward can be
compared with the whole update, and the peak memory of the measured steps is reported.

Writes benchmarks/results/model_throughput-<device>[-evaluation].json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from danastar.models import ModelConfig, build_model

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense, per GPU


# -- the plain nanoGPT-style reference ---------------------------------------------------------


class PlainAttention(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.c = c
        inner = c.n_head * c.head_dim
        norm = nn.LayerNorm if c.arch == "enoki" else nn.RMSNorm
        self.q_norm = norm(c.head_dim, eps=c.norm_eps)
        self.k_norm = norm(c.head_dim, eps=c.norm_eps)
        if c.arch == "enoki":
            self.c_attn = nn.Linear(c.n_embd, 3 * inner, bias=False)
        else:
            self.q_proj = nn.Linear(c.n_embd, 2 * inner, bias=False)  # queries and gates
            self.k_proj = nn.Linear(c.n_embd, inner, bias=False)
            self.v_proj = nn.Linear(c.n_embd, inner, bias=False)
        self.c_proj = nn.Linear(inner, c.n_embd, bias=False)

    def forward(self, x, freqs_cis):
        B, T, _ = x.shape
        H, hd = self.c.n_head, self.c.head_dim
        if self.c.arch == "enoki":
            q, k, v = self.c_attn(x).view(B, T, H, 3, hd).unbind(3)
            gate = None
        else:
            q, gate = self.q_proj(x).view(B, T, H, 2 * hd).chunk(2, dim=-1)
            k, v = self.k_proj(x).view(B, T, H, hd), self.v_proj(x).view(B, T, H, hd)
        q, k = rotate(self.q_norm(q), freqs_cis), rotate(self.k_norm(k), freqs_cis)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True).transpose(1, 2)
        if gate is not None:
            y = y * torch.sigmoid(gate)
        return self.c_proj(y.reshape(B, T, H * hd))


def rotate(x, freqs_cis):
    """llama's RoPE: interleaved pairs as complex numbers."""
    x_complex = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_complex * freqs_cis[:, None, :]).flatten(3).type_as(x)


class PlainBlock(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        norm = nn.LayerNorm if c.arch == "enoki" else nn.RMSNorm
        kwargs = dict(bias=False) if c.arch == "enoki" else {}
        self.ln_1 = norm(c.n_embd, eps=c.norm_eps, **kwargs)
        self.ln_2 = norm(c.n_embd, eps=c.norm_eps, **kwargs)
        self.attn = PlainAttention(c)
        self.gelu = c.arch == "enoki"
        self.c_fc = nn.Linear(c.n_embd, c.mlp_hidden if self.gelu else 2 * c.mlp_hidden, bias=False)
        self.c_proj = nn.Linear(c.mlp_hidden, c.n_embd, bias=False)

    def forward(self, x, freqs_cis):
        x = x + self.attn(self.ln_1(x), freqs_cis)
        h = self.c_fc(self.ln_2(x))
        if self.gelu:
            h = F.gelu(h)
        else:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return x + self.c_proj(h)


class PlainGPT(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c.padded_vocab_size, c.n_embd)
        self.h = nn.ModuleList(PlainBlock(c) for _ in range(c.n_layer))
        norm = nn.LayerNorm if c.arch == "enoki" else nn.RMSNorm
        no_bias = dict(bias=False) if c.arch == "enoki" else {}
        self.ln_f = norm(c.n_embd, eps=c.norm_eps, **no_bias)
        self.lm_head = nn.Linear(c.n_embd, c.padded_vocab_size, bias=False)
        freqs = 1.0 / c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim)
        angles = torch.outer(torch.arange(c.max_seq_len).float(), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))

    def forward(self, idx, targets):
        x = self.wte(idx)
        freqs_cis = self.freqs_cis[:idx.shape[1]]
        for block in self.h:
            x = block(x, freqs_cis)
        logits = self.lm_head(self.ln_f(x)).float()
        ce = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return ce + self.c.z_loss * torch.logsumexp(logits, dim=-1).square().mean()


def copy_weights(plain: PlainGPT, ours: nn.Module) -> None:
    """Give the plain model danastar's weights, to check the two compute the same function."""
    pairs = [(plain.wte, ours.embed), (plain.ln_f, ours.norm), (plain.lm_head, ours.lm_head)]
    for mine, block in zip(plain.h, ours.blocks):
        if plain.c.arch == "enoki":
            attn, norms, mlp = block.attn, (block.attn_norm, block.mlp_norm), block.mlp
            pairs.append((mine.attn.c_attn, attn.qkv_proj))
            up = mlp.up_proj.weight
        else:
            attn, mlp = block.self_attn, block.mlp
            norms = (block.input_layernorm, block.post_attention_layernorm)
            pairs += [(mine.attn.q_proj, attn.q_proj), (mine.attn.k_proj, attn.k_proj),
                      (mine.attn.v_proj, attn.v_proj)]
            up = torch.cat((mlp.gate_proj.weight, mlp.up_proj.weight))
        pairs += [(mine.ln_1, norms[0]), (mine.ln_2, norms[1]), (mine.attn.q_norm, attn.q_norm),
                  (mine.attn.k_norm, attn.k_norm), (mine.attn.c_proj, attn.o_proj),
                  (mine.c_proj, mlp.down_proj)]
        with torch.no_grad():
            mine.c_fc.weight.copy_(up)
    with torch.no_grad():
        for target, source in pairs:
            target.weight.copy_(source.weight)


# -- measurement -------------------------------------------------------------------------------


def step_seconds(model, idx, targets, autocast, danastar_api: bool, evaluation: bool
                 ) -> tuple[float, float]:
    """Wall time and process CPU time of one forward + backward (`evaluation`: one forward
    under no_grad, as a validation batch). On a shared CPU the CPU time is the steadier
    measure: waiting for a core does not count."""
    synchronize(idx.device)
    start, start_cpu = time.perf_counter(), time.process_time()
    with autocast, torch.set_grad_enabled(not evaluation):
        out = model(idx, targets)
    if not evaluation:
        (out.loss if danastar_api else out).backward()
    synchronize(idx.device)
    return time.perf_counter() - start, time.process_time() - start_cpu


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None  # no meaningful peak for a shared CPU
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def optimizer_step_seconds(model: nn.Module, steps: int) -> float:
    """Median seconds of one ADana step (compiled) over ``model``'s parameters and gradients."""
    from danastar.optim import ADana

    optimizer = ADana(model.parameters(), lr=1e-4, weight_decay=4e-3, wd_ts=1000,
                      impl="compiled")
    times = []
    for i in range(steps + 2):  # two warm-up steps create the state and compile
        synchronize(next(model.parameters()).device)
        start = time.perf_counter()
        optimizer.step()
        synchronize(next(model.parameters()).device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(config: ModelConfig, batch: int, steps: int, warmup: int, device: torch.device,
            bf16: bool, compile_: bool, evaluation: bool = False) -> dict:
    torch.manual_seed(0)
    ours = build_model(config).to(device)
    plain = PlainGPT(config).to(device)
    idx = torch.randint(0, config.vocab_size, (batch, config.max_seq_len), device=device)
    targets = torch.roll(idx, -1, dims=1)
    copy_weights(plain, ours)
    with torch.no_grad():  # the comparison is only fair if both compute the same loss
        same = torch.allclose(ours(idx, targets).loss, plain(idx, targets), rtol=1e-4)
    if not same:
        raise AssertionError("the reference model does not compute the same loss as danastar's")
    if compile_:
        ours.compile()
        plain.compile()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    times = {"danastar": [], "nanogpt_style": []}
    cpu_times = {"danastar": [], "nanogpt_style": []}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    pair = [("danastar", ours), ("nanogpt_style", plain)]
    for i in range(warmup + steps):  # alternate (ABBA...), so machine noise hits both alike
        for name, model in (pair if i % 2 == 0 else pair[::-1]):
            model.zero_grad(set_to_none=True)
            seconds, cpu_seconds = step_seconds(model, idx, targets, autocast, name == "danastar",
                                                evaluation)
            if i >= warmup:
                times[name].append(seconds)
                cpu_times[name].append(cpu_seconds)
    tokens = batch * config.max_seq_len
    flops_per_token = ours.flops_per_token(config.max_seq_len)
    peak = peak_flops(device)
    result = {"config": config.to_dict(), "batch": batch, "params": ours.num_params(),
              "flops_per_token": flops_per_token}
    for name, values in times.items():
        median = statistics.median(values)
        result[name] = {
            "median_step_s": median, "min_step_s": min(values), "max_step_s": max(values),
            "tokens_per_s": tokens / median,
            "median_cpu_s": statistics.median(cpu_times[name]),
            "tokens_per_cpu_s": tokens / statistics.median(cpu_times[name]),
            # (flops_per_token counts forward + backward: no MFU for a forward alone)
            "mfu": flops_per_token * tokens / median / peak if peak and not evaluation else None,
        }
    if device.type == "cuda" and not evaluation:
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        optimizer_s = optimizer_step_seconds(ours, steps)
        forward_backward_s = result["danastar"]["median_step_s"]
        result["optimizer_step_s"] = optimizer_s
        result["tokens_per_s_with_optimizer"] = tokens / (forward_backward_s + optimizer_s)
        whole_s = forward_backward_s + optimizer_s
        result["mfu_with_optimizer"] = flops_per_token * tokens / whole_s / peak if peak else None
    result["speedup"] = result["danastar"]["tokens_per_s"] / result["nanogpt_style"]["tokens_per_s"]
    result["cpu_time_speedup"] = (result["danastar"]["tokens_per_cpu_s"]
                                  / result["nanogpt_style"]["tokens_per_cpu_s"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=None,
                        help="sequences per step (CUDA default 16)")
    parser.add_argument("--seq_len", type=int, default=None,
                        help="tokens per sequence (CUDA default 1024)")
    parser.add_argument("--models", nargs="+", default=None, metavar="ARCH:HEADS",
                        help="models to measure on CUDA (default enoki:12 qwen3:4)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--evaluation", action="store_true",
                        help="time a forward under no_grad (a validation batch) instead")
    parser.add_argument("--output", default=None, help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    gpu = device.type == "cuda"
    # CPU: ladder head sizes with few layers, with the GPT-2 vocabulary (the head dominates) and
    # with a 512-token one (the blocks dominate); GPU: the 124M class (Enoki h 12, Qwen3 h 4)
    if gpu:
        models = [m.split(":") for m in (args.models or ["enoki:12", "qwen3:4"])]
        setups = [(arch, int(heads), 50257, dict()) for arch, heads in models]
        batch, seq_len, steps = args.batch or 16, args.seq_len or 1024, args.steps or 20
    else:
        setups = [("enoki", 3, 50257, dict()), ("qwen3", 2, 50257, dict(n_layer=2)),
                  ("enoki", 3, 512, dict()), ("qwen3", 2, 512, dict(n_layer=2))]
        batch, seq_len, steps = 4, 256, args.steps or 10
    results = []
    for arch, heads, vocab_size, overrides in setups:
        config = ModelConfig.from_heads(arch, heads, vocab_size=vocab_size, max_seq_len=seq_len,
                                        **overrides)
        result = measure(config, batch, steps, args.warmup, device, bf16=gpu, compile_=gpu,
                         evaluation=args.evaluation)
        result.update(arch=arch, heads=heads)
        results.append(result)
        print(f"{arch} h{heads} V {vocab_size} ({result['params'] / 1e6:.1f}M): danastar "
              f"{result['danastar']['tokens_per_s']:,.0f} tok/s, nanoGPT-style "
              f"{result['nanogpt_style']['tokens_per_s']:,.0f} tok/s, ratio "
              f"{result['speedup']:.3f} "
              f"(per CPU-second {result['cpu_time_speedup']:.3f})", flush=True)
        if gpu and not args.evaluation:
            print(f"    MFU danastar {result['danastar']['mfu']:.3f}, nanoGPT-style "
                  f"{result['nanogpt_style']['mfu']:.3f}; with the ADana step "
                  f"({result['optimizer_step_s'] * 1e3:.2f} ms) "
                  f"{result['mfu_with_optimizer']:.3f}; "
                  f"peak memory {result['peak_memory_gib']:.1f} GiB", flush=True)
    cpu = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    machine = torch.cuda.get_device_name(device) if gpu else cpu
    report = {"benchmark": "model_throughput",
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "device": args.device, "machine": machine, "torch": torch.__version__,
              "precision": "bf16 autocast + torch.compile" if gpu else "fp32 eager",
              "batch": batch, "seq_len": seq_len, "steps": steps,
              "measured": "forward under no_grad" if args.evaluation else "forward + backward",
              "results": results}
    name = f"model_throughput-{device.type}{'-evaluation' * args.evaluation}.json"
    default = Path(__file__).parent / "results" / name
    path = Path(args.output or default)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
