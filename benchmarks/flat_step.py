"""The step with flat buffers (``flat=True``) against the per-tensor step, interleaved.

    python benchmarks/flat_step.py                         # CPU, one thread, the lists below
    python benchmarks/flat_step.py --rounds 41 --only adana

For each parameter list, fused AdamW and each optimizer's compiled step without and with
``flat=True`` are built over their own copies of the same tensors, then timed round by round:
each round takes one step of every candidate, in turn, so that a machine whose speed drifts
(a shared VM) slows all of them alike. Reported: the median per candidate and its ratio to
fused AdamW's median of the same rounds. The lists: Enoki at 2 and 4 heads (vocabulary 2048:
0.7M and 3.4M parameters, 11 and 27 tensors), a 48-layer transformer-like mix of 0.94M
parameters in 291 tensors (the many-small-tensors case), and the 4-layer mix of
``optim_step.py`` at 1e7 (27 tensors, most of them large), and 291 tensors of 16 elements
(what a step costs on the host alone, which bounds a GPU step of small tensors). On CUDA each
list also times the step captured once in a CUDA graph and replayed (``capturable=True``, the LR
a device tensor: ``, CUDA graph``), for fused AdamW and the compiled DANA steps alike, which
takes the host out of the step. Writes ``benchmarks/results/flat_step-<device>.json`` and
prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from optim_step import (
    BASELINE,
    CANDIDATES,
    DANASTAR,
    enoki_shapes,
    machine_description,
    model_shapes,
)

OPTIMIZERS = ("adana", "dana-star-mk4")
LISTS = {
    "enoki h2": lambda: enoki_shapes(2, 2048),
    "enoki h4": lambda: enoki_shapes(4, 2048),
    "48 layers, 1e6": lambda: model_shapes(10**6, 48),
    "4 layers, 1e7": lambda: model_shapes(10**7, 4),
    "291 tiny tensors": lambda: [(16,)] * 291,  # no bytes to speak of: the host's cost alone
}


def fresh_params(shapes, device) -> list[torch.Tensor]:
    """Parameters with gradients, seeded alike for every candidate."""
    generator = torch.Generator(device=device).manual_seed(0)
    params = [torch.randn(s, device=device, generator=generator).requires_grad_()
              for s in shapes]
    for param in params:
        param.grad = torch.randn(param.shape, device=device, generator=generator) * 1e-3
    return params


def stepper(name: str, shapes, device):
    """A function taking one step of candidate ``name`` over fresh parameters."""
    return CANDIDATES[name][0](fresh_params(shapes, device), 1e-3).step


GRAPH = ", CUDA graph"


def graph_stepper(name: str, shapes, device):
    """A function replaying one step of ``name`` (``"adamw fused (torch)"`` or ``"<optimizer>
    compiled"``) captured in a CUDA graph: capturable state, the LR a device tensor, three
    warm-up steps on a side stream (compilation, state), then one capture."""
    params = fresh_params(shapes, device)
    lr = torch.tensor(1e-3, device=device)
    if name == BASELINE:
        optimizer = torch.optim.AdamW(params, lr=lr, fused=True, capturable=True)
    else:
        cls, settings, _ = DANASTAR[name.removesuffix(" compiled")]
        optimizer = cls(params, lr=lr, **settings, impl="compiled", capturable=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        optimizer.step()
    return graph.replay


def measure(label: str, shapes, names: list[str], device, rounds: int) -> list[dict]:
    steps = {}
    for name in names:  # state, compilation, warm caches; said as it goes, since a list can
        start = time.perf_counter()  # take minutes to compile (a time limit keeps the log)
        steps[name] = (graph_stepper(name.removesuffix(GRAPH), shapes, device)
                       if name.endswith(GRAPH) else stepper(name, shapes, device))
        steps[name](), steps[name]()
        print(f"{label:16s} {name:30s} ready in {time.perf_counter() - start:.1f} s", flush=True)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name, step in steps.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    baseline = statistics.median(times[BASELINE])
    numel = sum(math.prod(s) for s in shapes)
    rows = []
    for name, values in times.items():
        median = statistics.median(values)
        rows.append({"list": label, "optimizer": name, "params": numel, "tensors": len(shapes),
                     "ms": median * 1e3, "vs_fused_adamw": median / baseline,
                     "quartiles_ms": [q * 1e3 for q in statistics.quantiles(values, n=4)]})
        print(f"{label:16s} {name:30s} {median * 1e3:9.3f} ms {median / baseline:6.2f}x",
              flush=True)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="+", default=list(OPTIMIZERS), choices=OPTIMIZERS)
    parser.add_argument("--lists", nargs="+", default=list(LISTS), choices=list(LISTS))
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    names = [BASELINE] + [f"{o} compiled{flat}" for o in args.only for flat in ("", ", flat")]
    if device.type == "cuda":
        names += [BASELINE + GRAPH] + [f"{o} compiled{GRAPH}" for o in args.only]
    rows = [row for label in args.lists
            for row in measure(label, LISTS[label](), names, device, args.rounds)]
    out = Path(args.out) if args.out else (
        Path(__file__).parent / "results" / f"flat_step-{device.type}.json")
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
              "machine": machine_description(device), "torch": torch.__version__,
              "rounds": args.rounds, "rows": rows}
    out.write_text(json.dumps(result, indent=1))
    print("\n| list | params | tensors | " + " | ".join(names) + " |")
    print("|---|---:|---:|" + "---|" * len(names))
    for label in args.lists:
        cells = {r["optimizer"]: r for r in rows if r["list"] == label}
        first = cells[BASELINE]
        print(f"| {label} | {first['params']:,} | {first['tensors']} | " + " | ".join(
            f"{cells[n]['ms']:.3g} ms ({cells[n]['vs_fused_adamw']:.2f}×)" for n in names) + " |")
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
