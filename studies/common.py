"""What the studies' drivers and reports share.

A driver (`<study>/study.py`) trains with `danastar sweep` run as a process and mirrors each
run's small files into the study's `records/`; a report (`<study>/report.py`) rebuilds the tables
and figures from those records alone. Both import this module from the folder above theirs:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import common
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing

# A run's small files, what the reports (and `danastar results` / `danastar plot`) read; no
# checkpoints.
RECORD_FILES = ("plan.json", "config.yaml", "metrics.jsonl", "run.json", "status.json",
                "sweep_point.json")


# ---- drivers ----------------------------------------------------------------------------------

def copy_run_files(source: Path, target: Path, folders: tuple[str, ...] = ()) -> None:
    """`RECORD_FILES` (and the `folders`) of the run at `source` copied to `target`."""
    target.mkdir(parents=True, exist_ok=True)
    for name in RECORD_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
    for name in folders:
        if (source / name).is_dir():
            shutil.copytree(source / name, target / name, dirs_exist_ok=True)


def copy_records(sweep_dir: Path, records: Path, folders: tuple[str, ...] = (),
                 keep: Callable[[Path, Path], bool] | None = None) -> None:
    """Each run of a sweep mirrored under `records/<sweep>/<run>/`; `keep(run, target)`, when
    given, decides which runs are copied."""
    for plan in sorted(sweep_dir.glob("*/plan.json")):
        run = plan.parent
        target = records / sweep_dir.name / run.name
        if keep is None or keep(run, target):
            copy_run_files(run, target, folders)


def sweep_command(path: Path, runs: Path, parallel: int) -> list[str]:
    return [sys.executable, "-m", "danastar", "sweep", str(path), "--runs_root", str(runs),
            "--parallel", str(parallel)]


def run_sweep(path: Path, name: str, runs: Path, parallel: int, records: Path,
              folders: tuple[str, ...] = ()) -> None:
    """`danastar sweep` one file (it skips what is complete), then copy its records."""
    command = sweep_command(path, runs, parallel)
    print("$", " ".join(command[1:]), flush=True)
    code = subprocess.call(command)
    copy_records(runs / name, records, folders)
    if code != 0:
        sys.exit(f"study: the sweep {path.name} did not complete (exit {code}); run the study "
                 "again to resume it.")


def write_sweep(path: Path, name: str, base: dict, grid: dict, comment: str) -> Path:
    """A sweep file that a driver works out from the records, with a header saying so."""
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump({"name": name, "base": base, "grid": grid}, sort_keys=False)
    path.write_text(f"# {comment}\n# Written by study.py from the records; do not edit.\n{text}")
    return path


def beyond_edge(losses: dict[float, float]) -> tuple[float, float] | None:
    """Where the best of a sweep (LR multiplier -> final loss) sits at an edge of it, the two
    multipliers past that edge (x2 and x4 beyond it: two runs that can train side by side);
    None when the best is inside."""
    best = min(losses, key=losses.get)
    if min(losses) < best < max(losses):
        return None
    step = 0.5 if best == min(losses) else 2.0
    return best * step, best * step * step


def driver_parser(description: str, what: tuple[str, ...], parallel_help: str
                  ) -> argparse.ArgumentParser:
    """A driver's command line: what to do (`all` by default), where the runs go, how many at a
    time."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("what", nargs="?", choices=what, default="all")
    parser.add_argument("--runs", type=Path, default=Path("runs"),
                        help="where the run directories (with checkpoints) go")
    parser.add_argument("--parallel", type=int, default=2, help=parallel_help)
    return parser


# ---- reports ----------------------------------------------------------------------------------

def fmt(value: float | None, spec: str = ".4f") -> str:
    """A number for a table; a dash where there is none."""
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else format(value, spec)


def pm(mean_se, spec: str = ".4f") -> str:
    """A mean ± its standard error (`analysis.seeds.mean_se`); the mean alone for one seed."""
    if mean_se.n > 1 and not math.isnan(mean_se.se):
        return f"{mean_se.mean:{spec}} ± {mean_se.se:{spec}}"
    return format(mean_se.mean, spec)


def figure_writer(out: Path, text: list[str]) -> Callable[[str, Callable], None]:
    """`figure(name, make)`: draws `make()` into `out/name.png|pdf`; where the records cannot
    make it yet, the report's `text` says why instead."""
    from danastar.analysis import plots
    from danastar.errors import UserError

    def figure(name: str, make: Callable) -> None:
        try:
            written = plots.save(make(), out / name)
        except UserError as error:
            text.extend([f"*{name}: not drawn: {error}*", ""])
            print(f"{name}: {error}")
            return
        print("wrote", ", ".join(str(p.relative_to(ROOT)) for p in written))

    return figure
