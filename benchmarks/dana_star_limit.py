"""Where Dana-Star's compiled CPU step spends its time: the whole kernel against the same kernel
without its power T_eff^(1 - kappa), the power alone, and fused AdamW, on one tensor.

    python benchmarks/dana_star_limit.py                  # 1e6 and 1e7 elements, one thread
    python benchmarks/dana_star_limit.py --sizes 1e7 --rounds 15

Every candidate is one compiled function over one float32 tensor (the arrays allocated
together, so that they share their offset within a 4 KiB page), timed interleaved: each round
runs every candidate once, in turn, and the medians over rounds are reported with their ratio
to ``torch.optim.AdamW(fused=True)`` of the same rounds. The candidates:

* ``dana-star-mk4``: danastar's update (``dana_star_update``, clipsnr 2);
* ``without the power``: the same update with T_eff^(1 - kappa) replaced by T_eff (the same
  memory traffic and every other operation, one log and one exp fewer per element);
* ``the power alone``: T_eff^(1 - kappa) from tau, written to a buffer (8 bytes per element);
* ``adana``: danastar's ADana update (2 buffers), for scale.

The difference between the first two is what the power costs inside the kernel: if it alone
exceeds what a 2x target leaves, the target is below the limit of Sleef's vectorised log and exp
(those torch.compile's CPU backend calls) on this CPU. Writes
``benchmarks/results/dana_star_limit-cpu.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from datetime import datetime, timezone
from pathlib import Path

import torch

from danastar.optim import dana_star as star
from danastar.optim.adana import adana_update

KAPPA, CLIPSNR, EPS = 0.85, 2.0, 1e-8
STEP = 1000.0  # k: T_eff = tau k, well above 1 for most coordinates


def effective_time(tau, k, kappa):
    """T_eff = max(tau k, 1) itself, in place of `effective_time_factor`'s T_eff^(1 - kappa)."""
    return torch.clamp(tau * k, min=1)


def _without_power():
    """danastar's own update, its code unchanged, in a copy of its module whose
    `effective_time_factor` is `effective_time`: every other operation, and the memory traffic,
    are the real kernel's. (torch.compile keeps what it generates in the function's module and
    its cache on the code object, so both are copies of their own.)"""
    module = types.ModuleType(f"{star.__name__}_without_power")
    module.__dict__.update({k: v for k, v in vars(star).items() if k != "__name__"})
    module.effective_time_factor = effective_time
    sys.modules[module.__name__] = module
    code = star.dana_star_update.__code__.replace()  # equal but distinct: dynamo caches per code
    return types.FunctionType(code, vars(module), "without_power")


without_power = _without_power()


def power_alone(out, tau, *, k, kappa):
    out.copy_(star.effective_time_factor(tau, k, kappa))


def candidates(numel: int) -> dict:
    """name -> a function of no arguments taking one step."""
    generator = torch.Generator().manual_seed(0)
    arrays = [torch.rand(numel, generator=generator) for _ in range(6)]
    param, grad, m, v, tau, out = arrays
    grad.sub_(0.5).mul_(1e-3)
    v.mul_(1e-6)
    tau.mul_(0.5)
    scalars = {name: torch.tensor(value) for name, value in
               star.dana_star_scalars(STEP, 1e-3, 1.0, delta=8.0, weight_decay=4e-3,
                                      wd_ts=1000).items()}
    constants = dict(kappa=KAPPA, clipsnr=CLIPSNR, eps=EPS)
    options = dict(fullgraph=True, dynamic=False)
    full = torch.compile(star.dana_star_update, **options)
    plain = torch.compile(without_power, **options)
    power = torch.compile(power_alone, **options)
    adana = torch.compile(adana_update, **options)
    adana_scalars = {"a": scalars["a"], "boost": torch.tensor(STEP ** 0.15), "lr": scalars["lr"],
                     "decay": scalars["decay"]}
    fused_param = param.clone().requires_grad_()
    fused_param.grad = grad.clone()
    fused = torch.optim.AdamW([fused_param], lr=1e-3, fused=True)
    return {
        "adamw fused (torch)": fused.step,
        "dana-star-mk4": lambda: full(param, grad, m, v, tau, **scalars, **constants),
        "without the power": lambda: plain(param, grad, m, v, tau, **scalars, **constants),
        "the power alone": lambda: power(out, tau, k=scalars["k"], kappa=KAPPA),
        "adana": lambda: adana(param, grad, m, v, **adana_scalars, clipsnr=CLIPSNR, eps=EPS),
    }


def measure(numel: int, rounds: int) -> list[dict]:
    steps = candidates(numel)
    for step in steps.values():  # compile and warm up
        step(), step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    baseline = statistics.median(times["adamw fused (torch)"])
    rows = []
    for name, values in times.items():
        median = statistics.median(values)
        rows.append({"candidate": name, "params": numel, "ms": median * 1e3,
                     "ns_per_element": median / numel * 1e9, "vs_fused_adamw": median / baseline})
        print(f"{name:22s} {numel:>12,d} {median * 1e3:9.3f} ms {median / baseline:6.2f}x",
              flush=True)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                             "dana_star_limit-cpu.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [row for size in args.sizes for row in measure(int(size), args.rounds)]
    sys.path.insert(0, str(Path(__file__).parent))
    from optim_step import machine_description

    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
              "machine": machine_description(torch.device("cpu")), "torch": torch.__version__,
              "rounds": args.rounds, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print("\n| candidate | " + " | ".join(f"{s:.0e} elements" for s in args.sizes) + " |")
    print("|---|" + "---|" * len(args.sizes))
    for name in dict.fromkeys(row["candidate"] for row in rows):
        cells = [f"{r['ms']:.3g} ms ({r['vs_fused_adamw']:.2f}×)" for r in rows
                 if r["candidate"] == name]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
