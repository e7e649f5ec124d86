"""What the studies' drivers and reports share.

A driver (`<study>/study.py`) trains with `danastar sweep` run as a process and mirrors each
run's small files into the study's `records/`; a report (`<study>/report.py`) rebuilds the tables
and figures from those records alone. Both import this module from the folder above theirs:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import common
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing

from danastar.launch.allocator import with_huge_pages  # noqa: E402

# A run's small files, what the reports (and `danastar results` / `danastar plot`) read, and
# what trained it (revision, versions, CPU); no checkpoints.
RECORD_FILES = ("plan.json", "config.yaml", "metrics.jsonl", "run.json", "status.json",
                "sweep_point.json", "environment.json")


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


# ---- a scheduler over sweeps: what can run now, from the records alone -------------------------

@dataclasses.dataclass(frozen=True)
class Task:
    """One sweep file: its name (also its folder under the runs and the records), base and grid,
    and its place in the queue (lower first)."""

    name: str
    base: dict
    grid: dict
    priority: tuple
    comment: str

    def points(self) -> list[str]:
        from danastar.launch.sweep_spec import parse_sweep

        return [p.name for p in parse_sweep({"name": self.name, "base": self.base,
                                             "grid": self.grid}).points()]


def complete(run_dir: Path) -> bool:
    from danastar.launch.sweep_spec import run_state

    return run_state(run_dir)["state"] == "complete"


def final_loss(run_dir: Path) -> float:
    for line in reversed((run_dir / "metrics.jsonl").read_text().splitlines()):
        record = json.loads(line)
        if record.get("final"):
            return float(record["val_loss"])
    raise ValueError(f"{run_dir} has no final record")


class Scheduler:
    """Trains a study's sweeps with `danastar sweep`, `parallel` at a time, in the order that
    `plan()` gives; `plan()` works out from the records alone which sweeps can be written now
    (later ones depend on earlier results). Every minute, and when a sweep ends, the complete
    runs' small files are copied into `records/`; a later run, here or on a fresh clone, first
    puts the recorded runs back under the runs folder so that `danastar sweep` skips them."""

    def __init__(self, records: Path, sweeps: Path, plan: Callable[[], list[Task]]):
        self.records, self.sweeps, self.plan = records, sweeps, plan

    def recorded(self, task_name: str) -> dict[str, Path]:
        """point name -> record folder, for the complete runs of one sweep."""
        folder = self.records / task_name
        if not folder.is_dir():
            return {}
        return {d.name: d for d in sorted(folder.iterdir()) if d.is_dir() and complete(d)}

    def is_done(self, task: Task) -> bool:
        return set(task.points()) <= set(self.recorded(task.name))

    def write(self, task: Task) -> Path:
        return write_sweep(self.sweeps / f"{task.name}.yaml", task.name, task.base, task.grid,
                           task.comment)

    def restore(self, runs: Path) -> None:
        """Every recorded complete run put back under the runs folder."""
        if not self.records.is_dir():
            return
        for sweep in self.records.iterdir():
            for point, record in self.recorded(sweep.name).items():
                target = runs / sweep.name / point
                if not (target.is_dir() and complete(target)):
                    copy_run_files(record, target)

    def copy_complete(self, sweep_dir: Path) -> None:
        """The complete runs' small files, mirrored under records/<sweep>/<point>/ (once)."""
        copy_records(sweep_dir, self.records, keep=lambda run, target: complete(run) and not (
            target.is_dir() and complete(target)))

    def start(self, task: Task, runs: Path) -> subprocess.Popen:
        command = sweep_command(self.write(task), runs, 1)
        log = runs / "study-logs" / f"{task.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"{time.strftime('%H:%M:%S')} start  {task.name} ({len(task.points())} runs)",
              flush=True)
        with log.open("a") as out:
            # Its own session: a stop signal reaches it once, from `run`, not also from a
            # terminal's Ctrl-C (a sweep stops its runs on the first one).
            return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def run(self, runs: Path, parallel: int) -> int | None:
        """Trains until every sweep that can run has run. SIGTERM or Ctrl-C stops it cleanly:
        each running sweep is passed the signal, its runs save where they are, and it returns
        the sweep's exit code for a stop (75 or 130); None otherwise."""
        runs = runs.resolve()
        self.restore(runs)
        running: dict[str, tuple[Task, subprocess.Popen]] = {}
        stop: list[int] = []

        def on_signal(signum, _frame) -> None:
            if not stop:
                stop.append(signum)
                for _task, process in running.values():
                    process.send_signal(signum)

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.train(runs, parallel, running, stop)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if stop:
            why = "Ctrl-C" if stop[0] == signal.SIGINT else signal.Signals(stop[0]).name
            print(f"study: stopped by {why}; the part-way runs saved where they were. Run the "
                  "study again to resume them.", file=sys.stderr, flush=True)
            return 130 if stop[0] == signal.SIGINT else 75
        return None

    def train(self, runs: Path, parallel: int, running: dict, stop: list[int]) -> None:
        failed: set[str] = set()
        last_copy = time.monotonic()
        while True:
            for name, (task, process) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[name]
                self.copy_complete(runs / name)
                if self.is_done(task):
                    print(f"{time.strftime('%H:%M:%S')} done   {name}", flush=True)
                elif stop:
                    print(f"{time.strftime('%H:%M:%S')} stopped {name}", flush=True)
                else:
                    failed.add(name)
                    print(f"study: the sweep {name} ended (exit {process.returncode}) with runs "
                          f"missing; see {runs / 'study-logs' / name}.log. Run the study again "
                          "to resume it.", file=sys.stderr, flush=True)
            if time.monotonic() - last_copy > 60:
                for name in running:
                    self.copy_complete(runs / name)
                last_copy = time.monotonic()
            ready = [] if stop else [t for t in self.plan() if t.name not in running
                                     and t.name not in failed and not self.is_done(t)]
            while ready and len(running) < parallel and not stop:
                task = ready.pop(0)
                running[task.name] = (task, self.start(task, runs))
                if stop:  # the signal came while this sweep was starting
                    running[task.name][1].send_signal(stop[0])
            if not running:
                break
            time.sleep(1 if stop else 5)
        if stop:
            return
        left = [t.name for t in self.plan() if not self.is_done(t)]
        print("study: every sweep is complete." if not left else
              f"study: {len(left)} sweeps could not complete: {', '.join(left)}.", flush=True)

    def status(self) -> None:
        for task in self.plan():
            have = len(set(task.points()) & set(self.recorded(task.name)))
            print(f"{task.name:<36} {have}/{len(task.points())} runs recorded")


def set_run_environment() -> None:
    """The environment the drivers' runs inherit. Two one-thread runs side by side train about
    15% more tokens per second on two cores than one two-thread run (set OMP_NUM_THREADS
    yourself to override); glibc's malloc is asked for huge pages, as `danastar sweep` asks for
    its runs (`danastar.launch.allocator`: 0.68× the wall time here, the losses bitwise the
    same)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.update(with_huge_pages(os.environ))


def scheduled_main(description: str, scheduler: Scheduler, report: Callable[[], None],
                   before_run: Callable[[], None] = lambda: None) -> None:
    """The command line of a driver whose sweeps a `Scheduler` runs: `status`, `run`, `report`
    or all of them (`before_run` first readies what the runs need)."""
    parser = driver_parser(description, ("all", "run", "report", "status"),
                           "sweeps at a time (default 2, one thread each)")
    args = parser.parse_args()
    set_run_environment()
    if args.what == "status":
        scheduler.status()
    if args.what in ("all", "run"):
        before_run()
        stopped = scheduler.run(args.runs, args.parallel)
        if stopped is not None:
            sys.exit(stopped)
    if args.what in ("all", "report"):
        report()


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


def paper_estimate(curve: dict[int, list[tuple[float, float]]], runs) -> tuple | None:
    """The paper's estimator over seeds: each run's (PFH, final loss) read off the baseline's
    curve of its own seed (`curve`: seed -> (PFH, loss) points across horizons); (mean ± s.e. of
    the multipliers, whether any was extrapolated), or None with fewer than two seeds read."""
    from danastar.analysis import multiplier, seeds

    values, outside = [], False
    for run in runs:
        points = sorted(curve.get(run.seed, []))
        if len(points) < 2 or any(b[1] >= a[1] for a, b in zip(points, points[1:])):
            continue
        (point,) = multiplier.measured_multipliers(points, [(run.pfh, run.final_loss)])
        values.append(point.multiplier)
        outside |= point.kind != multiplier.INTERPOLATED
    return (seeds.mean_se(values), outside) if len(values) > 1 else None


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
