"""Time one optimizer step for every danastar optimizer and path against torch's AdamW.

    python benchmarks/optim_step.py                      # 1e5 .. 1e8 parameters, CPU or CUDA
    python benchmarks/optim_step.py --sizes 1e5 1e6      # fewer sizes
    python benchmarks/optim_step.py --device cpu --only adana adamw

The parameters are a transformer-like mix: an embedding and a head, and per layer the attention
and MLP matrices plus two norm vectors. Reported per size: the median time per step, the
achieved bandwidth (bytes the update must read and write, over time), and the ratio to
``torch.optim.AdamW(fused=True)`` measured in the same run. Writes
``benchmarks/results/optim_step-<device>.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from danastar.optim import AdamWDecayingWD, ADana, AdEMAMix, DanaStar

LAYERS = 4

# name -> (constructor, tensors of parameter size read or written per parameter per step)
# AdamW-like: read p, g, m, v and write p, m, v = 7; one more buffer adds a read and a write.
CANDIDATES = {
    "adamw fused (torch)": (lambda ps, lr: torch.optim.AdamW(ps, lr=lr, fused=True), 7),
    "adamw foreach (torch)": (lambda ps, lr: torch.optim.AdamW(ps, lr=lr, foreach=True), 7),
}
for impl in ("foreach", "compiled", "reference"):
    CANDIDATES |= {
        f"adana {impl}": (lambda ps, lr, i=impl: ADana(ps, lr=lr, weight_decay=0.1, impl=i), 7),
        f"dana-mk4 {impl}": (lambda ps, lr, i=impl: ADana(ps, lr=lr, clipsnr=2.0,
                                                          weight_decay=0.1, impl=i), 7),
        f"dana-star {impl}": (lambda ps, lr, i=impl: DanaStar(ps, lr=lr, weight_decay=0.1,
                                                              impl=i), 9),
        f"dana-star-mk4 {impl}": (lambda ps, lr, i=impl: DanaStar(
            ps, lr=lr, clipsnr=2.0, weight_decay=0.1, impl=i), 9),
    }
for impl in ("compiled", "reference"):
    CANDIDATES |= {
        f"adamw-decaying-wd {impl}": (lambda ps, lr, i=impl: AdamWDecayingWD(
            ps, lr=lr, weight_decay=0.1, impl=i), 7),
        f"ademamix {impl}": (lambda ps, lr, i=impl: AdEMAMix(ps, lr=lr, impl=i), 9),
    }
BASELINE = "adamw fused (torch)"


def model_shapes(total: int) -> list[tuple[int, ...]]:
    """A transformer-like list of shapes with about ``total`` elements (width a multiple of 8)."""
    vocab_per_width = 4  # embedding and head are (4 d, d) each
    width = max(8, round(math.sqrt(total / (12 * LAYERS + 2 * vocab_per_width)) / 8) * 8)
    shapes = [(vocab_per_width * width, width)]
    for _ in range(LAYERS):
        shapes += [(3 * width, width), (width, width), (4 * width, width), (width, 4 * width),
                   (width,), (width,)]
    return shapes + [(width,), (vocab_per_width * width, width)]


def time_steps(make, shapes, device, repeats):
    """Median seconds per step after warm-up (the first steps create state and compile)."""
    generator = torch.Generator(device=device).manual_seed(0)
    params = [torch.randn(s, device=device, generator=generator).requires_grad_()
              for s in shapes]
    for param in params:
        param.grad = torch.randn(param.shape, device=device, generator=generator) * 1e-3
    optimizer = make(params, 1e-3)
    for _ in range(2):
        optimizer.step()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_bandwidth(device, numel, repeats):
    """Bytes/s of a plain device copy (read + write) of ``numel`` float32 values."""
    source = torch.empty(numel, device=device)
    target = torch.empty_like(source)
    seconds = time_steps(lambda ps, lr: _CopyStep(source, target), [(1,)], device, repeats)
    return 2 * 4 * numel / seconds


class _CopyStep:
    def __init__(self, source, target):
        self.source, self.target = source, target

    def step(self):
        self.target.copy_(self.source)


def machine_description(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                     if line.startswith("Model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "unknown CPU"
    return f"{model}, {torch.get_num_threads()} threads"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e5, 1e6, 1e7, 1e8])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--only", nargs="+", default=None,
                        help="substrings of the candidate names to run (the baseline always runs)")
    parser.add_argument("--max-slow-size", type=float, default=1e7,
                        help="skip the multi-pass paths (reference, foreach) above this size")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    rows = []
    for size in [int(s) for s in args.sizes]:
        shapes = model_shapes(size)
        numel = sum(math.prod(s) for s in shapes)
        repeats = 20 if numel <= 2e6 else 10 if numel <= 2e7 else 3
        baseline = None
        for name, (make, tensors_moved) in CANDIDATES.items():
            selected = args.only is None or any(key in name for key in args.only)
            if name != BASELINE and not selected:
                continue
            slow_path = " reference" in name or name.endswith(" foreach")
            if slow_path and numel > args.max_slow_size:
                continue
            seconds = time_steps(make, shapes, device, repeats)
            baseline = seconds if name == BASELINE else baseline
            row = {"optimizer": name, "params": numel, "tensors": len(shapes),
                   "ms_per_step": seconds * 1e3,
                   "gb_per_s": tensors_moved * 4 * numel / seconds / 1e9,
                   "vs_fused_adamw": seconds / baseline}
            rows.append(row)
            print(f"{name:28s} {numel:>11,d} params  {row['ms_per_step']:9.3f} ms  "
                  f"{row['gb_per_s']:7.2f} GB/s  {row['vs_fused_adamw']:5.2f}x", flush=True)

    largest = max(r["params"] for r in rows)
    copy = copy_bandwidth(device, largest, 10) / 1e9
    out = Path(args.out) if args.out else (
        Path(__file__).parent / "results" / f"optim_step-{device.type}.json")
    rows = merge_with_earlier_runs(out, rows, device)
    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "device": device.type, "machine": machine_description(device),
        "torch": torch.__version__, "copy_gb_per_s": copy, "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"\n{result['date']}, {result['machine']}, torch {result['torch']}, "
          f"copy bandwidth {copy:.1f} GB/s at {largest:,d} floats\n")
    print(markdown_table(rows))
    print(f"\nwritten to {out}")


def merge_with_earlier_runs(out: Path, rows: list[dict], device) -> list[dict]:
    """Runs over different sizes or candidates (--sizes, --only) add up in one result file, on
    the same machine and torch; a row measured again replaces the earlier one. Each row's ratio
    is to the fused AdamW measured in its own run."""
    if not out.exists():
        return rows
    earlier = json.loads(out.read_text())
    if (earlier.get("machine"), earlier.get("torch")) != (machine_description(device),
                                                          torch.__version__):
        return rows
    measured = {(r["optimizer"], r["params"]) for r in rows}
    kept = [r for r in earlier["rows"] if (r["optimizer"], r["params"]) not in measured]
    return sorted(kept + rows, key=lambda r: r["params"])


def markdown_table(rows) -> str:
    """One row per optimizer and path, one column per size: ms/step (GB/s, ratio to fused)."""
    sizes = sorted({r["params"] for r in rows})
    names = [name for name in CANDIDATES if any(r["optimizer"] == name for r in rows)]
    cell = {(r["optimizer"], r["params"]): r for r in rows}
    lines = ["| optimizer / path | " + " | ".join(f"{s:.1e} params" for s in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for name in names:
        cells = []
        for size in sizes:
            r = cell.get((name, size))
            cells.append("—" if r is None else
                         f"{r['ms_per_step']:.3g} ms ({r['gb_per_s']:.1f} GB/s, "
                         f"{r['vs_fused_adamw']:.2f}×)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
