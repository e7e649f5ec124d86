"""metrics.jsonl: one JSON object per line, `{"step": ..., "train_loss" | "val_loss": ...}`, and
the one reader of it.

A run killed mid-write leaves its last line cut short, and a file may be damaged otherwise: the
reader keeps every line it can read and reports the others (`MetricsFile.problem`), so that one
bad line neither hides a run nor stops a resume. The validation record a complete run logs last
holds `"final": true` (`final_validation`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from danastar.durable import write_atomic
from danastar.rundir.files import SUPERSEDED_FILE

# Fields read as numbers: a line holding anything else there is unreadable.
NUMBER_FIELDS = ("step", "tokens", "val_loss", "train_loss", "tokens_per_s")


@dataclass(frozen=True)
class MetricsFile:
    """What `read` found in one metrics.jsonl."""

    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)  # the readable lines, in order
    bad_lines: list[int] = field(default_factory=list)  # numbers (from 1) of the others
    total_lines: int = 0
    cut_short: bool = False  # the last line has no newline after it (a killed run's)

    def problem(self) -> Optional[str]:
        """A line saying which lines could not be read, or None when all could."""
        bad = self.bad_lines
        if not bad:
            return None
        shown = ", ".join(str(n) for n in bad[:5]) + (", ..." if len(bad) > 5 else "")
        note = (f"{len(bad)} of the {self.total_lines} lines of {self.path} could not be read "
                f"and were left out (line{'s' if len(bad) > 1 else ''} {shown})")
        if self.cut_short and bad == [self.total_lines]:
            note += "; the last line was cut short, as a killed run leaves it"
        return note


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_line(line: str) -> Optional[dict[str, Any]]:
    """The record of one line, or None when it is not one (not JSON, not an object, or a field
    of NUMBER_FIELDS that is not a number)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:  # a line cut short by a killed run, or garbled
        return None
    if not isinstance(record, dict):
        return None
    if not all(is_number(record[key]) for key in NUMBER_FIELDS if key in record):
        return None
    return record


def read(path: Path | str) -> MetricsFile:
    """Every readable record of `path` and the numbers of the lines that are not (blank lines
    are neither); an empty MetricsFile when there is no such file. OSError when it cannot be
    read."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return MetricsFile(path)
    lines = text.splitlines()
    records, bad = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = parse_line(line)
        if record is None:
            bad.append(number)
        else:
            records.append(record)
    return MetricsFile(path, records, bad, len(lines), bool(text) and not text.endswith("\n"))


def records(path: Path | str) -> list[dict[str, Any]]:
    """The readable records of `path` (none when there is no such file)."""
    return read(path).records


def final_validation(found: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The last final validation record (`"final": true` with a `val_loss`), or None."""
    return next((record for record in reversed(found)
                 if record.get("final") and "val_loss" in record), None)


def truncate(path: Path, last_step: int) -> None:
    """Keep in `path` the lines up to `last_step` (a resumed run logs the later steps again), so
    that metrics.jsonl describes the weights. The other lines, and any that cannot be read (a
    line cut short by a kill), are appended to `metrics-superseded.jsonl` beside it, never
    lost."""
    if not path.exists():
        return
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    parsed = [parse_line(line) for line in lines]
    kept = [line for line, record in zip(lines, parsed)
            if record is not None and record.get("step", 0) <= last_step]
    if len(kept) == len(lines):
        return
    dropped = [line for line, record in zip(lines, parsed)
               if record is None or record.get("step", 0) > last_step]
    with open(path.with_name(SUPERSEDED_FILE), "a") as superseded:
        superseded.write("".join(line + "\n" for line in dropped))
        superseded.flush()
        os.fsync(superseded.fileno())
    write_atomic(path, "".join(line + "\n" for line in kept))
