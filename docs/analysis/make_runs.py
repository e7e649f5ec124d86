"""The small grid behind the figures of docs/analysis.md, on the Shakespeare corpus, 60 steps
each, on the CPU: 2 optimizers x 2 sizes x 3 LRs (a few minutes on an idle machine).

    python docs/analysis/make_runs.py runs/example                 # --iterations N: shorter runs

The runs train one after another in this process, each as `danastar train` would; a run whose
directory already holds metrics is skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from danastar import scaling
from danastar.cli import main as danastar

OPTIMIZERS = ("adamw", "dana-star-mk4")
LR_MULTIPLIERS = {2: (0.5, 1.0, 2.0), 3: (0.5, 1.0, 2.0)}  # heads -> multiples of the law's LR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path("runs/example"),
                        help="where the run directories go (default runs/example)")
    parser.add_argument("--iterations", type=int, default=60, help="steps per run (default 60)")
    args = parser.parse_args(argv)
    for heads, multipliers in LR_MULTIPLIERS.items():
        for opt in OPTIMIZERS:
            plan = scaling.make_plan("enoki", opt, heads, batch_size=8, seq_len=128,
                                     vocab_size=50304)
            for multiplier in multipliers:
                lr = plan.lr * multiplier
                run_dir = args.root / f"{opt}_h{heads}_lr{lr:.2e}"
                if (run_dir / "metrics.jsonl").exists():
                    continue
                code = danastar(
                    ["train", "--config", "cpu_shakespeare", "--heads", str(heads), "--opt", opt,
                     "--lr", repr(lr), "--iterations", str(args.iterations), "--batch_size", "8",
                     "--eval_interval", "10", "train.eval_batches=4", "train.final_eval_batches=8",
                     "train.sample_tokens=0", "--run_dir", str(run_dir)])
                if code:
                    return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
