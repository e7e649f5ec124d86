"""What `import danastar.optim` costs a fresh process, beside torch's own import, interleaved.

    python benchmarks/import_time.py              # 9 rounds
    python benchmarks/import_time.py --rounds 21

Each round starts one fresh Python per candidate, in turn (so a machine whose speed drifts slows
all alike), and reads the operating system's accounting of the finished child: CPU seconds (user
plus system), wall seconds and peak resident memory. The candidates: `import torch` (the floor),
`import danastar.optim` (what a user of the optimizers pays), and the same followed by
`import torch.distributed.tensor` (what it paid while the optimizers imported DTensor eagerly;
now only a sharded model does), and the training loop's import plus a run's plan, without and
with torch's compiler (what planning imported until its meta model stopped initialising
itself). Reported: the median per candidate and its ratio to the floor's
median. Writes ``benchmarks/results/import_time.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from optim_step import machine_description

# What every `danastar train` process (and its dry run, a refusal, a sweep's plan) does before
# it builds an optimizer: import the loop, plan the run (a meta model counts its parameters).
# The last candidate adds what planning paid while the meta model imported torch's compiler.
PLAN = ("import danastar.train.loop; from danastar.scaling import make_plan; "
        "make_plan('enoki', 'adana', heads=2)")
CANDIDATES = {
    "import torch": "import torch",
    "import danastar.optim": "import danastar.optim",
    "danastar.optim + torch.distributed.tensor":
        "import danastar.optim, torch.distributed.tensor",
    "the training loop + a run's plan": PLAN,
    "the training loop + a run's plan + torch._dynamo": PLAN + "; import torch._dynamo",
}
FLOOR = "import torch"


def run_once(code: str) -> dict:
    """One fresh interpreter running `code`: CPU and wall seconds, peak memory in MiB."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{code!r} failed with exit status {os.waitstatus_to_exitcode(status)}")
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall,
            "peak_mib": usage.ru_maxrss / 1024}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    for code in CANDIDATES.values():  # warm the file cache
        run_once(code)
    samples = {name: [] for name in CANDIDATES}
    for _ in range(args.rounds):
        for name, code in CANDIDATES.items():
            samples[name].append(run_once(code))
    rows = []
    floor = {key: statistics.median(s[key] for s in samples[FLOOR]) for key in ("cpu_s", "wall_s")}
    for name, runs in samples.items():
        median = {key: statistics.median(r[key] for r in runs)
                  for key in ("cpu_s", "wall_s", "peak_mib")}
        rows.append({"candidate": name, **median,
                     "cpu_vs_torch": median["cpu_s"] / floor["cpu_s"],
                     "wall_vs_torch": median["wall_s"] / floor["wall_s"]})
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
              "machine": machine_description(torch.device("cpu")),
              "torch": torch.__version__, "python": sys.version.split()[0],
              "rounds": args.rounds, "rows": rows}
    out = Path(__file__).with_name("results") / "import_time.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['date']}, {result['machine']}, torch {result['torch']}, "
          f"{args.rounds} rounds (medians)\n")
    print("| candidate | CPU s | × torch | wall s | × torch | peak MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| `{row['candidate']}` | {row['cpu_s']:.2f} | {row['cpu_vs_torch']:.2f} | "
              f"{row['wall_s']:.2f} | {row['wall_vs_torch']:.2f} | {row['peak_mib']:.0f} |")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
