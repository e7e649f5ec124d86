"""Peak GPU memory of one training step, against what it is made of, and the largest micro-batch
that fits on the card.

    python benchmarks/train_memory.py --device cuda                       # Enoki h12 and h24
    python benchmarks/train_memory.py --device cuda --models enoki:12 --seq_len 2048

One step as `danastar train` takes it on one GPU: float32 weights, bf16 autocast, the blocks
compiled, forward + backward of one micro-batch, then an ADana step (two float32 state buffers).
The peak (``torch.cuda.max_memory_allocated``) is set against the sum of weights, gradients and
optimizer state (16 bytes per parameter) and the activations (what the peak holds beyond those).
The largest micro-batch is found by doubling until the step runs out of memory, then bisecting.
Writes ``benchmarks/results/train_memory-<device>.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
from datetime import datetime, timezone
from pathlib import Path

import torch

from danastar.models import ModelConfig, build_model
from danastar.optim import ADana

GIB = 2**30


def one_step(model, optimizer, batch: int, seq_len: int, vocab_size: int, device) -> int:
    """Peak bytes allocated during one forward + backward + optimizer step."""
    model.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    idx = torch.randint(0, vocab_size, (batch, seq_len), device=device)
    targets = torch.roll(idx, -1, dims=1)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(idx, targets).loss
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)


def fits(model, optimizer, batch, seq_len, vocab_size, device) -> bool:
    try:
        one_step(model, optimizer, batch, seq_len, vocab_size, device)
        return True
    except torch.OutOfMemoryError:
        model.zero_grad(set_to_none=True)
        return False


def largest_batch(model, optimizer, seq_len, vocab_size, device, start: int, limit: int) -> int:
    """The largest micro-batch (up to ``limit``) whose step fits: double, then bisect."""
    good, bad = 0, None
    batch = start
    while batch <= limit:
        if not fits(model, optimizer, batch, seq_len, vocab_size, device):
            bad = batch
            break
        good, batch = batch, batch * 2
    if bad is None:
        return good
    while bad - good > max(1, good // 16):  # to within about 6%
        middle = (good + bad) // 2
        if fits(model, optimizer, middle, seq_len, vocab_size, device):
            good = middle
        else:
            bad = middle
    return good


def measure(arch: str, heads: int, batch: int, seq_len: int, device, search: bool) -> dict:
    config = ModelConfig.from_heads(arch, heads, vocab_size=50257, max_seq_len=seq_len)
    torch.manual_seed(0)
    with torch.device(device):
        model = build_model(config)
    for block in model.blocks:  # as `danastar train --compile` does
        block.compile()
    optimizer = ADana(model.parameters(), lr=1e-4, weight_decay=4e-3, wd_ts=1000,
                      impl="compiled")
    params = sum(p.numel() for p in model.parameters())
    one_step(model, optimizer, batch, seq_len, config.vocab_size, device)  # compile, create state
    peak = one_step(model, optimizer, batch, seq_len, config.vocab_size, device)
    weights = grads = params * 4
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                for t in s.values() if torch.is_tensor(t) and t.device.type == "cuda")
    result = {"arch": arch, "heads": heads, "params": params, "n_layer": config.n_layer,
              "n_embd": config.n_embd, "batch": batch, "seq_len": seq_len,
              "peak_gib": peak / GIB, "weights_gib": weights / GIB, "grads_gib": grads / GIB,
              "optimizer_state_gib": state / GIB,
              "activations_and_workspace_gib": (peak - weights - grads - state) / GIB,
              "card_gib": torch.cuda.get_device_properties(device).total_memory / GIB}
    result["activation_bytes_per_token"] = (peak - weights - grads - state) / (batch * seq_len)
    if search:
        result["largest_micro_batch"] = largest_batch(model, optimizer, seq_len,
                                                      config.vocab_size, device, batch, 4096)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", nargs="+", default=["enoki:12", "enoki:24"],
                        metavar="ARCH:HEADS")
    parser.add_argument("--batch", type=int, default=16, help="micro-batch of the measured step")
    parser.add_argument("--seq_len", type=int, default=1024)
    parser.add_argument("--no_search", action="store_true", help="skip the largest-batch search")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type != "cuda":
        raise SystemExit("train_memory.py measures GPU memory; run it with --device cuda on a GPU.")
    results = []
    for spec in args.models:
        arch, heads = spec.split(":")
        result = measure(arch, int(heads), args.batch, args.seq_len, device, not args.no_search)
        results.append(result)
        print(f"{arch} h{heads} ({result['params'] / 1e6:.0f}M), micro-batch {args.batch} x "
              f"{args.seq_len}: peak {result['peak_gib']:.2f} GiB = weights "
              f"{result['weights_gib']:.2f} + grads {result['grads_gib']:.2f} + state "
              f"{result['optimizer_state_gib']:.2f} + "
              f"activations {result['activations_and_workspace_gib']:.2f}; largest micro-batch "
              f"{result.get('largest_micro_batch', '-')}", flush=True)
    report = {"benchmark": "train_memory",
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": torch.cuda.get_device_name(device), "torch": torch.__version__,
              "results": results}
    default = Path(__file__).parent / "results" / f"train_memory-{device.type}.json"
    path = Path(args.output or default)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
