"""Study III: does the DANA family's lead survive a tuned AdamW warm-up, the paper's other
baselines, and a corpus that does not repeat?

    python studies/fair/study.py            # train what is missing, then the report
    python studies/fair/study.py run        # only train (resumes: run it again)
    python studies/fair/study.py report     # only rebuild tables, figures and summary.json
    python studies/fair/study.py status     # what is recorded and what can run now

Every run is Study II's (`studies/horizon/`): Enoki at 2 heads (1.25M parameters), 32 x 128
tokens a step, the cos_inf schedule, trained with `danastar sweep`; horizons are multiples of
the first study's budget (1x = 128 steps, 0.42 tokens per parameter); but in float32
(`train.autocast: off`, the CPU default), not under bf16 autocast. This study's machine (an
AVX2 CPU without bf16 instructions) multiplies bf16 matrices about 40 times slower than float32
ones, and Study II's ablation found that autocast off moves no optimizer's final loss by more
than its seed noise. So every run here is trained here, the paper's recipe on Shakespeare too.
Two recipes, side by side, on two corpora (`shakespeare`, the embedded one; `prose`, 12M+
tokens of public-domain prose that a 32x run reads about once):

* **the paper's**: warm-up T/50 for every optimizer, the LR tuned at each horizon (at the first
  horizon the first study's 5 LRs, 1/4 ... 4 x the scaling law's; later the previous horizon's
  best x 1/2, 1, 2; while the best sits at an edge, two more LRs beyond it, at most 3 times),
  3 seeds at the best (on `shakespeare`, Study II's grid and rule in float32).
* **each tuned**: at the paper's best LR, the warm-up chosen from T/50, T/10 and T/5 (while the
  best sits at an edge, the next of T/100, 0 below or 2T/5 above; then, while the loss still
  falls towards the ladder's other edge, the next there too); at that warm-up the LR
  re-checked at x 1/2, 1, 2 (widened as above); 3 seeds at the best pair.

AdamW, the baseline, also runs at 1/4 and 1/2 of each horizon's steps at its best pair (same
warm-up fraction; its loss against compute, for the within-horizon multiplier), and at twice the
steps where another optimizer's three-seed mean beats its own.

The grid was fixed before any of its results were seen, with one amendment, which only adds
runs: the warm-up's other edge (2026-11-28, after AdamW's prose 1x sweep fell towards both ends
and its 4x budget run at 2T/5 beat the 1x pick). Its order (`GROUPS`) puts the headline
first: Shakespeare 4x, then the fresh corpus's horizons, the paper's other baselines at 4x on
it, then the rest. The order changed once, adding and removing nothing (2026-11-28, while prose
32x's LR sweeps ran): plain AdEMAMix at prose 4x, under an hour of machine time, moved ahead of
32x's several machine-sessions, so that the paper's baselines are complete first.

A run whose configuration equals one already recorded is not trained again (the warm-up sweep's
T/50 point is the paper recipe's run at that LR, for instance).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import common  # noqa: E402  (studies/common.py)

ROOT = common.ROOT
SWEEPS = HERE / "sweeps" / "generated"
RECORDS = HERE / "records"

HEADS = 2
AUTOCAST = "off"
STEPS = {1: 128, 4: 512, 16: 2048, 32: 4096}  # horizon (x the first study's budget) -> steps
EVAL_INTERVAL = {1: 16, 4: 32, 16: 64, 32: 128}
CORPORA = {"sh": "shakespeare", "pr": "prose"}  # tag in task names -> data.dataset
BASELINE = "adamw"
MAIN = ("adamw", "adana", "dana-star-mk4")
FIRST_GRID = (0.25, 0.5, 1, 2, 4)  # x the law's LR, at an optimizer's first horizon
STEP_GRID = (0.5, 1, 2)  # x the previous horizon's best (the paper's), or x the tuned centre
MAX_WIDENINGS = 3
SEEDS = (0, 1, 2)
# Warm-up as a fraction of the steps (numerator, denominator), in order: the first three around
# the paper's T/50 are always run; the others only while the loss still falls towards them.
WARMUPS = ((0, 1), (1, 100), (1, 50), (1, 10), (1, 5), (2, 5))
FIRST_WARMUPS = (2, 3, 4)  # indices into WARMUPS: T/50, T/10, T/5
PAPER_WARMUP = 2

# The queue, fixed before any result: (corpus, horizons in chain order, optimizers) per group,
# lower groups first. A corpus's horizons for an optimizer are chained (each horizon's paper LR
# grid is centred on the previous one's best), so a later group may extend an earlier chain.
GROUPS = (
    ("sh", (1, 4), MAIN),  # 4x first: Study II's headline
    ("pr", (1, 4), MAIN),
    ("pr", (1, 4, 16), MAIN),
    ("pr", (4,), ("muon", "ademamix-decaying-wd")),
    ("sh", (1,), MAIN),
    ("pr", (4,), ("ademamix",)),  # before 32x since 2026-11-28 (order only: see the docstring)
    ("pr", (1, 4, 16, 32), MAIN),
    ("sh", (1, 4, 16), MAIN),
    ("pr", (4,), ("dana-mk4",)),
)
# Which (corpus, horizon) a group is about; its chain's earlier horizons are run only as far as
# the paper's LR centre needs them (their tuned recipe comes with the group that names them).
TUNED_AT = ((4,), (1, 4), (16,), (4,), (1,), (4,), (32,), (16,), (4,))


def warmup_steps(steps: int, index: int) -> int:
    numerator, denominator = WARMUPS[index]
    return steps * numerator // denominator


def warmup_label(index: int) -> str:
    numerator, denominator = WARMUPS[index]
    return "0" if numerator == 0 else f"{'' if numerator == 1 else numerator}T/{denominator}"


def rounded(value: float) -> float | int:
    """0.25 * 0.5 stays 0.125, not a float's tail; a whole multiplier is written as `lrx2`."""
    value = float(f"{value:.6g}")
    return int(value) if value.is_integer() else value


# ---- every recorded run, by what it trained -----------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Key:
    """What makes two of this study's runs the same run (everything else is the shared base)."""

    corpus: str
    steps: int
    optimizer: str
    multiplier: float
    warmup: int
    seed: int


_KEYS: dict[Path, Key | None] = {}  # complete runs do not change: read each once


def key_of(run: Path) -> Key | None:
    if run not in _KEYS:
        plan = json.loads((run / "plan.json").read_text())["plan"]
        config = yaml.load((run / "config.yaml").read_text(), Loader=yaml.CSafeLoader)
        corpus = {v: k for k, v in CORPORA.items()}.get(config["data"]["dataset"])
        point = json.loads((run / "sweep_point.json").read_text())
        other = plan["heads"] != HEADS or config["train"]["autocast"] != AUTOCAST
        _KEYS[run] = None if corpus is None or other else Key(
            corpus, plan["iterations"], plan["opt"], float(rounded(point["lr_multiplier"])),
            plan["warmup_steps"], plan["seed"])
    return _KEYS[run]


def index() -> dict[Key, tuple[str, Path]]:
    """Key -> (sweep name, record folder) of every complete run of this study."""
    found = {}
    if not RECORDS.is_dir():
        return found
    for sweep in sorted(RECORDS.iterdir()):
        for run in sorted(sweep.iterdir()):
            if (run / "status.json").is_file() and common.complete(run):
                key = key_of(run)
                if key is not None:
                    found.setdefault(key, (sweep.name, run))
    return found


# ---- the chains: which sweeps can be written now ----------------------------------------------

def base(corpus: str, horizon: int) -> dict:
    return {"preset": "cpu_shakespeare", "data.dataset": CORPORA[corpus],
            "model.heads": HEADS, "train.batch_size": 32, "train.iterations": STEPS[horizon],
            "train.eval_interval": EVAL_INTERVAL[horizon], "train.final_eval_batches": None,
            "train.sample_tokens": 0, "train.autocast": AUTOCAST}


@dataclasses.dataclass
class Planner:
    """Walks every chain over the recorded runs (`known`), collecting the sweeps still needed."""

    known: dict[Key, tuple[str, Path]]
    tasks: dict[str, common.Task] = dataclasses.field(default_factory=dict)
    # (corpus, horizon, optimizer, recipe) -> (LR multiplier, warm-up index), once its 3 seeds
    # are recorded: what the report compares
    chosen: dict[tuple[str, int, str, str], tuple[float, int]] = dataclasses.field(
        default_factory=dict)

    def loss(self, key: Key) -> float | None:
        found = self.known.get(key)
        return None if found is None else common.final_loss(found[1])

    def need(self, name: str, corpus: str, horizon: int, runs: list[Key], priority: tuple,
             comment: str, steps: int | None = None) -> bool:
        """Adds the sweep `name` for those of `runs` recorded nowhere else (each a grid of one
        optimizer; the runs share steps); True when all of `runs` are recorded."""
        missing = [k for k in runs if k not in self.known or self.known[k][0] == name]
        if not missing:
            return True
        settings = base(corpus, horizon)
        if steps is not None:
            settings["train.iterations"] = steps
        grid = {"optim.name": [missing[0].optimizer],
                "lr_multiplier": sorted({rounded(k.multiplier) for k in missing}),
                "train.seed": sorted({k.seed for k in missing})}
        if any(k.warmup != warmup_steps(k.steps, PAPER_WARMUP) for k in missing):
            grid = {"optim.name": grid.pop("optim.name"),
                    "optim.warmup_steps": sorted({k.warmup for k in missing}), **grid}
        task = common.Task(name, settings, grid, priority, comment)
        if name not in self.tasks or priority < self.tasks[name].priority:
            self.tasks[name] = task
        return all(k in self.known for k in runs)

    def named(self, name: str, same, suffix: str) -> str:
        """`name`, or `name + suffix` where a sweep of that name (or one of its widenings) has
        recorded runs that `same` rejects: the records moved a choice after that sweep ran (the
        warm-up's far side can), and what it recorded keeps its name and file."""
        taken = any(not same(k) and (sweep == name or sweep.startswith(f"{name}-widen"))
                    for k, (sweep, _) in self.known.items())
        return f"{name}{suffix}" if taken else name

    def settle(self, name: str, corpus: str, horizon: int, losses, first: list, next_beyond,
               make_key, priority: tuple, what: str):
        """The best of a one-dimensional sweep (LR multipliers or warm-up indices) at seed 0,
        widened while its best sits at an edge; None until its runs are recorded.

        Each step reads only the points of the widenings so far: a point recorded past them (the
        far run of a widening whose near run is still training, or a run of another sweep) must
        not make an edge look interior, or the choice would depend on which run ended first."""
        points, swept = list(first), set(first)
        for widening in range(MAX_WIDENINGS + 1):
            label = name if widening == 0 else f"{name}-widen{widening}"
            if not self.need(label, corpus, horizon, [make_key(p) for p in points],
                             (*priority, widening), f"{what} (seed 0)."):
                return None
            found = {p: loss for p, loss in losses().items() if p in swept}
            beyond = next_beyond(found)
            if not beyond or widening == MAX_WIDENINGS:
                return min(found, key=found.get)
            points = beyond
            swept.update(beyond)
        return None

    # -- the paper's recipe --

    def paper_best(self, corpus: str, chain: tuple, optimizer: str, priority: tuple
                   ) -> dict[int, float]:
        """Horizon -> the paper recipe's best LR multiplier, as far along `chain` as recorded."""
        bests, centre = {}, None
        for horizon in chain:
            steps = STEPS[horizon]
            grid = FIRST_GRID if centre is None else [rounded(centre * m) for m in STEP_GRID]

            def key(multiplier, seed=0, steps=steps):
                return Key(corpus, steps, optimizer, float(rounded(multiplier)),
                           warmup_steps(steps, PAPER_WARMUP), seed)

            def losses(steps=steps):
                return {k.multiplier: self.loss(k) for k in self.known
                        if (k.corpus, k.steps, k.optimizer, k.warmup, k.seed)
                        == (corpus, steps, optimizer, warmup_steps(steps, PAPER_WARMUP), 0)}

            best = self.settle(f"{corpus}-x{horizon}-{optimizer}-lr", corpus, horizon, losses,
                               [float(rounded(m)) for m in grid], lr_beyond, key,
                               (*priority, 0, horizon),
                               f"{optimizer} at {horizon}x on {CORPORA[corpus]}, warm-up T/50: "
                               f"the LR sweep")
            if best is None:
                break
            bests[horizon] = centre = best
        return bests

    def seeds_at(self, name: str, corpus: str, horizon: int, optimizer: str, multiplier: float,
                 warmup: int, priority: tuple, comment: str, steps: int | None = None) -> bool:
        """3 seeds at one pair (LR multiplier, warm-up steps), at the horizon's steps unless
        `steps`; True once recorded. Named for its pair where `name` recorded another."""
        keys = [Key(corpus, steps or STEPS[horizon], optimizer, multiplier, warmup, s)
                for s in SEEDS]
        name = self.named(name, lambda k: (k.multiplier, k.warmup) == (multiplier, warmup),
                          f"-warmup{warmup}-lrx{multiplier:g}")
        return self.need(name, corpus, horizon, keys, priority, comment, steps=steps)

    # -- each tuned --

    def tuned(self, corpus: str, horizon: int, optimizer: str, centre: float, priority: tuple
              ) -> tuple[float, int] | None:
        """(LR multiplier, warm-up index into `WARMUPS`) of the tuned recipe, once settled."""
        steps = STEPS[horizon]
        where = f"{optimizer} at {horizon}x on {CORPORA[corpus]}"

        def warmup_key(index, seed=0):
            return Key(corpus, steps, optimizer, centre, warmup_steps(steps, index), seed)

        def warmup_losses():
            return {i: self.loss(warmup_key(i)) for i in range(len(WARMUPS))
                    if warmup_key(i) in self.known}

        best_index = self.settle(f"{corpus}-x{horizon}-{optimizer}-warmup", corpus, horizon,
                                 warmup_losses, list(FIRST_WARMUPS), warmup_beyond, warmup_key,
                                 (*priority, 1, horizon),
                                 f"{where}, at the paper recipe's best LR ({centre:g} x the "
                                 f"law's): the warm-up sweep")
        if best_index is None:
            return None
        warmup = warmup_steps(steps, best_index)

        def lr_key(multiplier, seed=0):
            return Key(corpus, steps, optimizer, float(rounded(multiplier)), warmup, seed)

        def lr_losses():
            return {k.multiplier: self.loss(k) for k in self.known
                    if (k.corpus, k.steps, k.optimizer, k.warmup, k.seed)
                    == (corpus, steps, optimizer, warmup, 0)}

        name = self.named(f"{corpus}-x{horizon}-{optimizer}-lr-at-warmup",
                          lambda k: k.warmup == warmup, str(warmup))
        best = self.settle(name, corpus, horizon,
                           lr_losses, [float(rounded(centre * m)) for m in STEP_GRID],
                           lr_beyond, lr_key, (*priority, 2, horizon),
                           f"{where}, at warm-up {warmup_label(best_index)} ({warmup} steps): "
                           f"the LR re-checked")
        return None if best is None else (best, best_index)

    # -- the baseline's curve --

    def budgets(self, recipe: str, corpus: str, horizon: int, multiplier: float, warmup: int,
                priority: tuple) -> None:
        """AdamW at 1/4 and 1/2 of the steps at its best pair (the same warm-up fraction)."""
        steps = STEPS[horizon]
        for share in (4, 2):
            short = steps // share
            self.seeds_at(f"{corpus}-x{horizon}-{BASELINE}-{recipe}-steps{short}", corpus,
                          horizon, BASELINE, multiplier, warmup_steps(short, warmup),
                          (*priority, 4, horizon),
                          f"{BASELINE} at {horizon}x on {CORPORA[corpus]}, {recipe} recipe, at 1/"
                          f"{share} of the steps: 3 seeds.", steps=short)

    def longer(self, recipe: str, corpus: str, horizon: int, pairs: dict, priority: tuple
               ) -> None:
        """AdamW at twice the steps where another optimizer's three-seed mean beats its own."""
        steps = STEPS[horizon]

        def mean(optimizer):
            multiplier, warmup = pairs[optimizer]
            losses = [self.loss(Key(corpus, steps, optimizer, multiplier,
                                    warmup_steps(steps, warmup), s))
                      for s in SEEDS]
            return None if None in losses else sum(losses) / len(losses)

        own = mean(BASELINE) if BASELINE in pairs else None
        if own is None:
            return
        beaten = [o for o in pairs if o != BASELINE and (m := mean(o)) is not None and m < own]
        if beaten:
            multiplier, warmup = pairs[BASELINE]
            self.seeds_at(f"{corpus}-x{horizon}-{BASELINE}-{recipe}-steps{2 * steps}", corpus,
                          horizon, BASELINE, multiplier, warmup_steps(2 * steps, warmup),
                          (*priority, 5, horizon),
                          f"{BASELINE} at {horizon}x on {CORPORA[corpus]}, {recipe} recipe, at "
                          f"twice the steps: {', '.join(beaten)} beat its three-seed mean.",
                          steps=2 * steps)


def lr_beyond(losses: dict[float, float]) -> list[float]:
    beyond = common.beyond_edge(losses)
    return [] if beyond is None else [float(rounded(m)) for m in beyond]


def warmup_beyond(losses: dict[int, float]) -> list[int]:
    """The next warm-up past each edge of a sweep (indices into `WARMUPS`, a contiguous run of
    them) whose loss is below its inner neighbour's: the loss still falls that way. The best at
    an edge is one such edge; the other (the grid's one amendment) because a warm-up's loss need
    not have one minimum: AdamW's at prose 1x falls towards both no warm-up and 2T/5."""
    low, high = min(losses), max(losses)
    beyond = []
    if low > 0 and losses[low] < losses[low + 1]:
        beyond.append(low - 1)
    if high + 1 < len(WARMUPS) and losses[high] < losses[high - 1]:
        beyond.append(high + 1)
    return beyond


def plan() -> list[common.Task]:
    """Every sweep the records allow to be written now, done or not, in queue order."""
    return sorted(walk().tasks.values(), key=lambda t: t.priority)


def walk() -> Planner:
    """Every chain of `GROUPS` followed as far as the records go."""
    planner = Planner(index())
    for group, ((corpus, chain, optimizers), tuned_at) in enumerate(zip(GROUPS, TUNED_AT)):
        if corpus == "pr" and not prose_available():
            continue
        pairs: dict[int, dict[str, dict[str, tuple[float, int]]]] = {}
        for rank, optimizer in enumerate(optimizers):
            follow(planner, corpus, chain, tuned_at, optimizer, (group, rank), pairs)
        for horizon, recipes in pairs.items():
            for recipe, chosen in recipes.items():
                planner.longer(recipe, corpus, horizon, chosen, (group, 0))
                for optimizer, pair in chosen.items():
                    planner.chosen[(corpus, horizon, optimizer, recipe)] = pair
    return planner


def follow(planner: Planner, corpus: str, chain: tuple, tuned_at: tuple, optimizer: str,
           priority: tuple, pairs: dict) -> None:
    """One optimizer's chain in one group: the paper's LRs along `chain`, then at each horizon
    of `tuned_at` both recipes' seeds (and AdamW's shorter budgets); the settled pairs go into
    `pairs[horizon][recipe][optimizer]`."""
    bests = planner.paper_best(corpus, chain, optimizer, priority)
    for horizon in tuned_at:
        if horizon not in bests:
            continue
        centre = bests[horizon]
        steps = STEPS[horizon]
        recipes = pairs.setdefault(horizon, {"paper": {}, "tuned": {}})
        what = f"{optimizer} at {horizon}x on {CORPORA[corpus]}"
        if planner.seeds_at(f"{corpus}-x{horizon}-{optimizer}-seeds", corpus, horizon,
                            optimizer, centre, warmup_steps(steps, PAPER_WARMUP),
                            (*priority, 0, horizon, 9),
                            f"{what}, paper recipe, best LR {centre:g} x the law's: 3 seeds."):
            recipes["paper"][optimizer] = (centre, PAPER_WARMUP)
        tuned = planner.tuned(corpus, horizon, optimizer, centre, priority)
        if tuned is None:
            continue
        multiplier, warmup = tuned
        if planner.seeds_at(f"{corpus}-x{horizon}-{optimizer}-tuned-seeds", corpus, horizon,
                            optimizer, multiplier, warmup_steps(steps, warmup),
                            (*priority, 3, horizon),
                            f"{what}, tuned recipe ({multiplier:g} x the law's LR, warm-up "
                            f"{warmup_label(warmup)}): 3 seeds."):
            recipes["tuned"][optimizer] = tuned
        if optimizer == BASELINE:
            planner.budgets("tuned", corpus, horizon, multiplier, warmup, priority)
            planner.budgets("paper", corpus, horizon, centre, PAPER_WARMUP, priority)


# ---- the fresh corpus -------------------------------------------------------------------------

def prose_available() -> bool:
    """Whether this checkout's danastar has the `prose` source (the study's second corpus)."""
    from danastar.data.sources import SOURCES

    return "prose" in SOURCES


def prepare_prose() -> None:
    """Prepares the fresh corpus once before its runs start (two runs preparing it side by side
    would each tokenise it)."""
    from danastar.data.prepare import default_data_dir, is_prepared

    if prose_available() and not is_prepared(default_data_dir("prose")):
        subprocess.run([sys.executable, "-m", "danastar", "prepare", "prose"], check=True)


SCHEDULER = common.Scheduler(RECORDS, SWEEPS, plan)


def main() -> None:
    def report() -> None:
        from report import report as rebuild  # noqa: PLC0415 (beside this file)

        rebuild()

    common.scheduled_main(__doc__.split("\n\n")[0], SCHEDULER, report, before_run=prepare_prose)


if __name__ == "__main__":
    main()
