"""The small grid behind the figures of docs/analysis.md, on the embedded Shakespeare corpus,
60 steps each, on the CPU: 2 optimizers x 2 sizes x 3 LRs (a few minutes on an idle machine).

    PYTHONPATH=src python docs/analysis/make_runs.py runs/example
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from danastar import scaling

OPTIMIZERS = ("adamw", "dana-star-mk4")
LR_MULTIPLIERS = {2: (0.5, 1.0, 2.0), 3: (0.5, 1.0, 2.0)}  # heads -> multiples of the law's LR


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/example")
    for heads, multipliers in LR_MULTIPLIERS.items():
        for opt in OPTIMIZERS:
            plan = scaling.make_plan("enoki", opt, heads, batch_size=8, seq_len=128,
                                     vocab_size=50304)
            for multiplier in multipliers:
                lr = plan.lr * multiplier
                run_dir = root / f"{opt}_h{heads}_lr{lr:.2e}"
                if (run_dir / "metrics.jsonl").exists():
                    continue
                subprocess.run(
                    [sys.executable, "-m", "danastar", "train", "--config", "cpu_shakespeare",
                     "--heads", str(heads), "--opt", opt, "--lr", repr(lr),
                     "--iterations", "60", "--batch_size", "8", "--eval_interval", "10",
                     "train.eval_batches=4", "train.final_eval_batches=8",
                     "train.sample_tokens=0", "--run_dir", str(run_dir)],
                    check=True)


if __name__ == "__main__":
    main()
