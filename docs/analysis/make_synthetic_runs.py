"""Run directories from a synthetic loss model (no training), for the figures of
docs/analysis.md that need more sizes than a CPU can train in minutes:
2 optimizers x 6 sizes x 7 LRs, two seeds at the law's LR.

    python docs/analysis/make_synthetic_runs.py runs/synthetic

The loss model is in tests/analysis/fake_runs.py: L = 2 + b·C^(−0.1) + ζ·ln²(lr/lr*), with the
optimum lr* on the scaling table's law (times a log-normal factor per size, σ = 0.1) and
ζ = 0.08 for AdamW, 0.04 for Dana-Star-MK4.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "analysis"))

from fake_runs import write_run  # noqa: E402


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/synthetic")
    written = 0
    for opt in ("adamw", "dana-star-mk4"):
        for heads in (4, 6, 8, 10, 12, 14):
            for ratio in (0.25, 0.5, 0.7, 1.0, 1.4, 2.0, 4.0):
                for seed in (0, 1) if ratio == 1.0 else (0,):
                    write_run(root, opt, heads, lr_ratio=ratio, seed=seed, noise=0.002,
                              optimum_spread=0.1)
                    written += 1
    print(f"wrote {written} synthetic runs (AdamW and Dana-Star-MK4, 4 to 14 heads) to {root}")
    print(f"next: danastar results {root} --vs adamw | danastar plot scaling {root} --fit single")


if __name__ == "__main__":
    main()
