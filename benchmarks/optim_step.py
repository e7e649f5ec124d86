"""Time one optimizer step for every danastar optimizer and path against torch's AdamW.

    python benchmarks/optim_step.py                      # CPU: 1e5 .. 1e8; CUDA: 1e6 .. 1e9
    python benchmarks/optim_step.py --sizes 1e5 1e6      # fewer sizes
    python benchmarks/optim_step.py --device cpu --only adana adamw
    python benchmarks/optim_step.py --device cuda --dtypes float32 bfloat16

The parameters are a transformer-like mix: an embedding and a head, and per layer the attention
and MLP matrices plus two norm vectors. Reported per size: the median time per step, the
achieved bandwidth (bytes the update must read and write, over time), and the ratio to
``torch.optim.AdamW(fused=True)`` measured in the same run. On CUDA each step is timed with
device events, and the host time of the ``step()`` call (no synchronisation) is reported
beside it: where it approaches the device time the step is bound by launches and Python, not
by memory. Writes ``benchmarks/results/optim_step-<device>.json`` and prints a markdown table.

Parameters may be float32 or bfloat16 (``--dtypes``); danastar keeps float32 state for bf16
parameters unless asked for bf16 state (the ``, bf16 state`` rows: stochastically rounded),
torch's AdamW keeps state in the parameter's dtype, and the byte counts say so. The
``, flat`` rows keep each group's parameters, gradients and state in flat buffers (``flat=True``:
one update per group, whatever the number of tensors; the step includes copying the gradients
into the flat buffer).
``--enoki-heads H ...`` times a model-shaped list instead: the parameters of Enoki at H heads
(vocabulary ``--vocab``), one size per H, hundreds of tensors for the larger ones.
``--compile-only`` takes two steps of every candidate and times nothing: run it in a few
processes at once (one size each) to fill the compile caches before a timed run.
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

# name -> (constructor, state buffers, the state's dtype: "param" (the parameter's), "wide"
# (at least float32) or "bf16"). Every candidate reads p, g and each buffer and writes p and
# each buffer.
CANDIDATES = {
    "adamw fused (torch)": (lambda ps, lr: torch.optim.AdamW(ps, lr=lr, fused=True), 2,
                            "param"),
    "adamw foreach (torch)": (lambda ps, lr: torch.optim.AdamW(ps, lr=lr, foreach=True), 2,
                              "param"),
}
# A decaying weight decay (the paper's ω = 4 for a 10 000-step run: λ = 4e-3, time scale 1000);
# the decay is one per-step scalar, so its value does not change the work of a step.
DECAY = dict(weight_decay=4e-3, wd_ts=1000)
# danastar's optimizers: name -> (class, variant settings, state buffers).
DANASTAR = {
    "adana": (ADana, {**DECAY}, 2), "dana-mk4": (ADana, {"clipsnr": 2.0, **DECAY}, 2),
    "dana-star": (DanaStar, {**DECAY}, 3),
    "dana-star-mk4": (DanaStar, {"clipsnr": 2.0, **DECAY}, 3),
    "adamw-decaying-wd": (AdamWDecayingWD, {**DECAY}, 2), "ademamix": (AdEMAMix, {}, 3),
}
for impl in ("compiled", "reference"):
    for name, (cls, settings, buffers) in DANASTAR.items():
        CANDIDATES[f"{name} {impl}"] = (
            lambda ps, lr, c=cls, s=settings, i=impl: c(ps, lr=lr, **s, impl=i), buffers, "wide")
for name, (cls, settings, buffers) in DANASTAR.items():
    CANDIDATES[f"{name} compiled, bf16 state"] = (
        lambda ps, lr, c=cls, s=settings: c(ps, lr=lr, **s, impl="compiled",
                                            state_dtype=torch.bfloat16), buffers, "bf16")
for name, (cls, settings, buffers) in DANASTAR.items():
    CANDIDATES[f"{name} compiled, flat"] = (
        lambda ps, lr, c=cls, s=settings: c(ps, lr=lr, **s, impl="compiled", flat=True),
        buffers, "wide")
BASELINE = "adamw fused (torch)"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def bytes_per_parameter(dtype: torch.dtype, buffers: int, state: str) -> int:
    """Bytes one step must move per parameter: read p, g and the buffers; write p and buffers.
    ``state``: "param" (state in the parameter's dtype), "wide" (at least float32) or "bf16"."""
    param_bytes = dtype.itemsize
    state_bytes = {"param": param_bytes, "wide": max(param_bytes, 4), "bf16": 2}[state]
    return 3 * param_bytes + 2 * buffers * state_bytes


def enoki_shapes(heads: int, vocab: int) -> list[tuple[int, ...]]:
    """The parameter shapes of Enoki at ``heads`` heads (a real model's list of tensors)."""
    from danastar.models import ModelConfig, build_model

    with torch.device("meta"):
        model = build_model(ModelConfig.from_heads("enoki", heads, vocab_size=vocab,
                                                   max_seq_len=256))
    return [tuple(p.shape) for p in model.parameters()]


def model_shapes(total: int, layers: int = LAYERS) -> list[tuple[int, ...]]:
    """A transformer-like list of shapes with about ``total`` elements (width a multiple of 8)
    in ``layers`` layers of six tensors each."""
    vocab_per_width = 4  # embedding and head are (4 d, d) each
    width = max(8, round(math.sqrt(total / (12 * layers + 2 * vocab_per_width)) / 8) * 8)
    shapes = [(vocab_per_width * width, width)]
    for _ in range(layers):
        shapes += [(3 * width, width), (width, width), (4 * width, width), (width, 4 * width),
                   (width,), (width,)]
    return shapes + [(width,), (vocab_per_width * width, width)]


def time_steps(make, shapes, device, repeats, dtype=torch.float32, warmup=2):
    """Median seconds per step after warm-up (the first steps create state and compile), and
    the median host seconds of the ``step()`` call itself (without waiting for the device)."""
    generator = torch.Generator(device=device).manual_seed(0)
    params = [torch.randn(s, device=device, generator=generator).to(dtype).requires_grad_()
              for s in shapes]
    for param in params:
        param.grad = (torch.randn(param.shape, device=device, generator=generator) * 1e-3
                      ).to(dtype)
    optimizer = make(params, 1e-3)
    for _ in range(warmup):
        optimizer.step()
    times, host_times = [], []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
            start_event = torch.cuda.Event(enable_timing=True)
            end_event = torch.cuda.Event(enable_timing=True)
            start_event.record()
        start = time.perf_counter()
        optimizer.step()
        host_times.append(time.perf_counter() - start)
        if device.type == "cuda":
            end_event.record()
            torch.cuda.synchronize()
            times.append(start_event.elapsed_time(end_event) / 1e3)
        else:
            times.append(host_times[-1])
    if not times:  # --compile-only
        return math.nan, math.nan
    return statistics.median(times), statistics.median(host_times)


def copy_bandwidth(device, numel, repeats):
    """Bytes/s of a plain device copy (read + write) of ``numel`` float32 values."""
    source = torch.empty(numel, device=device)
    target = torch.empty_like(source)
    seconds, _ = time_steps(lambda ps, lr: _CopyStep(source, target), [(1,)], device, repeats)
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
    parser.add_argument("--sizes", nargs="+", type=float, default=None,
                        help="parameter counts (default: CPU 1e5 .. 1e8, CUDA 1e6 .. 1e9)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["float32"],
                        help="parameter dtypes")
    parser.add_argument("--compile-only", action="store_true",
                        help="take two steps of each candidate (filling the compile caches), "
                             "time nothing and write nothing")
    parser.add_argument("--only", nargs="+", default=None,
                        help="candidate names, or substrings of them, to run (the baseline always "
                             "runs)")
    parser.add_argument("--max-slow-size", type=float, default=None,
                        help="skip the multi-pass paths (reference, torch's foreach) above this "
                             "size (default: 1e7 on CPU, where they take seconds; none on CUDA)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--layers", type=int, default=LAYERS,
                        help="layers of the transformer-like mix (six tensors each; default "
                             f"{LAYERS}): more layers, more and smaller tensors at each size")
    parser.add_argument("--enoki-heads", nargs="+", type=int, default=None,
                        help="time Enoki's parameter list at these head counts instead of "
                             "--sizes")
    parser.add_argument("--vocab", type=int, default=50257,
                        help="vocabulary of the --enoki-heads models (default GPT-2's)")
    parser.add_argument("--inductor", nargs="+", default=[], metavar="KEY=VALUE",
                        help="torch._inductor.config settings for the compiled paths, e.g. "
                             "combo_kernels=True (values are Python literals)")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    inductor_settings = set_inductor_config(args.inductor)

    gpu = device.type == "cuda"
    if args.max_slow_size is None:
        args.max_slow_size = float("inf") if gpu else 1e7
    sizes = args.sizes or ([1e6, 1e7, 1e8, 1e9] if gpu else [1e5, 1e6, 1e7, 1e8])
    shape_lists = [model_shapes(int(size), args.layers) for size in sizes] \
        if args.enoki_heads is None \
        else [enoki_shapes(heads, args.vocab) for heads in args.enoki_heads]
    rows = []
    for dtype_name in args.dtypes:
        for shapes in shape_lists:
            rows += measure_size(args, device, shapes, DTYPES[dtype_name])
    if args.compile_only:
        return

    largest = max(r["params"] for r in rows)
    copy = copy_bandwidth(device, largest, 10) / 1e9
    for row in rows:
        row["copy_fraction"] = row["gb_per_s"] / copy
    out = Path(args.out) if args.out else (
        Path(__file__).parent / "results" / f"optim_step-{device.type}.json")
    rows = merge_with_earlier_runs(out, rows, device)
    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "device": device.type, "machine": machine_description(device),
        "torch": torch.__version__, "copy_gb_per_s": copy, "rows": rows,
        "inductor_config": inductor_settings,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"\n{result['date']}, {result['machine']}, torch {result['torch']}, "
          f"copy bandwidth {copy:.1f} GB/s at {largest:,d} floats\n")
    print(markdown_table(rows))
    print(f"\nwritten to {out}")


def set_inductor_config(settings: list[str]) -> dict:
    """Apply ``KEY=VALUE`` settings to torch._inductor.config; returns them as a dict."""
    import ast

    import torch._inductor.config as inductor_config

    applied = {}
    for setting in settings:
        key, _, value = setting.partition("=")
        applied[key] = ast.literal_eval(value)
        setattr(inductor_config, key, applied[key])
    return applied


def measure_size(args, device, shapes, dtype: torch.dtype) -> list[dict]:
    """Every selected candidate on one list of shapes and dtype, each against fused AdamW of
    this run."""
    numel = sum(math.prod(s) for s in shapes)
    if device.type == "cuda":
        repeats = 50 if numel <= 2e7 else 20
    else:
        repeats = 20 if numel <= 2e6 else 10 if numel <= 2e7 else 3
    if args.compile_only:
        repeats = 0
    rows, baseline = [], None
    for name, (make, buffers, state) in CANDIDATES.items():
        # A candidate's exact name selects it alone; other keys select by substring.
        selected = args.only is None or name in args.only or any(
            key in name for key in args.only if key not in CANDIDATES)
        if name != BASELINE and not selected:
            continue
        slow_path = " reference" in name
        if slow_path and numel > args.max_slow_size:
            continue
        if args.compile_only and "compiled" not in name:
            continue
        seconds, host_seconds = time_steps(make, shapes, device, repeats, dtype)
        if args.compile_only:
            continue
        baseline = seconds if name == BASELINE else baseline
        moved = bytes_per_parameter(dtype, buffers, state) * numel
        row = {"optimizer": name, "params": numel, "dtype": str(dtype).removeprefix("torch."),
               "tensors": len(shapes), "ms_per_step": seconds * 1e3,
               "host_ms_per_step": host_seconds * 1e3, "bytes_per_param": moved / numel,
               "gb_per_s": moved / seconds / 1e9, "vs_fused_adamw": seconds / baseline}
        rows.append(row)
        print(f"{name:28s} {row['dtype']:8s} {numel:>13,d} params {row['ms_per_step']:9.3f} ms "
              f"(host {row['host_ms_per_step']:7.3f}) {row['gb_per_s']:8.1f} GB/s "
              f"{row['vs_fused_adamw']:5.2f}x", flush=True)
    return rows


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
    def key(row):
        return row["optimizer"], row["params"], row.get("dtype", "float32"), row["tensors"]

    measured = {key(r) for r in rows}
    kept = [r for r in earlier["rows"] if key(r) not in measured]
    return sorted(kept + rows, key=lambda r: (r.get("dtype", "float32"), r["params"],
                                              r["tensors"]))


def markdown_table(rows) -> str:
    """One row per optimizer, path and dtype, one column per size: ms/step (GB/s, ratio to
    fused AdamW)."""
    sizes = sorted({r["params"] for r in rows})
    dtypes = sorted({r.get("dtype", "float32") for r in rows}, reverse=True)
    cell = {(r["optimizer"], r.get("dtype", "float32"), r["params"]): r for r in rows}
    lines = ["| optimizer / path | params | " + " | ".join(f"{s:.1e}" for s in sizes) + " |",
             "|---|---|" + "---|" * len(sizes)]
    for dtype in dtypes:
        for name in CANDIDATES:
            if not any((name, dtype, size) in cell for size in sizes):
                continue
            cells = []
            for size in sizes:
                r = cell.get((name, dtype, size))
                cells.append("—" if r is None else
                             f"{r['ms_per_step']:.3g} ms ({r['gb_per_s']:.0f} GB/s, "
                             f"{r['vs_fused_adamw']:.2f}×)")
            lines.append(f"| {name} | {dtype} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
