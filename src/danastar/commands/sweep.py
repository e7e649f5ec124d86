"""`danastar sweep SPEC.yaml`: train every point of a sweep file here, one run directory each.

    danastar sweep sweeps/lr.yaml --dry_run         # list the runs and their state
    danastar sweep sweeps/lr.yaml                   # one after another
    danastar sweep sweeps/lr.yaml --parallel 4      # four at a time (one GPU each when there are)

The sweep file's format is `danastar.launch.sweep_spec` (the same file feeds `danastar submit
--array`). Runs go to `<runs_root>/<name>/<point>`; the expanded list, with each run's resolved
LR and arguments, to `<runs_root>/<name>/sweep.json`; each run's output to
`<runs_root>/<name>/logs/<point>.log`. A run is complete when its metrics.jsonl holds the final
validation record at step == iterations; re-running the sweep skips complete runs and resumes
the others from their checkpoints, so a sweep survives whatever a single run survives.

Re-running an edited sweep file is the resume check of `danastar train` for each point that has
trained (`danastar.train.identity`): a point whose settings are unchanged is skipped or resumed,
one whose `train.iterations` grew on a schedule that allows it is trained on, and any other
change is refused, naming the point's run directory and the change, before anything is trained
or written (sweep.json included).

Arguments after the sweep file that are not the sweep's own are passed to every run's
`danastar train` (e.g. `--no_wandb`, `train.device=cpu`). A flag or `section.key=value` given
there overrides the file's `base:` for every point (and is then part of each run's settings,
checked as above when the sweep is run again); one that sets a key the file's `grid:` varies is
refused, and so is `--run_dir` (the sweep names its runs' directories: use `--runs_root`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from danastar.config import load_config, name_too_long
from danastar.errors import UserError
from danastar.launch.allocator import with_huge_pages
from danastar.launch.sweep_spec import Sweep, SweepPoint, load_sweep, run_state
from danastar.progress import Stages, bar
from danastar.rundir import metrics
from danastar.rundir.exits import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE
from danastar.rundir.files import METRICS_FILE


@dataclass
class PlannedRun:
    point: SweepPoint
    run_dir: Path
    argv: list[str]  # for `danastar train`, --run_dir included
    lr: float
    state: dict  # run_state(run_dir, iterations)
    processes: int  # parallel.nproc of the run
    iterations: int  # the total the run is to reach
    # the changes (`name: old → new`) by which the run recorded in run_dir is another run than
    # this point's settings make: `danastar train` would refuse to resume it
    refused: list[str] = field(default_factory=list)
    planned: dict = field(default_factory=dict)  # its dry run (`danastar.train.plan.dry_run`)

    @property
    def epochs(self) -> Optional[float]:
        """How many times the run reads its corpus (None: not known before it is prepared)."""
        return self.planned["corpus"]["epochs"] if self.planned else None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="danastar sweep", description="Train every point of a sweep file here.",
        epilog="Other arguments are passed to every run's `danastar train`.")
    parser.add_argument("spec", metavar="SPEC.yaml", help="the sweep file")
    parser.add_argument("--parallel", type=int, default=1, metavar="N",
                        help="runs at a time (default 1); with N visible GPUs, one GPU each")
    parser.add_argument("--runs_root", default="runs",
                        help="where the sweep's folder goes (default ./runs)")
    parser.add_argument("--dry_run", action="store_true",
                        help="list the runs and their state; train and write nothing")
    args, train_argv = parser.parse_known_args(argv)
    if args.parallel < 1:
        raise UserError(f"--parallel must be at least 1 (got {args.parallel}).")

    sweep = load_sweep(args.spec)
    given = command_line_keys(train_argv)
    check_command_line(sweep, given)
    root = Path(args.runs_root).expanduser().resolve() / sweep.name
    check_runs_root(Path(args.runs_root), root, [root / point.name for point in sweep.points()])
    points = sweep.points()
    from danastar.rundir.lock import check_free

    # Another sweep of this folder is said first, in one sentence, before any planning (probed
    # only: the sweep takes the lock below).
    check_free(root, "use another --runs_root")
    stages = Stages("danastar sweep")
    stages.start(f"planning {len(points)} runs, each checked as `danastar train` would check "
                 "it", only_on_terminal=True)  # a planned run may be refused: then one sentence
    # A dry run prepares no data: where it is not prepared yet, the runs are not compared.
    runs = [plan_run(sweep.name, overridden(point, given), root, train_argv,
                     prepare=not args.dry_run)
            for point in stages.counted(points, len(points), "run")]
    refuse_changed_runs(sweep.name, runs)  # before anything is written
    if args.dry_run:
        print_runs(runs)
    from danastar.train.data import check_prepared_here

    # Data this machine lacks and training would not prepare: refused after the dry run's list
    # (which needs none), and before a sweep writes or trains anything.
    for dataset in sorted({run.planned["dataset"] for run in runs}):
        check_prepared_here(dataset)
    if args.dry_run:
        return 0
    for line in plan_lines(runs):
        print(line, file=sys.stderr if line.startswith("warning") else sys.stdout)
    root.mkdir(parents=True, exist_ok=True)
    from danastar.rundir import lock as run_lock

    # One sweep process per sweep folder (each run holds its own run directory's lock as well).
    with run_lock.hold(root, "danastar sweep", "use another --runs_root") as unlocked:
        if unlocked:
            print(f"danastar sweep: {unlocked}", file=sys.stderr)
        write_expanded(root, sweep, runs, train_argv)
        return run_all(runs, root, args.parallel, sweep.name)


def check_runs_root(runs_root: Path, root: Path, run_dirs: list[Path]) -> None:
    """Refuse, before any run is planned or anything written, a --runs_root that cannot hold the
    sweep: a file on its way, a folder that takes no new files, or a file where the sweep's
    folder or one of its runs' directories goes."""
    from danastar.durable import check_output

    check_output(runs_root, "--runs_root", folder=True)
    for path in (root, *run_dirs):
        what = "the sweep's folder" if path == root else f"run {path.name}'s directory"
        if path.exists() and not path.is_dir():
            raise UserError(f"{path} is a file, where {what} goes; move it away or give "
                            f"another --runs_root.")
        if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
            raise UserError(f"{path}, {what}, is not writable; make it writable or give another "
                            f"--runs_root.")


def command_line_keys(train_argv: list[str]) -> dict[str, str]:
    """The config keys that the arguments passed to every run set, each with how it was given
    (`--seed`, `train.seed=7`); `preset` for `--config`. A mistake in them is left to the runs'
    own parsing, which names it."""
    from danastar.config import FLAGS, SWITCHES, build_parser

    try:
        args, _ = build_parser().parse_known_intermixed_args(train_argv)
    except UserError:
        return {}
    given = {}
    for name, value in vars(args).items():
        if name in FLAGS:
            given[FLAGS[name][0]] = f"--{name}"
        elif name in SWITCHES:
            given[SWITCHES[name][0]] = f"--{name}"
        elif name == "config":
            given["preset"] = "--config"
        elif name in ("wandb", "auto_resume"):
            key = "logging.wandb" if name == "wandb" else "checkpoint.auto_resume"
            given[key] = f"--{'' if value else 'no_'}{name}"
    for item in getattr(args, "overrides", []):
        key, _, _ = item.partition("=")
        given[key.strip()] = item
    return given


def check_command_line(sweep: Sweep, given: dict[str, str]) -> None:
    """The sweep names its runs' directories, and what its grid varies is the file's to say."""
    if "logging.run_dir" in given:
        raise UserError(f"{given['logging.run_dir']} is not for a sweep, which puts each run in "
                        f"<runs_root>/{sweep.name}/<point>; choose where with --runs_root "
                        f"instead.")
    grid = {("preset" if key == "config" else key): values for key, values in sweep.grid.items()}
    if "optim.lr" in given and "lr_multiplier" in grid:
        grid["optim.lr"] = grid["lr_multiplier"]  # the same LR, as a multiple of the law's
    for key, how in given.items():
        if key in grid:
            where = f"sweep file {sweep.source}" if sweep.source else f"sweep {sweep.name}"
            varied = "lr_multiplier" if key == "optim.lr" and "optim.lr" not in sweep.grid else key
            raise UserError(f"{how} sets {key} for every run, but {where} varies {varied} in "
                            f"its grid ({', '.join(map(str, grid[key]))}); remove {how} from "
                            f"the command line, or {varied} from the grid.")


def overridden(point: SweepPoint, given: dict[str, str]) -> SweepPoint:
    """The point with the file's base values that the command line sets taken out, so that the
    command line's win (a dotted override would otherwise beat a flag whatever their order)."""
    return replace(point, overrides={key: value for key, value in point.overrides.items()
                                     if key not in given},
                   preset=None if "preset" in given else point.preset,
                   lr_multiplier=None if "optim.lr" in given else point.lr_multiplier)


def plan_run(sweep_name: str, point: SweepPoint, root: Path, train_argv: list[str],
             prepare: bool = True) -> PlannedRun:
    """Resolve one point as `danastar submit --array` does (the same checks, the same LR from
    `lr_multiplier`), so that both ways of running a sweep train the same runs; where the point
    has trained before, compare its settings with the recorded ones as `danastar train` does."""
    from danastar.launch.jobs import validated_run
    from danastar.train import identity
    from danastar.train.data import open_tokens

    run_dir = root / point.name
    too_long = name_too_long(run_dir)
    if too_long:
        raise UserError(f"sweep {sweep_name}: run directory {run_dir} {too_long}; shorten the "
                        f"sweep's name or --runs_root, or the grid's keys and values (they name "
                        f"each run).")
    argv = [*train_argv, *point.train_argv()]
    try:
        world = load_config(argv)[0].parallel.nproc
        # checked as `danastar submit --array` checks a job; its config and plan are the run's
        argv, extra, planned, config = validated_run(argv, world, None, point.lr_multiplier,
                                                     run_dir)
        argv = [*argv, *extra]
        plan = planned["plan"]
        iterations, refused = plan["iterations"], []
        if identity.has_earlier_run(run_dir):
            tokens = open_tokens(config, prepare=prepare)
            if tokens is not None:
                current = identity.planned_identity(config, config.parallel.nproc, tokens)
                iterations = current["iterations"]
                refused = refused_changes(identity.recorded_changes(
                    run_dir, current, identity.extension_keys(config)), iterations)
    except UserError as error:
        raise UserError(f"sweep {sweep_name}, run {point.name}: {error}") from None
    state = run_state(run_dir, iterations)
    if refused and not config.checkpoint.auto_resume:
        # --no_auto_resume: `train` moves the earlier run aside and trains this one afresh
        refused, state = [], {"state": "afresh", "step": 0, "iterations": iterations}
    return PlannedRun(point, run_dir, [*argv, "--run_dir", str(run_dir), "logging.progress=false"],
                      plan["lr"], state, config.parallel.nproc, iterations, refused, planned)


def refused_changes(changes: Optional[tuple[int, list[str], list[str]]], iterations: int
                    ) -> list[str]:
    """The changes of `identity.recorded_changes` that `train` refuses, and a shorter total than
    the run has trained (which `train` would call finished, and the sweep would misdescribe)."""
    if changes is None:
        return []
    step, refused, accepted = changes
    if step > iterations:
        refused = [*refused, *(f"{change} (it has trained {step} steps)" for change in accepted
                               if change.startswith("iterations:"))]
    return refused


def refuse_changed_runs(sweep_name: str, runs: list[PlannedRun]) -> None:
    """Refuse a sweep whose runs have trained with other settings than the file now gives them,
    as `danastar train` refuses such a resume (a longer run on a schedule that allows it is
    trained on)."""
    problems = [(run, run.refused) for run in runs if run.refused]
    if not problems:
        return
    (first, refused), others = problems[0], len(problems) - 1
    more = (f", and {others} more of its runs {'was' if others == 1 else 'were'} too"
            if others else "")
    longer = any(longer_total(change) for _, changes in problems for change in changes)
    extend = (", or pass --extend (rewarm; or --extend stretch, reanchor) to continue them to "
              "the longer train.iterations" if longer else "")
    raise UserError(f"sweep {sweep_name}: {first.run_dir} was trained with other settings than "
                    f"the sweep now gives it ({'; '.join(refused)}){more}; to keep those runs, "
                    f"give the changed sweep file another name (its name: key) or another "
                    f"--runs_root, or undo the change to go on with them (--no_auto_resume moves "
                    f"them aside and trains them afresh){extend}.")


def longer_total(change: str) -> bool:
    """Whether a refused change (`iterations: 6 → 12 (...)`) is a longer total."""
    if not change.startswith("iterations:"):
        return False
    try:
        old, new = change.split(":", 1)[1].split("→")
        return int(old) < int(new.split()[0])
    except ValueError:  # not two totals (an older run's record)
        return False


def write_expanded(root: Path, sweep, runs: list[PlannedRun], train_argv: list[str]) -> None:
    """sweep.json: the sweep's definition, the arguments given to every run, and every run with
    its grid values and resolved LR."""
    record = {
        "name": sweep.name, "source": str(sweep.source) if sweep.source else None,
        "base": sweep.base, "grid": sweep.grid, "command_line": train_argv,
        "runs": [{"name": run.point.name, "run_dir": str(run.run_dir), "varied": run.point.varied,
                  "lr_multiplier": run.point.lr_multiplier, "lr": run.lr,
                  "train_argv": run.argv} for run in runs],
    }
    (root / "sweep.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    for run, entry in zip(runs, record["runs"]):
        # Beside the run's own records, so that a run directory alone says which sweep point it
        # is (its plan.json shows the resolved LR, not the multiplier).
        run.run_dir.mkdir(parents=True, exist_ok=True)
        (run.run_dir / "sweep_point.json").write_text(json.dumps(
            {"sweep": sweep.name, **{key: entry[key] for key in
                                     ("name", "varied", "lr_multiplier", "lr")}},
            indent=1, default=str) + "\n")


def describe(state: dict) -> str:
    if state["state"] == "complete":
        return "complete"
    if state["state"] == "partial":
        return f"resume at step {state['step']} of {state['iterations']}"
    if state["state"] == "afresh":
        return "afresh (the earlier run moved aside)"
    return "new"


def print_runs(runs: list[PlannedRun]) -> None:
    width = max(len(run.point.name) for run in runs)
    for run in runs:
        epochs = "?" if run.epochs is None else f"{run.epochs:.3g}"
        state = describe(run.state)
        if run.state["state"] == "complete":
            loss = final_loss(run.run_dir)
            state += f", loss {loss:.4f}" if loss is not None else ""
        print(f"{run.point.name:<{width}}  lr {run.lr:<10.4g} {epochs:>6} epochs  {state:<28} "
              f"{run.run_dir}")
    for line in plan_lines(runs):
        print(line)


def plan_lines(runs: list[PlannedRun]) -> list[str]:
    """What the sweep trains (how many runs, how many times each reads its corpus) and the
    warning of the run that reads its corpus most, when that is more than a few times."""
    from danastar.train.plan import planned_warning

    done = sum(run.state["state"] == "complete" for run in runs)
    epochs = [run.epochs for run in runs]
    datasets = {run.planned["dataset"] for run in runs}
    data = next(iter(datasets)) if len(datasets) == 1 else "their corpora"
    if None in epochs:
        read = f"epochs not known until {data} is prepared"
    else:
        low, high = f"{min(epochs):.3g}", f"{max(epochs):.3g}"
        read = f"each reads {low if low == high else f'{low} to {high}'} epochs of {data}"
    lines = [f"{len(runs)} runs, {done} complete, {len(runs) - done} to train; {read}"]
    warned = [(run.epochs, warning) for run in runs if (warning := planned_warning(run.planned))]
    if warned:
        lines.append(max(warned)[1].replace(
            "warning: this run", f"warning: {len(warned)} of {len(runs)} runs read their corpus "
            f"more than a few times; the longest", 1))
    return lines


def final_loss(run_dir: Path) -> Optional[float]:
    """The final validation loss a complete run logged (None when there is none)."""
    try:
        final = metrics.final_validation(metrics.records(run_dir / METRICS_FILE))
    except OSError:
        return None
    return None if final is None else final["val_loss"]


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [name for name in listed.split(",") if name.strip()]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


def run_all(runs: list[PlannedRun], root: Path, parallel: int, name: str) -> int:
    """Train the runs that are not complete, `parallel` at a time; 0 when all are complete."""
    todo = [run for run in runs if run.state["state"] != "complete"]
    if not todo:
        print(f"sweep {name}: all {len(runs)} runs are complete; nothing to train.")
        print(next_commands(root, name))
        return 0
    # One GPU per slot, when there are enough and each run is one process.
    one_process = all(run.processes == 1 for run in runs)
    gpus = visible_gpus() if parallel > 1 and one_process else []
    slots = list(range(parallel))
    (root / "logs").mkdir(exist_ok=True)
    counter = bar(len(runs), initial=len(runs) - len(todo), unit="run", desc=f"sweep {name}")
    running: dict[int, tuple[PlannedRun, subprocess.Popen, object]] = {}
    failed: list[tuple[PlannedRun, int]] = []
    queue = list(todo)
    stop: list[int] = []  # the signal that stops the sweep, once received

    def on_signal(signum, _frame) -> None:
        # Each run is in its own session (see start), so it hears only this one signal: it
        # saves a checkpoint and stops; no new run starts.
        if not stop:
            stop.append(signum)
            for _run, process, _log in running.values():
                process.send_signal(signum)

    # Installed explicitly: a sweep started in the background inherits SIGINT ignored.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while (queue and not stop) or running:
            while queue and len(running) < parallel and not stop:
                run, slot = queue.pop(0), slots.pop(0)
                running[slot] = (run, *start(run, root, gpus[slot] if len(gpus) >= parallel
                                                else None))
                if stop:  # the signal came while this run was starting
                    running[slot][1].send_signal(stop[0])
                counter.set_postfix_str(", ".join(r.point.name for r, _, _ in running.values()))
            time.sleep(0.2)
            collect_finished(running, slots, failed, root, counter)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    counter.close()
    return outcome(runs, failed, stop, root, name)


def collect_finished(running: dict, slots: list[int], failed: list[tuple[PlannedRun, int]],
                     root: Path, bar) -> None:
    """Free the slots of the runs that have exited, saying how each ended."""
    for slot, (run, process, log) in list(running.items()):
        code = process.poll()
        if code is None:
            continue
        log.close()
        del running[slot]
        slots.append(slot)
        state = run_state(run.run_dir, run.iterations)
        if state["state"] == "complete":
            bar.update(1)
            loss = final_loss(run.run_dir)
            bar.write(f"{run.point.name}: complete, final validation loss "
                      f"{loss:.4f}" if loss is not None else
                      f"{run.point.name}: complete")
        else:
            failed.append((run, code))
            bar.write(f"{run.point.name}: stopped with exit code {code} at step "
                      f"{state['step']} ({root / 'logs' / (run.point.name + '.log')})")
        bar.set_postfix_str(", ".join(r.point.name for r, _, _ in running.values()))


def outcome(runs: list[PlannedRun], failed: list[tuple[PlannedRun, int]], stop: list[int],
            root: Path, name: str) -> int:
    """The sweep's last words and exit code: stopped by a signal, runs not complete, or done."""
    if stop:
        why = "by Ctrl-C" if stop[0] == signal.SIGINT else f"by {signal.Signals(stop[0]).name}"
        print(f"sweep {name} stopped {why}; its runs saved where they were; run the same "
              "command again to resume it.", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE if stop[0] == signal.SIGINT else PREEMPTED_EXIT_CODE
    if failed:
        names = ", ".join(f"{run.point.name} (exit {code})" for run, code in failed)
        print(f"sweep {name}: {len(runs) - len(failed)} of {len(runs)} runs complete; not "
              f"complete: {names}; see {root / 'logs'} and run the same command again to resume.",
              file=sys.stderr)
        return 1
    print(f"sweep {name}: all {len(runs)} runs are complete ({root}).")
    print(next_commands(root, name))
    return 0


def next_commands(root: Path, name: str) -> str:
    """The last line of a complete sweep: its table of the best runs, and its LR figure."""
    import shlex

    try:
        shown = root.relative_to(Path.cwd())
    except ValueError:
        shown = root
    where = shlex.quote(str(shown))
    return (f"next: danastar results {where} --best  |  danastar plot lr-sweep {where} --out "
            f"{shlex.quote(name + '-lr-sweep')}")


def start(run: PlannedRun, root: Path, gpu: str | None):
    """Start `danastar train` for one run, its output appended to logs/<point>.log."""
    log = open(root / "logs" / f"{run.point.name}.log", "a")
    log.write(f"$ danastar train {' '.join(run.argv)}\n")
    log.flush()
    env = with_huge_pages(dict(os.environ))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    # Its own session: a terminal's Ctrl-C reaches the sweep alone, which passes it on once.
    process = subprocess.Popen([sys.executable, "-m", "danastar", "train", *run.argv],
                               stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    return process, log
