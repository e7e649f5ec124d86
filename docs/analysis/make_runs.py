"""The small grid behind the figures of docs/analysis.md, on the Shakespeare corpus, 60 steps
each, on the CPU: 2 optimizers x 2 sizes x 3 LRs (a few minutes on an idle machine).

    python docs/analysis/make_runs.py runs/example                 # --iterations N: shorter runs

The runs train one after another in this process, each as `danastar train` would; a run whose
directory already holds metrics is skipped. Each run is one line (what it trains, where, its
final loss); its full output is shown only if it fails. The last line says what to run next on
the whole grid.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import sys
import time
from pathlib import Path

from danastar import scaling
from danastar.cli import main as danastar
from danastar.rundir import metrics
from danastar.rundir.files import METRICS_FILE

OPTIMIZERS = ("adamw", "dana-star-mk4")
LR_MULTIPLIERS = {2: (0.5, 1.0, 2.0), 3: (0.5, 1.0, 2.0)}  # heads -> multiples of the law's LR
FIGURES = "scratch"  # where the docs' commands write their figures and tables (git-ignored)


def grid(root: Path) -> list[tuple[str, int, float, Path]]:
    """(optimizer, heads, LR, run directory) of every run, in the order they train."""
    runs = []
    for heads, multipliers in LR_MULTIPLIERS.items():
        for opt in OPTIMIZERS:
            plan = scaling.make_plan("enoki", opt, heads, batch_size=8, seq_len=128,
                                     vocab_size=50304)
            for multiplier in multipliers:
                lr = plan.lr * multiplier
                runs.append((opt, heads, lr, root / f"{opt}_h{heads}_lr{lr:.2e}"))
    return runs


def train(opt: str, heads: int, lr: float, run_dir: Path, iterations: int) -> tuple[int, str]:
    """Train one run quietly: (exit code, everything it printed)."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        code = danastar(
            ["train", "--config", "cpu_shakespeare", "--heads", str(heads), "--opt", opt,
             "--lr", repr(lr), "--iterations", str(iterations), "--batch_size", "8",
             "--eval_interval", "10", "train.eval_batches=4", "train.final_eval_batches=8",
             "train.sample_tokens=0", "logging.progress=false", "--run_dir", str(run_dir)])
    return code, output.getvalue()


def final_loss(run_dir: Path) -> str:
    final = metrics.final_validation(metrics.records(run_dir / METRICS_FILE))
    return "no final loss" if final is None else f"final validation loss {final['val_loss']:.4f}"


def next_line(root: Path) -> str:
    """What to run next on the whole grid: its tables and its figures."""
    where = shlex.quote(str(root))
    return (f"next: danastar results {where} --best  |  danastar plot curves {where} --best "
            f"--out {FIGURES}/curves_best  |  danastar plot lr-sweep {where} --out "
            f"{FIGURES}/lr_sweep")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path("runs/example"),
                        help="where the run directories go (default runs/example)")
    parser.add_argument("--iterations", type=int, default=60, help="steps per run (default 60)")
    args = parser.parse_args(argv)
    runs = grid(args.root)
    print(f"{len(runs)} runs of {args.iterations} steps on Shakespeare, on the CPU, one after "
          f"another: {len(OPTIMIZERS)} optimizers x {len(LR_MULTIPLIERS)} sizes x 3 LRs, in "
          f"{args.root}/", flush=True)
    for index, (opt, heads, lr, run_dir) in enumerate(runs, 1):
        print(f"[{index}/{len(runs)}] {opt}, {heads} heads, lr {lr:.3g} in {run_dir}: ", end="",
              flush=True)
        if (run_dir / METRICS_FILE).exists():
            print("already trained, skipped", flush=True)
            continue
        started = time.monotonic()
        code, output = train(opt, heads, lr, run_dir, args.iterations)
        if code:
            print(f"failed (exit code {code}); its output:\n{output.rstrip()}", flush=True)
            return code
        print(f"{final_loss(run_dir)} ({time.monotonic() - started:.0f} s)", flush=True)
    print(next_line(args.root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
