"""What a command is doing while it makes someone wait: one way for every command.

* `bar`: a tqdm progress bar where its stream is a terminal. Elsewhere (a pipe, a log file, a
  test) tqdm is built disabled (`disable=None`), so that a log holds no bar redrawn a thousand
  times; a caller that wants plain lines there checks `bar.disable`.
* `Stages`: a long computation's stages, each said in one line on standard error as it starts
  (`danastar theory: solving the ODE of 5 methods up to t = 1e6 ...`), its loops counted by a
  `bar`. `SILENT` says nothing: the default of library functions, which print nothing unless a
  command hands them its `Stages`.

Imports tqdm (in every extra whose commands wait) only when a bar is made.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import IO, TypeVar

Item = TypeVar("Item")


def bar(total: int | None = None, *, desc: str, unit: str, initial: int = 0,
        file: IO[str] | None = None, enabled: bool = True, leave: bool = True):
    """A tqdm bar on `file` (standard error by default, looked up now: a test's capture counts)
    where that is a terminal; disabled elsewhere, or when not `enabled`."""
    from tqdm.auto import tqdm  # noqa: PLC0415 (an optional extra's, when a bar is made)

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True,
                file=file or sys.stderr, leave=leave,
                disable=None if enabled else True)  # None: no bar off a terminal


class Stages:
    """The stages of one command's long computation, said on standard error."""

    def __init__(self, command: str | None) -> None:
        """`command` begins each line (`danastar theory`); None says nothing."""
        self.command = command

    def start(self, what: str, only_on_terminal: bool = False) -> None:
        """One line as a stage starts: what it does, ending in "..." (the wait is now).
        `only_on_terminal`: for a stage that may end in a refusal, which elsewhere (a log, a
        script reading standard error) is then one sentence alone."""
        if self.command is None or (only_on_terminal and not sys.stderr.isatty()):
            return
        print(f"{self.command}: {what} ...", file=sys.stderr, flush=True)

    def counted(self, items: Iterable[Item], total: int, unit: str) -> Iterator[Item]:
        """`items`, counted by a bar where standard error is a terminal (and only then: a bar's
        cost per item is then worth it); the bar goes when the loop ends."""
        if self.command is None:
            yield from items
            return
        with bar(total, desc=self.command.removeprefix("danastar "), unit=unit,
                 leave=False) as counter:
            if counter.disable:
                yield from items
                return
            for item in items:
                yield item
                counter.update()


SILENT = Stages(None)
