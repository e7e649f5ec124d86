"""The price of extending a run: the table, the figure and summary.json, rebuilt from the
committed records alone (this study's, and Study III's planned runs that it reads).

    python studies/extend/report.py    # docs/study-extend/*, studies/extend/summary.json

For each optimizer, seed and length T2 (2T and 4T, T = 128 steps), the final validation loss
(the whole validation set) of each extension rule against the run planned for T2, paired by
seed; and what the extension is worth in compute: the steps AdamW needs to reach the extended
run's loss over the steps it needs to reach the planned run's, both read off AdamW's planned
runs of the same seed (128, 256, 512 and 1024 steps, log-log interpolation as Study II reads
its multipliers). 100% is as good as planning T2 from the start.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/common.py, which puts src/ on the path too
sys.path.insert(0, str(HERE))

from common import ROOT, figure_writer, final_loss, pm  # noqa: E402
from matplotlib import rcParams  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from study import (  # noqa: E402
    DECAY_RULES,
    DECAY_WITH,
    EXTENDED_TO,
    FAIR_RECORDS,
    OPTIMIZERS,
    RECORDS,
    SCHEDULE_RULES,
    SEEDS,
    T1,
    Run,
    fair_record,
    longer_rewarm,
    recorded,
)

from danastar.analysis import multiplier, seeds  # noqa: E402
from danastar.config import load_config, schedule_options  # noqa: E402
from danastar.errors import UserError  # noqa: E402
from danastar.hparams import (  # noqa: E402
    decay_multiplier,
    extended_coupled_weight_decay,
    extended_weight_decay,
)
from danastar.optim import get_schedule  # noqa: E402
from danastar.train.optimizer import extended_run_schedule  # noqa: E402

OUT = ROOT / "docs" / "study-extend"
SUMMARY = HERE / "summary.json"
BASELINE = "adamw"
LONGER = "sh-x4-adamw-paper-steps1024/adamw-lrx0.25-s{seed}"  # AdamW's curve past 4T
TWIN = ("reanchor", "keep", None)  # stretch's twin on a finished run: shown where recorded
NAMES = {"adamw": "AdamW", "adana": "ADana", "dana-star-mk4": "Dana-Star-MK4"}
# AdamW planned for T2 with its tuned warm-up, T2/5 (Study III: tuned at 4T, where the paper's
# T/50 handicaps it by about 0.1, and run with the same fraction at 2T): at 4T seed 0 sits in
# the warm-up sweep and the others in the seeds sweep, at 2T in its steps sweep
TUNED_ADAMW = {512: ("sh-x4-adamw-warmup", "sh-x4-adamw-tuned-seeds"),
               256: ("sh-x4-adamw-tuned-steps256",)}
TUNED_ADAMW_RUN = "adamw-warmup_steps{warmup}-lrx0.25-s{seed}"


def conditions(optimizer: str, steps: int) -> list[tuple[str, str, int | None]]:
    """(LR rule, decay rule, rewarm's steps or None) of every extension of this optimizer to
    `steps`, in the tables' order."""
    found = ([(rule, "keep", None) for rule in SCHEDULE_RULES]
             + [(DECAY_WITH, decay, None) for decay in DECAY_RULES[optimizer]])
    return [*found, ("rewarm", "keep", longer_rewarm(steps))]


def condition_name(rule: str, decay: str, rewarm: int | None, code: str = "`") -> str:
    """A condition as the tables (code="`") and the figure's legends (code="") name it."""
    climb = f" over {rewarm} steps" if rewarm else ""
    return f"{code}{rule}{code}{climb}, decay {code}{decay}{code}"


def record(run: Run) -> Path | None:
    """Where a run's record is: this study's, or Study III's for a planned run it holds."""
    if recorded(run):
        return RECORDS / run.name
    return fair_record(run.optimizer, run.steps, run.seed) if run.kind == "planned" else None


def loss(run: Run) -> float | None:
    path = record(run)
    return None if path is None else final_loss(path)


def planned(optimizer: str, steps: int, seed: int) -> Run:
    return Run("base" if steps == T1 else "planned", optimizer, seed, steps)


def adamw_curve(seed: int) -> list[tuple[float, float]]:
    """AdamW's (steps, final loss) for one seed, from its runs planned for each length."""
    points = [(steps, loss(planned(BASELINE, steps, seed))) for steps in (T1, *EXTENDED_TO)]
    longer = FAIR_RECORDS / LONGER.format(seed=seed)
    if longer.is_dir():
        points.append((2 * max(EXTENDED_TO), final_loss(longer)))
    return sorted((s, v) for s, v in points if v is not None)


def worth(extended: float, target: float, curve: list[tuple[float, float]]
          ) -> tuple[float, bool] | None:
    """AdamW's compute to reach `extended` over its compute to reach `target` (the planned
    run's loss), and whether either was read outside AdamW's curve."""
    if len(curve) < 2:
        return None
    ext, plan = multiplier.measured_multipliers(curve, [(1.0, extended), (1.0, target)])
    outside = ext.kind != multiplier.INTERPOLATED or plan.kind != multiplier.INTERPOLATED
    return ext.baseline_compute / plan.baseline_compute, outside


# ---- the table ----------------------------------------------------------------------------------

def row(optimizer: str, steps: int, rule: str, decay: str, rewarm: int | None) -> dict | None:
    """One extension against the planned run, over the seeds that have both."""
    pairs = []
    for seed in SEEDS:
        ext = loss(Run("extended", optimizer, seed, steps, rule, decay, rewarm))
        target = loss(planned(optimizer, steps, seed))
        if ext is not None and target is not None:
            pairs.append((seed, ext, target))
    if not pairs:
        return None
    gaps = [e - t for _, e, t in pairs]
    worths = [w for w in (worth(e, t, adamw_curve(s)) for s, e, t in pairs) if w is not None]
    found = {"optimizer": optimizer, "from_steps": T1, "steps": steps, "lr_rule": rule,
             "decay_rule": decay, "rewarm_steps": rewarm, "seeds": len(pairs),
             "loss": seeds.mean_se([e for _, e, _ in pairs]),
             "gap": seeds.mean_se(gaps),
             "worth": seeds.mean_se([w for w, _ in worths]) if worths else None,
             "worth_outside": any(o for _, o in worths)}
    return found


def tuned_adamw(steps: int, seed: int) -> float | None:
    """AdamW's final loss planned for `steps` with its tuned warm-up, where Study III has it."""
    for folder in TUNED_ADAMW[steps]:
        path = FAIR_RECORDS / folder / TUNED_ADAMW_RUN.format(warmup=steps // 5, seed=seed)
        if path.is_dir():
            return final_loss(path)
    return None


def tuned_table(steps: int) -> tuple[list[str], list[dict]]:
    """AdamW's extensions to `steps` against AdamW planned for them with its tuned warm-up."""
    values = [v for v in (tuned_adamw(steps, s) for s in SEEDS) if v is not None]
    if not values:
        return [], []
    lines = ["| run | seeds | final loss | − tuned planned (paired) |", "|---|---|---|---|",
             f"| planned for {steps}, warm-up {steps // 5} (T/5, tuned; Study III) | "
             f"{len(values)} | {pm(seeds.mean_se(values))} | |"]
    rows = []
    for condition in conditions(BASELINE, steps):
        pairs = [(e, t) for e, t in ((loss(Run("extended", BASELINE, s, steps, *condition)),
                                      tuned_adamw(steps, s)) for s in SEEDS)
                 if e is not None and t is not None]
        if not pairs:
            continue
        gap = seeds.mean_se([e - t for e, t in pairs])
        lines.append(f"| {condition_name(*condition)} | {len(pairs)} | "
                     f"{pm(seeds.mean_se([e for e, _ in pairs]))} | {gap.mean:+.4f}{se_of(gap)} |")
        rule, decay, rewarm = condition
        rows.append({"optimizer": BASELINE, "from_steps": T1, "steps": steps, "lr_rule": rule,
                     "decay_rule": decay, "rewarm_steps": rewarm, "seeds": len(pairs),
                     "against": "planned, warm-up tuned (T/5)", "gap": round(gap.mean, 6),
                     "gap_se": None if math.isnan(gap.se) else round(gap.se, 6)})
    return lines, rows


def climb_table() -> tuple[list[str], list[dict]]:
    """`rewarm` over a planned run's warm-up (T2/50) against over the run's own (2 steps),
    both with the decay kept, paired by seed: what the climb's length changes."""
    lines = ["| optimizer | extended to | seeds | over T2/50 − over the run's own warm-up "
             "(paired) |", "|---|---|---|---|"]
    rows = []
    for steps in EXTENDED_TO:
        for optimizer in OPTIMIZERS:
            pairs = [(longer, own) for longer, own in (
                (loss(Run("extended", optimizer, seed, steps, "rewarm", "keep",
                          longer_rewarm(steps))),
                 loss(Run("extended", optimizer, seed, steps, "rewarm", "keep")))
                for seed in SEEDS) if longer is not None and own is not None]
            if not pairs:
                continue
            gap = seeds.mean_se([longer - own for longer, own in pairs])
            lines.append(f"| {NAMES[optimizer]} | {steps} (over {longer_rewarm(steps)} steps) | "
                         f"{len(pairs)} | {gap.mean:+.4f}{se_of(gap)} |")
            rows.append({"optimizer": optimizer, "from_steps": T1, "steps": steps,
                         "lr_rule": "rewarm", "decay_rule": "keep",
                         "rewarm_steps": longer_rewarm(steps), "seeds": len(pairs),
                         "against": "rewarm over the run's own warm-up",
                         "gap": round(gap.mean, 6),
                         "gap_se": None if math.isnan(gap.se) else round(gap.se, 6)})
    return (lines if rows else []), rows


def planned_row(optimizer: str, steps: int) -> seeds.MeanSE | None:
    values = [v for v in (loss(planned(optimizer, steps, s)) for s in SEEDS) if v is not None]
    return seeds.mean_se(values) if values else None


def se_of(value: seeds.MeanSE | None) -> str:
    return "" if value is None or value.n < 2 else f" ± {value.se:.4f}"


def percent(value: seeds.MeanSE | None) -> str:
    if value is None:
        return "–"
    # an error under half a percent keeps a decimal, rather than reading "± 0%"
    if value.n < 2:
        return f"{value.mean:.0%}"
    return f"{value.mean:.0%} ± {value.se:.1%}" if value.se < 0.005 else \
        f"{value.mean:.0%} ± {value.se:.0%}"


def table(steps: int) -> tuple[list[str], list[dict]]:
    lines = ["| optimizer | run | seeds | final loss | − planned (paired) | worth in AdamW's "
             "compute |", "|---|---|---|---|---|---|"]
    rows = []
    for optimizer in OPTIMIZERS:
        name = NAMES[optimizer]
        for label, length in ((f"planned for {steps}", steps), (f"planned for {T1} (the base)",
                                                                   T1)):
            found = planned_row(optimizer, length)
            if found is not None:
                lines.append(f"| {name} | {label} | {found.n} | {pm(found)} | | |")
        for condition in conditions(optimizer, steps) + [TWIN]:
            found = row(optimizer, steps, *condition)
            if found is None and condition == TWIN:
                continue
            if found is None:
                lines.append(f"| {name} | {condition_name(*condition)} | 0 | – | – | – |")
                continue
            worth_text = percent(found["worth"]) + (
                " (extrapolated)" if found["worth_outside"] else "")
            lines.append(f"| {name} | {condition_name(*condition)} | {found['seeds']} | "
                         f"{pm(found['loss'])} | {found['gap'].mean:+.4f}"
                         f"{se_of(found['gap'])} | {worth_text} |")
            rows.append(summary(found))
    return lines, rows


def summary(found: dict) -> dict:
    def plain(value: seeds.MeanSE | None, key: str) -> dict:
        if value is None:
            return {key: None, f"{key}_se": None}
        se = None if math.isnan(value.se) else round(value.se, 6)
        return {key: round(value.mean, 6), f"{key}_se": se}

    return {**{k: found[k] for k in ("optimizer", "from_steps", "steps", "lr_rule",
                                     "decay_rule", "rewarm_steps", "seeds")},
            "against": "planned, the paper's warm-up (T/50)",
            **plain(found["loss"], "loss"), **plain(found["gap"], "gap"),
            **plain(found["worth"], "worth"), "worth_extrapolated": found["worth_outside"]}


# ---- the figure ---------------------------------------------------------------------------------

def metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def identity(path: Path) -> dict:
    return json.loads((path / "run.json").read_text())["identity"]


def decay_in_effect(path: Path, base: Path | None) -> tuple[dict, int | None]:
    """(weight_decay, wd_ts) before and after the join, and the join's step: the planned run's
    own; an extension's from its base's by the library's rule (what `extend_optimizer` sets;
    run.json's identity holds the values a run planned for T2 would have)."""
    if base is None:
        planned = identity(path)
        values = (planned["weight_decay"], planned["wd_ts"])
        return {"before": values, "after": values}, None
    first = identity(base)
    (extension,) = json.loads((path / "run.json").read_text())["extensions"]
    wd, wd_ts = first["weight_decay"], first["wd_ts"]
    if wd_ts is None:  # AdamW's coupled decay
        after = (extended_coupled_weight_decay(wd, extension["from_iterations"],
                                               extension["iterations"], extension["decay_rule"]),
                 None)
    else:
        after = extended_weight_decay(wd, wd_ts, extension["iterations"],
                                      extension["from_step"], extension["decay_rule"])
    return {"before": (wd, wd_ts), "after": after}, extension["from_step"]


def schedule(path: Path):
    """The run's LR schedule, by the function `danastar train` ran it with (step k trains with
    its value at k − 1): planned from its config, or continued by its recorded extension."""
    config = load_config(["--config", str(path / "config.yaml")])[0]
    extensions = json.loads((path / "run.json").read_text()).get("extensions")
    if extensions:
        return extended_run_schedule(config, extensions)
    planned = identity(path)
    return get_schedule(config.optim.scheduler, planned["warmup_steps"], planned["iterations"],
                        **schedule_options(config))


def curves(path: Path, base: Path | None = None) -> dict:
    """A run's validation loss (8 batches; not the whole-set final one) as logged, and its LR
    factor and the share of a weight its decay removes at every step, from its schedule (checked
    against every factor the run logged); for an extension, `base` is the run it continues."""
    decay, join = decay_in_effect(path, base)
    factor = schedule(path)
    found = {"val": [], "lr": [], "decay": []}
    for m in metrics(path):
        if "val_loss" in m and not m.get("final") and m["step"] > 0:
            found["val"].append((m["step"], m["val_loss"]))
        if "lr_factor" in m and abs(factor(m["step"] - 1) - m["lr_factor"]) > 1e-12:
            raise UserError(f"{path.name} logged an LR factor of {m['lr_factor']} at step "
                            f"{m['step']}, not its schedule's {factor(m['step'] - 1)}")
    peak = identity(path)["lr"]
    for step in range(1, identity(path)["iterations"] + 1):
        lr_factor = factor(step - 1)
        found["lr"].append((step, lr_factor))
        wd, wd_ts = decay["before" if join is None or step <= join else "after"]
        if wd_ts is None:  # AdamW: p <- p - lr_t * lambda * p
            removed = peak * lr_factor * wd
        else:  # the multiplier of step k (1-based, as the optimizers count)
            removed = 1 - decay_multiplier(wd, lr_factor, step, wd_ts)
        found["decay"].append((step, removed))
    return found


def join_figure(steps: int, seed: int = 0):
    colours = rcParams["axes.prop_cycle"].by_key()["color"]

    fig = Figure(figsize=(4.2 * len(OPTIMIZERS), 10.5), layout="constrained")
    axes = fig.subplots(3, len(OPTIMIZERS), sharex=True, squeeze=False)
    drawn = 0
    for column, optimizer in enumerate(OPTIMIZERS):
        base = record(planned(optimizer, T1, seed))
        target = record(planned(optimizer, steps, seed))
        lines = []
        if target is not None:
            lines.append((f"planned for {steps}", "black", "-", curves(target)))
        for index, condition in enumerate(conditions(optimizer, steps)):
            path = record(Run("extended", optimizer, seed, steps, *condition))
            if path is not None and base is not None:
                lines.append((condition_name(*condition, code=""),
                              colours[index % len(colours)], "-", curves(path, base)))
        for label, color, style, found in lines:
            for row_index, key in enumerate(("val", "lr", "decay")):
                xs, ys = zip(*found[key]) if found[key] else ((), ())
                axes[row_index][column].plot(xs, ys, style, color=color, lw=1.3, label=label)
            drawn += 1
        axes[0][column].set_title(NAMES[optimizer])
        for ax in axes[:, column]:
            ax.axvline(T1, color="grey", ls=":", lw=1)
        axes[2][column].set_yscale("log")
        axes[2][column].set_xlabel("step")
        if lines:  # below the column, where it hides no curve (colours differ by column)
            handles, labels = axes[0][column].get_legend_handles_labels()
            axes[2][column].legend(handles, labels, fontsize=8, loc="upper center",
                                   bbox_to_anchor=(0.5, -0.22), frameon=False)
            # from half the base's steps on: the join and the rise a rewarm makes after it
            shown = [v for _, _, _, f in lines for step, v in f["val"] if step >= T1 // 2]
            axes[0][column].set_ylim(min(shown) - 0.05, max(shown) + 0.05)
    if not drawn:
        raise UserError(f"no run of seed {seed} extended to {steps} steps is recorded yet")
    axes[0][0].set_ylabel("validation loss (8 batches)")
    axes[1][0].set_ylabel("LR factor (× peak LR)")
    axes[2][0].set_ylabel("share of a weight decayed per step")
    fig.suptitle(f"Extending a run planned for {T1} steps to {steps} (seed {seed}); "
                 f"dotted: the join at step {T1}")
    return fig


# ---- the report ---------------------------------------------------------------------------------

def report() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    text = ["# Extending a run: results", "",
            "Written by `python studies/extend/report.py` from the committed records; see "
            "[the study's page](../study-extend.md) for what it means.", "",
            f"Each run was planned for {T1} steps and continued to the length named; final "
            "validation loss on the whole validation set, mean ± standard error over seeds. "
            "\"− planned\" is the extended run's loss minus the run planned for that length "
            "from the start, paired by seed (negative: the extension is better). \"Worth\" is "
            "AdamW's steps to reach the extended run's loss over its steps to reach the planned "
            "run's, read off AdamW's planned runs of the same seed (100%: as good as planning "
            "the length from the start).", ""]
    rows = []
    for steps in EXTENDED_TO:
        lines, found = table(steps)
        text += [f"## {T1} → {steps} steps ({steps // T1}T)", "", *lines, ""]
        rows += found
    for steps in EXTENDED_TO:
        lines, found = tuned_table(steps)
        if lines:
            text += [f"## AdamW's extensions to {steps} against its tuned warm-up", "",
                     "Every planned run above warms up over the paper's T/50 steps, which "
                     "Study III found handicaps AdamW at 512 steps; here AdamW's extensions "
                     f"against AdamW planned for {steps} steps with the warm-up Study III tuned "
                     "for it at 512 (T/5), paired by seed.", "", *lines, ""]
            rows += found
    lines, found = climb_table()
    if lines:
        text += ["## The climb's length", "",
                 "`rewarm` climbing back to the peak over the warm-up of a run planned for T2 "
                 f"(T2/50) against over the run's own ({T1 // 50} steps), both with the decay "
                 "kept, paired by seed (negative: the longer climb is better).", "", *lines,
                 ""]
        rows += found
    figure = figure_writer(OUT, text)
    for steps in EXTENDED_TO:
        figure(f"join_{steps}", lambda steps=steps: join_figure(steps))
    text += [f"![The runs of seed 0 across the join, to {steps} steps](join_{steps}.png)"
             for steps in EXTENDED_TO if (OUT / f"join_{steps}.png").is_file()]
    (OUT / "results.md").write_text("\n".join(text) + "\n")
    SUMMARY.write_text(json.dumps(rows, indent=1) + "\n")
    print("wrote", (OUT / "results.md").relative_to(ROOT), SUMMARY.relative_to(ROOT))


if __name__ == "__main__":
    report()
