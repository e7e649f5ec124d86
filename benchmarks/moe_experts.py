"""The routed experts of a mixture of experts, forward + backward: ``torch._grouped_mm`` (one
kernel for all experts) against the per-expert loop, measured in the same run.

Both compute Experts(x) for rows already sorted by expert (the layout `MoE.forward` builds), with
the same weights, the same rows and the same counts per expert (drawn from a skewed routing: a
few busy experts, many light ones); the script first checks that they agree. Iterations alternate
between the two (in alternating order) so that a shared machine slows both alike; medians are
reported. danastar itself picks the grouped kernel only in bfloat16, after a one-time trial
(`models.moe.grouped_mm_works`); here both are forced, in every dtype asked for.

    python benchmarks/moe_experts.py                        # CPU-sized: 4096 rows, d 128, h 512
    python benchmarks/moe_experts.py --device cuda          # 16384 rows, d 1024, h 4096

Writes benchmarks/results/moe_experts-<device>.json.
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

from danastar.models.moe import Experts

SIZES = {"cpu": (4096, 128, 512), "cuda": (16384, 1024, 4096)}  # rows, d, hidden


def skewed_counts(rows: int, experts: int, generator: torch.Generator) -> torch.Tensor:
    """Rows per expert from a Zipf-like routing (p_e ∝ 1/(e+1)): a few busy experts and many
    light ones, as in a router trained without a balancing loss."""
    probabilities = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64)
    choice = torch.multinomial(probabilities, rows, replacement=True, generator=generator)
    return torch.bincount(choice, minlength=experts)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fwd_bwd(experts: Experts, x: torch.Tensor, counts: torch.Tensor, grouped: bool) -> float:
    experts.zero_grad(set_to_none=True)
    sync(x.device)
    started = time.perf_counter()
    experts(x, counts, grouped=grouped).float().square().mean().backward()
    sync(x.device)
    return time.perf_counter() - started


def measure(device: torch.device, dtype: torch.dtype, num_experts: int, rows: int, dim: int,
            hidden: int, steps: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    experts = Experts(num_experts, dim, hidden, swiglu=False)
    experts.init_weights(scaled=True, depth=2)
    experts = experts.to(device=device, dtype=dtype)
    x = torch.randn(rows, dim, generator=generator).to(device=device, dtype=dtype)
    counts = skewed_counts(rows, num_experts, generator).to(device)
    with torch.no_grad():
        grouped_out, looped_out = (experts(x, counts, grouped=g).float() for g in (True, False))
    scale = looped_out.abs().max().item()
    agreement = (grouped_out - looped_out).abs().max().item() / scale
    times = {True: [], False: []}
    for grouped in (True, False):  # warm-up
        fwd_bwd(experts, x, counts, grouped)
    for step in range(steps):
        for grouped in ((True, False) if step % 2 == 0 else (False, True)):
            times[grouped].append(fwd_bwd(experts, x, counts, grouped))
    grouped_ms, looped_ms = (1e3 * statistics.median(times[g]) for g in (True, False))
    return {"experts": num_experts, "dtype": str(dtype).removeprefix("torch."), "rows": rows,
            "dim": dim, "hidden": hidden, "empty_experts": int((counts == 0).sum()),
            "max_relative_difference": agreement, "grouped_ms": grouped_ms,
            "looped_ms": looped_ms, "speedup": looped_ms / grouped_ms,
            "grouped_ms_min_max": [1e3 * min(times[True]), 1e3 * max(times[True])],
            "looped_ms_min_max": [1e3 * min(times[False]), 1e3 * max(times[False])]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--experts", nargs="+", type=int, default=[8, 64])
    parser.add_argument("--steps", type=int, default=None,
                        help="measured steps per case (default 10 on CPU, 50 on CUDA)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch default)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows, dim, hidden = SIZES[device.type]
    steps = args.steps or (10 if device.type == "cpu" else 50)
    results = []
    for dtype in args.dtypes:
        for num_experts in args.experts:
            result = measure(device, getattr(torch, dtype), num_experts, rows, dim, hidden, steps)
            results.append(result)
            print(f"{dtype:9} {num_experts:4} experts ({result['empty_experts']} empty): grouped "
                  f"{result['grouped_ms']:8.2f} ms, loop {result['looped_ms']:8.2f} ms, "
                  f"{result['speedup']:.2f}x (max rel. difference "
                  f"{result['max_relative_difference']:.1e})")
    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else platform.processor() or platform.machine())
    report = {"benchmark": "moe_experts", "date": datetime.now(timezone.utc).isoformat(),
              "device": device_name, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "steps": steps, "results": results}
    out = args.out or Path(__file__).parent / "results" / f"moe_experts-{device.type}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
