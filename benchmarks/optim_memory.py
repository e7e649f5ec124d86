"""Memory of the optimizers: bytes per parameter, and the peak memory of a training step.

    python benchmarks/optim_memory.py                 # Enoki 6 heads, GPT-2 vocabulary, CPU
    python benchmarks/optim_memory.py --heads 3 --steps 2

Per optimizer x parameter dtype x state dtype:

* **bytes per parameter** held between steps: the parameter, its gradient and the optimizer's
  state (every tensor of ``optimizer.state`` but the step counts), counted from the tensors;
* **peak memory of a training step** (forward, backward, optimizer step): on CUDA the allocator's
  peak; on the CPU the peak resident set of a fresh process (``ru_maxrss``) less the same
  process's resident set before the model was built, so the interpreter and torch are not
  counted. The CPU measure includes the step's temporaries: the reference path (the default
  there, so that no compiler's memory is counted) widens one tensor at a time to float32 for
  bf16 state. On CUDA the default is the compiled path (what a GPU run takes), whose fused
  kernels hold no such temporaries; ``--impl`` picks either on either device.

Writes ``benchmarks/results/optim_memory-<device>.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

# name -> (registry name, keyword arguments); torch's AdamW keeps its state in the parameter's
# dtype, so its bf16 row is bf16 parameters with bf16 state.
CONFIGS = {
    "adamw fused (torch)": ("adamw", {"fused": True}),
    "adana": ("adana", {}),
    "dana-star-mk4": ("dana-star-mk4", {}),
    "ademamix": ("ademamix", {}),
}
# (parameter dtype, state dtype) of each measured combination; None: the optimizer's own rule.
COMBINATIONS = [("float32", None), ("float32", "bfloat16"), ("bfloat16", None),
                ("bfloat16", "bfloat16")]


def measure(name: str, param_dtype: str, state_dtype: str | None, heads: int, vocab: int,
            steps: int, device: str, impl: str) -> dict:
    """One training run's bytes per parameter and peak step memory (run in a fresh process)."""
    from danastar.models import ModelConfig, build_model
    from danastar.optim import build_optimizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model = build_model(ModelConfig.from_heads("enoki", heads, vocab_size=vocab,
                                               max_seq_len=128)).to(device,
                                                                     getattr(torch, param_dtype))
    registry_name, settings = CONFIGS[name]
    if state_dtype is not None:
        settings = {**settings, "state_dtype": state_dtype}
    if not name.endswith("(torch)"):
        settings = {**settings, "impl": impl}
    optimizer = build_optimizer(registry_name, model.named_parameters(), lr=1e-4, **settings)
    idx = torch.randint(0, vocab, (4, 128), device=device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=False)
        model(idx, idx)[0].backward()
        optimizer.step()
    params = sum(p.numel() for p in model.parameters())
    held = sum(p.nbytes + p.grad.nbytes for p in model.parameters()) + sum(
        value.nbytes for state in optimizer.state.values() for key, value in state.items()
        if torch.is_tensor(value) and key != "step")
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    state_types = sorted({str(value.dtype).removeprefix("torch.")
                          for state in optimizer.state.values() for key, value in state.items()
                          if torch.is_tensor(value) and key != "step"})
    return {"optimizer": name, "param_dtype": param_dtype, "state_dtype": "/".join(state_types),
            "params": params, "bytes_per_param": held / params, "peak_step_mb": peak / 2**20,
            "peak_bytes_per_param": peak / params}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--only", nargs="+", default=None, help="optimizer names to run")
    parser.add_argument("--impl", choices=("reference", "compiled"), default=None,
                        help="danastar's path (default: compiled on CUDA, reference on the CPU)")
    parser.add_argument("--one", nargs=3, metavar=("NAME", "PARAM_DTYPE", "STATE_DTYPE"),
                        help=argparse.SUPPRESS)  # the fresh process of one measurement
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.impl = args.impl or ("compiled" if args.device == "cuda" else "reference")
    if args.one:
        name, param_dtype, state_dtype = args.one
        print(json.dumps(measure(name, param_dtype, None if state_dtype == "default" else
                                 state_dtype, args.heads, args.vocab, args.steps, args.device,
                                 args.impl)))
        return
    rows = []
    for name in CONFIGS:
        if args.only and name not in args.only:
            continue
        for param_dtype, state_dtype in COMBINATIONS:
            if name.endswith("(torch)") and state_dtype is not None:
                continue  # torch's AdamW has no state dtype of its own
            command = [sys.executable, __file__, "--one", name, param_dtype,
                       state_dtype or "default", "--heads", str(args.heads), "--vocab",
                       str(args.vocab), "--steps", str(args.steps), "--device", args.device,
                       "--impl", args.impl]
            row = json.loads(subprocess.run(command, check=True, capture_output=True,
                                            text=True).stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{name:22s} params {param_dtype:8s} state {row['state_dtype']:8s} "
                  f"{row['bytes_per_param']:5.1f} B/param, peak step {row['peak_step_mb']:8.1f} "
                  f"MiB ({row['peak_bytes_per_param']:.1f} B/param)", flush=True)
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "device": args.device,
              "impl": args.impl, "torch": torch.__version__,
              "model": f"enoki {args.heads} heads, vocab {args.vocab}, batch 4 x 128",
              "steps": args.steps, "rows": rows}
    out = Path(args.out) if args.out else (
        Path(__file__).parent / "results" / f"optim_memory-{args.device}.json")
    out.write_text(json.dumps(result, indent=1))
    print("\n| optimizer | parameters | state | bytes/param held | peak of a step (MiB) |")
    print("|---|---|---|---:|---:|")
    for row in rows:
        print(f"| {row['optimizer']} | {row['param_dtype']} | {row['state_dtype']} | "
              f"{row['bytes_per_param']:.1f} | {row['peak_step_mb']:.0f} |")
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
