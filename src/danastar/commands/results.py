"""`danastar results [DIRS ...]`: the table of runs found in run or sweep directories.

    danastar results runs/lr-sweep                 # every run: state, losses, compute (and the
                                                   # newest `danastar eval` scores, if any)
    danastar results runs/lr-sweep --best          # best LR per optimizer and size (seeds: ± s.e.)
    danastar results runs/lr-sweep --vs adamw      # ... with the compute multiplier vs AdamW
    danastar results runs/study --vs adamw --within_size   # ... at each size from step budgets
    danastar results runs/lr-sweep --csv out.csv   # or --json out.json ('-': standard output)
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from danastar import durable
from danastar.analysis import budgets, records, table
from danastar.errors import UserError

WITHIN_SIZE_COLUMNS = ("optimizer", "arch", "heads", "steps", "lr", "seeds", "final_loss",
                       "multiplier", "steps_to_baseline")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="danastar results",
        description="Table of the runs in run directories or sweep directories (docs/analysis.md).")
    parser.add_argument("dirs", nargs="*", default=["runs"],
                        help="run directories, or directories searched for runs (default runs)")
    parser.add_argument("--best", action="store_true",
                        help="per (optimizer, size), the LR with the lowest final loss at the "
                             "step budget with the most LRs (runs at other budgets are named "
                             "and left out); several seeds give mean ± standard error; † marks "
                             "an LR not bracketed by the sweep")
    parser.add_argument("--vs", metavar="OPTIMIZER", default=None,
                        help="add the measured compute multiplier against this optimizer, and the "
                             "fraction of compute saved reaching its final loss at each size "
                             "(implies --best), e.g. adamw")
    parser.add_argument("--within_size", action="store_true",
                        help="with --vs: the multiplier at each size from the baseline's runs "
                             "at several step budgets (its best LR trained shorter and longer), "
                             "seeds paired; also the steps each optimizer took to reach the "
                             "baseline's final loss")
    parser.add_argument("--csv", metavar="FILE", default=None, help="write CSV ('-': stdout)")
    parser.add_argument("--json", metavar="FILE", default=None, help="write JSON ('-': stdout)")
    return parser


def _cell(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if column == "lr":
        return f"{value:.3g}"
    if column in ("pfh",):
        return f"{value:.3g}"
    if column in ("tokens", "total_params"):
        return f"{value:,}"
    if column == "tokens_per_s":
        return f"{value:,.0f}"
    if column == "multiplier":
        return f"{value:.2f}"
    if column in ("saved_fraction", "steps_to_baseline"):
        return f"{value:.0%}"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _display(rows: list[dict[str, Any]], columns: Sequence[str]) -> tuple[list[str], list[list]]:
    shown = [c for c in columns if c != "final_loss_se"]
    marked = "multiplier" if "multiplier" in shown else "lr"  # where † goes (budgets.untuned)
    cells = []
    for row in rows:
        line = []
        for column in shown:
            text = _cell(column, row.get(column))
            if column == "final_loss" and row.get("final_loss_se") is not None:
                text += f" ± {row['final_loss_se']:.4f}"
            if column == "multiplier" and row.get("multiplier_se") is not None:
                text += f" ± {row['multiplier_se']:.2f}"
            if column == "steps_to_baseline" and row.get("steps_to_baseline_se") is not None:
                text += f" ± {row['steps_to_baseline_se']:.0%}"
            if column == "multiplier" and row.get("multiplier_kind", "").startswith("extrap"):
                text += "*"
            if column == marked and row.get("untuned"):
                text += "†"
            line.append(text)
        cells.append(line)
    return shown, cells


def render(rows: list[dict[str, Any]], columns: Sequence[str], *, rich_ok: bool) -> str:
    headers, cells = _display(rows, columns)
    if rich_ok:
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            pass
        else:
            view = Table(*headers)
            for line in cells:
                view.add_row(*line)
            buffer = io.StringIO()
            Console(file=buffer, force_terminal=True).print(view)
            return buffer.getvalue().rstrip("\n")
    widths = [max(len(h), *(len(line[i]) for line in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in cells]
    return "\n".join(line.rstrip() for line in lines)


def _write(target: str, text: str, flag: str) -> None:
    if target == "-":
        sys.stdout.write(text)
    else:
        durable.write_output(Path(target), text, flag)


def _say(message: str) -> None:
    print(f"danastar results: {message}", file=sys.stderr, flush=True)


def _other_budgets_note(runs: list[records.Run]) -> None:
    """One line naming the complete runs --best left out: those at another step budget than
    the one with the most LRs of their optimizer and size."""
    others = budgets.other_budget_runs(runs)
    if not others:
        return
    cells: dict[str, set[int]] = {}
    for run in others:
        cells.setdefault(f"{run.group} {run.arch} h{run.heads}", set()).add(run.iterations)
    listed = ", ".join(f"{cell} at {'/'.join(map(str, sorted(steps)))} steps"
                       for cell, steps in sorted(cells.items()))
    print(f"({len(others)} complete run(s) at other step budgets left out: {listed}; each "
          "optimizer and size is compared at its steps with the most LRs; --within_size "
          "compares budgets)")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.within_size and not args.vs:
        raise UserError("--within_size compares against a baseline; add --vs, e.g. --vs adamw.")
    for flag, target in (("--csv", args.csv), ("--json", args.json)):
        if target is not None and target != "-":
            durable.check_output(Path(target), flag)
    runs = records.find_runs(args.dirs, note=_say)
    baseline = args.vs and records.match_optimizer({r.group for r in runs}, args.vs)
    rows, columns = _table(runs, args, baseline)
    matched = f"--vs {args.vs} is {baseline}" if args.vs and baseline != args.vs else None
    if args.csv or args.json:
        _write_files(args, rows, columns)
        if matched:
            _say(matched)
        return 0
    print(render(rows, columns, rich_ok=sys.stdout.isatty()))
    if matched:
        print(f"({matched})")
    _print_notes(runs, rows, args, baseline)
    return 0


def _table(runs, args, baseline) -> tuple[list[dict], tuple[str, ...]]:
    """The rows and columns that the flags ask for."""
    if args.within_size:
        return ([r.row() for r in budgets.within_size_multipliers(runs, baseline)],
                WITHIN_SIZE_COLUMNS)
    if args.vs:
        return (table.with_multipliers(table.best_per_size(runs), baseline, runs),
                table.BEST_COLUMNS + ("multiplier", "saved_fraction"))
    if args.best:
        return [b.row() for b in table.best_per_size(runs)], table.BEST_COLUMNS
    labels = records.dataset_labels(runs)
    evals = table.eval_columns(runs)  # `danastar eval`'s newest scores, beside the losses
    extended = any(r.extensions for r in runs)  # continued past their planned steps
    return ([table.run_row(r, labels, evals, extended) for r in runs],
            table.run_columns(evals, extended))


def _write_files(args, rows: list[dict], columns) -> None:
    """Each file asked for, and a line saying what went where (on standard error when a table
    goes to standard output, which then holds the table alone)."""
    said = sys.stderr if "-" in (args.csv, args.json) else sys.stdout
    if args.csv:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else list(columns))
        writer.writeheader()
        writer.writerows(rows)
        _write(args.csv, buffer.getvalue(), "--csv")
    if args.json:
        _write(args.json, json.dumps(rows, indent=1) + "\n", "--json")
    for target in (args.csv, args.json):
        if target not in (None, "-"):
            print(f"wrote {len(rows)} row{'s' * (len(rows) != 1)} of {_table_name(args)} to "
                  f"{target}", file=said)


def _table_name(args) -> str:
    """Which table the flags asked for, as the line after a written file names it."""
    if args.within_size:
        return f"multipliers against {args.vs} within each size"
    if args.vs:
        return f"the best LRs with their multiplier against {args.vs}"
    return "the best LR per optimizer and size" if args.best else "the run table"


def _print_notes(runs, rows: list[dict], args, baseline) -> None:
    """What the table's marks mean, and which runs it leaves out."""
    if any(row.get("multiplier_kind", "").startswith("extrap") for row in rows):
        print(f"* extrapolated beyond the range of {baseline}'s losses")
    if any(row.get("untuned") for row in rows):
        print(budgets.UNTUNED_NOTE)
    if (args.best or args.vs) and not args.within_size:
        _other_budgets_note(runs)
    partial = sum(1 for r in runs if not r.complete)
    if partial and (args.best or args.vs):
        print(f"({partial} partial run(s) left out)")
