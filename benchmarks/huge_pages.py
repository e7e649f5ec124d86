"""A short `danastar train` of the studies' setting with and without glibc's huge pages for
malloc (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, what `danastar sweep` and `--nproc` set for the
processes they start; `danastar.launch.allocator`), alternating, one thread each.

    python benchmarks/huge_pages.py              # 3 pairs
    python benchmarks/huge_pages.py --pairs 5

The run: Enoki at 2 heads on Shakespeare, 32 × 128 tokens a step, float32, 16 steps, with the
validation loss at steps 0 and 16 (8 batches) and on the whole validation set at the end. Each
pair starts the two in turn in fresh processes and reads the operating system's accounting of
the finished child (wall, user and system seconds, minor page faults); the medians and their
ratio are reported, and every pair's logged losses are checked to be bitwise the same. Writes
``benchmarks/results/huge_pages-cpu.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from danastar.launch.allocator import HUGE_PAGES
from optim_step import machine_description

TRAIN = ["--config", "cpu_shakespeare", "data.dataset=shakespeare", "model.heads=2",
         "train.batch_size=32", "train.eval_interval=16", "train.final_eval_batches=null",
         "train.sample_tokens=0", "train.autocast=off", "logging.progress=false",
         "optim.name=adana", "optim.lr=0.0022", "train.seed=0", "train.iterations=16"]
CANDIDATES = {"default malloc": None, "huge pages": HUGE_PAGES}
TIMING_KEYS = ("tokens_per_s", "step_time", "mfu")


def run_once(tunables: str | None, run_dir: Path) -> dict:
    """One fresh `danastar train` into `run_dir`: its seconds, page faults and logged values."""
    environment = {key: value for key, value in os.environ.items() if key != "GLIBC_TUNABLES"}
    environment["OMP_NUM_THREADS"] = "1"
    if tunables:
        environment["GLIBC_TUNABLES"] = tunables
    shutil.rmtree(run_dir, ignore_errors=True)
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "danastar", "train", *TRAIN,
                                "--run_dir", str(run_dir)], env=environment,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"danastar train failed (exit {os.waitstatus_to_exitcode(status)})")
    logged = [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS}
              for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"wall_s": wall, "user_s": usage.ru_utime, "system_s": usage.ru_stime,
            "minor_faults": usage.ru_minflt, "logged": logged}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args(argv)
    samples = {name: [] for name in CANDIDATES}
    with tempfile.TemporaryDirectory() as scratch:
        run_once(None, Path(scratch) / "warm")  # the corpus and the file cache, once
        for index in range(args.pairs):
            order = list(CANDIDATES.items())
            for name, tunables in (order if index % 2 == 0 else order[::-1]):
                samples[name].append(run_once(tunables, Path(scratch) / "run"))
            logged = [samples[name][-1].pop("logged") for name in CANDIDATES]
            if logged[0] != logged[1]:
                raise SystemExit("the runs with and without huge pages logged different values")
    keys = ("wall_s", "user_s", "system_s", "minor_faults")
    medians = {name: {key: statistics.median(s[key] for s in runs) for key in keys}
               for name, runs in samples.items()}
    base, huge = medians["default malloc"], medians["huge pages"]
    torch.set_num_threads(1)  # as the runs measured (OMP_NUM_THREADS=1): the description says so
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
              "machine": machine_description(torch.device("cpu")),
              "torch": torch.__version__, "python": sys.version.split()[0],
              "pairs": args.pairs, "run": TRAIN, "bitwise_equal": True,
              "medians": medians, "samples": samples,
              "ratio": {key: huge[key] / base[key] for key in keys}}
    out = Path(__file__).with_name("results") / "huge_pages-cpu.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['date']}, {result['machine']}, torch {result['torch']}, "
          f"{args.pairs} pairs (medians); logged values bitwise equal\n")
    print("| malloc | wall s | user s | system s | minor page faults |")
    print("|---|---:|---:|---:|---:|")
    for name, median in medians.items():
        print(f"| {name} | {median['wall_s']:.1f} | {median['user_s']:.1f} | "
              f"{median['system_s']:.1f} | {median['minor_faults']:,.0f} |")
    ratio = result["ratio"]
    print(f"| ratio | {ratio['wall_s']:.2f} | {ratio['user_s']:.2f} | {ratio['system_s']:.2f} | "
          f"{ratio['minor_faults']:.3f} |")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
