"""How a param group's update runs: one runner per path, picked once per group from `RUNNERS`.

A path is (impl, capturable, flat): ``impl`` "reference" (a Python loop over the tensors) or
"compiled" (that loop compiled), ``capturable`` (step counts and scalars on the device, for
CUDA graphs), ``flat`` (small tensors in one flat buffer). Low-precision state and rounded bf16
parameters are not a path: the runner is given the update wrapped by `rounding.rounded`.
Adding a path is one new runner file and one row below; a combination without a row is
refused with its sentence in `MISSING`.
"""

from __future__ import annotations

from .capturable import CapturableRunner, CompiledCapturableRunner
from .compiled import CompiledRunner
from .flat import FlatCompiledRunner, FlatRunner
from .group import GroupRunner
from .loops import compiled_available
from .reference import ReferenceRunner

__all__ = ["IMPLS", "MISSING", "RUNNERS", "GroupRunner", "check_path", "compiled_available",
           "runner_class"]

IMPLS = ("reference", "compiled")

RUNNERS: dict[tuple[str, bool, bool], type[GroupRunner]] = {
    # (impl, capturable, flat)
    ("reference", False, False): ReferenceRunner,
    ("compiled", False, False): CompiledRunner,
    ("reference", True, False): CapturableRunner,
    ("compiled", True, False): CompiledCapturableRunner,
    ("reference", False, True): FlatRunner,
    ("compiled", False, True): FlatCompiledRunner,
}

# (capturable, flat) without a runner, and why.
MISSING = {
    (True, True): "capturable=True keeps one step count per tensor on the device, which flat "
                  "buffers cannot; drop flat=True or capturable=True for this group",
}


def runner_class(impl: str, capturable: bool, flat: bool) -> type[GroupRunner]:
    return RUNNERS[(impl, capturable, flat)]


def check_path(owner: str, impl: str | None, group: dict) -> None:
    """Refuse (ValueError) a group no runner can step: a missing row of `RUNNERS`, or what the
    runners it may get refuse (their ``check``)."""
    capturable, flat = group["capturable"], group["flat"]
    rows = [cls for (row_impl, *settings), cls in RUNNERS.items()
            if settings == [capturable, flat] and impl in (None, row_impl)]
    if not rows:
        reason = MISSING.get((capturable, flat), f"no path runs impl={impl!r}, "
                             f"capturable={capturable}, flat={flat}")
        raise ValueError(f"{owner}: {reason}")
    for cls in rows:
        check = getattr(cls, "check", None)
        if check is not None:
            check(owner, group)
