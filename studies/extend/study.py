"""The price of extending a run: a run planned for T steps and then continued to 2T or 4T by each
of `danastar train --extend`'s rules, against the same optimizer planned that long from the start.

    python studies/extend/study.py            # train what is missing, then the report
    python studies/extend/study.py run        # only train (resumes: run it again)
    python studies/extend/study.py report     # only rebuild the table, figure and summary.json
    python studies/extend/study.py status     # what is recorded and what is left

Every run is Study III's on Shakespeare (`studies/fair/`): Enoki at 2 heads, 32 x 128 tokens a
step, cos_inf with the paper's warm-up (T/50), float32, each optimizer at the LR tuned for it at
both T = 128 and 4T = 512 steps (a quarter of the scaling law's for AdamW and ADana, Study III;
Dana-Star-MK4's best of Study II, the same at both). For each optimizer and seed:

* **base**: planned for T = 128 steps, trained to its end;
* **extended**: a copy of the base continued by `--iterations T2 --extend RULE
  [--extend_decay DECAY]` to T2 = 256 and 512, for the LR rules `stretch` and `rewarm` (with
  the decay kept) and, with the LR rewarmed (at the floor LR of a stretched finished run the
  decay matters least), the other decay rules: for the DANA optimizers `reanchor` and
  `planned`, for AdamW `planned` (its coupled λ·T1/T2; it has no time scale to re-anchor). On a
  finished run `reanchor` is `stretch`: both continue at the floor factor the run ended on (one
  run, AdamW's seed 0 to 512 steps, is recorded to show it: bitwise the same losses); at 512
  also `rewarm` climbing over 10 steps (`--extend_rewarm 10`, the warm-up of a run planned for
  512) instead of the run's own 2;
* **planned**: the same optimizer planned for T2 from the start. Where Study III has recorded
  one (AdamW and ADana at 512 steps, AdamW at 256: the same settings; they evaluate every 32
  steps, which does not change a run's training), it is read from there; the others are trained
  here.

The queue puts the 4T headline of every seed first (the LR rules with the decay kept, against
the planned runs), then the 4T decay rules, then the same at 2T, so a partial study already
answers the main question with three seeds. A run that is complete is not trained again; an
unfinished one resumes.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import common  # noqa: E402  (studies/common.py, which puts src/ on the path too)

from danastar.launch.sweep_spec import run_state  # noqa: E402

ROOT = common.ROOT
RECORDS = HERE / "records"
FAIR_RECORDS = ROOT / "studies" / "fair" / "records"

T1 = 128
EXTENDED_TO = (512, 256)  # 4T first: the headline
SEEDS = (0, 1, 2)
LR = {  # the LR tuned at both T and 4T (see the docstring)
    "adamw": 0.005763831807193781,
    "adana": 0.002234137512916017,
    "dana-star-mk4": 0.0025307231651477843,
}
OPTIMIZERS = tuple(LR)
SCHEDULE_RULES = ("stretch", "rewarm")  # reanchor: stretch's twin on a finished run (above)
# beside `keep`: a log-time decay's two other rules; AdamW's coupled λ has no time scale to
# re-anchor, so only the planned run's λ·T1/T2
DECAY_RULES = {"adamw": ("planned",), "adana": ("reanchor", "planned"),
               "dana-star-mk4": ("reanchor", "planned")}
DECAY_WITH = "rewarm"  # the LR rule the decay rules run with
# `rewarm` climbs back to the peak over the run's own warm-up (2 steps at T = 128) unless
# --extend_rewarm says otherwise; also measured: over the warm-up of a run planned for T2
# (T2/50: 10 steps at 4T), added to the grid at 4T after seed 0 showed ADana's loss rising for
# some 30 steps after the 2-step climb, and at 2T (5 steps) before any result of it was seen,
# so that a default drawn from it rests on both lengths


def longer_rewarm(steps: int) -> int:
    """The longer climb measured for an extension to `steps`: a planned run's warm-up."""
    return steps // 50
# Study III's runs of the same settings: (optimizer, steps) -> the record folders that hold them
# (seed 0 of 4x sits in its LR sweep, the other seeds in its seeds sweep)
FAIR_PLANNED = {("adamw", 512): ("sh-x4-adamw-lr", "sh-x4-adamw-seeds"),
                ("adana", 512): ("sh-x4-adana-lr", "sh-x4-adana-seeds"),
                ("adamw", 256): ("sh-x4-adamw-paper-steps256",)}

BASE = ["--config", "cpu_shakespeare", "data.dataset=shakespeare", "model.heads=2",
        "train.batch_size=32", "train.eval_interval=16", "train.final_eval_batches=null",
        "train.sample_tokens=0", "train.autocast=off", "logging.progress=false"]


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of the study: `kind` base, extended or planned; `steps` its (final) total."""

    kind: str
    optimizer: str
    seed: int
    steps: int
    rule: str = ""  # the LR rule of an extension
    decay: str = ""  # its decay rule
    rewarm: int | None = None  # rewarm's steps back to the peak (None: the run's warm-up)

    @property
    def name(self) -> str:
        if self.kind == "extended":
            return (f"{self.optimizer}-T{T1}to{self.steps}-{self.rule}{self.rewarm or ''}-"
                    f"{self.decay}-s{self.seed}")
        return f"{self.optimizer}-{self.kind}{self.steps}-s{self.seed}"

    def arguments(self) -> list[str]:
        args = [*BASE, f"optim.name={self.optimizer}", f"optim.lr={LR[self.optimizer]}",
                f"train.seed={self.seed}", f"train.iterations={self.steps}"]
        if self.kind == "extended":
            args += [f"optim.extend={self.rule}", f"optim.extend_decay={self.decay}"]
            if self.rewarm:
                args.append(f"optim.extend_rewarm={self.rewarm}")
        return args


def base_of(run: Run) -> Run:
    return Run("base", run.optimizer, run.seed, T1)


def fair_record(optimizer: str, steps: int, seed: int) -> Path | None:
    """Study III's record of a planned run with these settings, where it has one."""
    for folder in FAIR_PLANNED.get((optimizer, steps), ()):
        path = FAIR_RECORDS / folder / f"{optimizer}-lrx0.25-s{seed}"
        if path.is_dir() and common.complete(path):
            return path
    return None


def queue() -> list[Run]:
    """Every run the study trains, in order: the 4T headline for every seed first (the bases,
    the LR rules with the decay kept, and the planned runs Study III has not recorded), then
    the 4T decay rules for every seed, then the same two stages at 2T, and last the longer
    rewarm at 4T, then at 2T."""
    runs = [Run("base", o, seed, T1) for seed in SEEDS for o in OPTIMIZERS]
    for steps in EXTENDED_TO:
        for seed in SEEDS:
            runs += [Run("extended", o, seed, steps, rule, "keep")
                     for o in OPTIMIZERS for rule in SCHEDULE_RULES]
            runs += [Run("planned", o, seed, steps) for o in OPTIMIZERS
                     if fair_record(o, steps, seed) is None]
        runs += [Run("extended", o, seed, steps, DECAY_WITH, decay)
                 for seed in SEEDS for o in OPTIMIZERS for decay in DECAY_RULES[o]]
    runs += [Run("extended", o, seed, steps, "rewarm", "keep", longer_rewarm(steps))
             for steps in EXTENDED_TO for seed in SEEDS for o in OPTIMIZERS]
    return runs


def finished(path: Path, run: Run) -> bool:
    """Complete at the run's own total (a fresh copy of a base is complete at T1, not yet at
    the extension's T2)."""
    return path.is_dir() and run_state(path, run.steps)["state"] == "complete"


def recorded(run: Run) -> bool:
    return finished(RECORDS / run.name, run)


def prepare(run: Run, runs: Path) -> bool:
    """The run's directory made ready to train; False while its base is not complete yet. An
    extension starts from a copy of its base's whole directory (checkpoints included), copied
    under another name first so that an interrupted copy is never taken for a run."""
    target = runs / run.name
    if run.kind != "extended" or target.is_dir():
        return True
    base = runs / base_of(run).name
    if not finished(base, base_of(run)):
        return False
    partial = runs / f".copying-{run.name}"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(base, partial, ignore=shutil.ignore_patterns(".lock"))
    partial.rename(target)
    return True


def start(run: Run, runs: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "danastar", "train", *run.arguments(),
               "--run_dir", str(runs / run.name)]
    log = runs / "study-logs" / f"{run.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"{time.strftime('%H:%M:%S')} start  {run.name}", flush=True)
    with log.open("a") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def train(runs: Path, parallel: int) -> None:
    """Trains what is not recorded, `parallel` at a time, in the queue's order; an extension
    waits for its base. A base whose directory is gone (a fresh clone) is trained again: its
    record stays, and a retrained run is bitwise the recorded one."""
    runs = runs.resolve()
    needed = {base_of(r) for r in queue() if r.kind == "extended" and not recorded(r)}

    def to_train(run: Run) -> bool:
        return not recorded(run) or (run in needed and not finished(runs / run.name, run))

    left = [r for r in queue() if to_train(r)]
    running: dict[Run, subprocess.Popen] = {}
    failed: list[Run] = []
    while left or running:
        for run, process in list(running.items()):
            if process.poll() is None:
                continue
            del running[run]
            if finished(runs / run.name, run):
                common.copy_run_files(runs / run.name, RECORDS / run.name)
                print(f"{time.strftime('%H:%M:%S')} done   {run.name}", flush=True)
            else:
                failed.append(run)
                print(f"study: {run.name} ended (exit {process.returncode}) unfinished; see "
                      f"{runs / 'study-logs' / run.name}.log", file=sys.stderr, flush=True)
        for run in list(left):
            if len(running) >= parallel:
                break
            if base_of(run) in failed:
                left.remove(run)
            elif prepare(run, runs):
                left.remove(run)
                running[run] = start(run, runs)
        if not running and left:  # every run left waits on a base that failed
            break
        time.sleep(5)
    missing = [r.name for r in queue() if not recorded(r)]
    print("study: every run is recorded." if not missing else
          f"study: {len(missing)} runs are not recorded; run the study again.", flush=True)


def status() -> None:
    for seed in SEEDS:
        runs = [r for r in queue() if r.seed == seed]
        done = [r for r in runs if recorded(r)]
        print(f"seed {seed}: {len(done)}/{len(runs)} runs recorded")


def main() -> None:
    parser = common.driver_parser(__doc__.splitlines()[0], ("all", "run", "report", "status"),
                                  "runs at a time (default 2, one thread each)")
    args = parser.parse_args()
    common.set_run_environment()
    if args.what == "status":
        status()
    if args.what in ("all", "run"):
        train(args.runs, args.parallel)
    if args.what in ("all", "report"):
        from report import report  # noqa: PLC0415 (beside this file; it imports this one)

        report()


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
