"""Stopping cleanly: SIGTERM, SIGUSR1 (preemption) and SIGINT (Ctrl-C) ask the run to save a
checkpoint and stop (the codes and signals are the run directory's protocol: rundir/exits.py).

The handler only sets a flag; the loop checks it after each optimizer step (all ranks agree
through an all-reduce), saves, and exits with `PREEMPTED_EXIT_CODE` after SIGTERM/SIGUSR1 so
that a job script can tell "preempted, requeue me" from success (0), a user error (2) or a crash
(1), and with `INTERRUPTED_EXIT_CODE` (130, the shell's code for Ctrl-C) after Ctrl-C.

A second Ctrl-C stops at once: the handler raises KeyboardInterrupt, which the command line
turns into exit 130 without a traceback. Checkpoint writes are atomic, so a save cut short
leaves only a hidden temporary directory and the previous checkpoint stays the one to resume.
A second SIGINT within `DUPLICATE_WINDOW_S` of the first is the same Ctrl-C delivered twice
(a terminal signals the whole process group, and a launcher such as torchrun forwards it too),
not a second press.
"""

from __future__ import annotations

import os
import signal
import time

from danastar.rundir.exits import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, STOP_SIGNALS

DUPLICATE_WINDOW_S = 0.5


class PreemptionFlag:
    """Set by SIGTERM/SIGUSR1/SIGINT while installed; `received` names the first signal.

    `announce`: whether this process tells the user, at the first Ctrl-C, what happens next
    (rank 0 only, so that N processes print one line).
    """

    def __init__(self, announce: bool = True) -> None:
        self.received: signal.Signals | None = None
        self.announce = announce
        self._interrupted_at: float | None = None
        self._previous: dict = {}

    def install(self) -> "PreemptionFlag":
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        sig = signal.Signals(signum)
        if sig == signal.SIGINT:
            now = time.monotonic()
            if self._interrupted_at is not None:
                if now - self._interrupted_at < DUPLICATE_WINDOW_S:
                    return
                raise KeyboardInterrupt  # the second Ctrl-C: stop at once
            self._interrupted_at = now
            if self.announce:
                # os.write, not print: a handler may run in the middle of another print.
                os.write(2, b"\nCtrl-C: finishing this step and saving a checkpoint "
                            b"(press Ctrl-C again to stop at once without saving).\n")
        if self.received is None or sig == signal.SIGINT:
            self.received = sig

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @property
    def is_set(self) -> bool:
        return self.received is not None

    @property
    def interrupted(self) -> bool:
        """Ctrl-C (SIGINT) was among the signals: exit with 130 rather than requeue (75)."""
        return self._interrupted_at is not None

    @property
    def exit_code(self) -> int:
        return INTERRUPTED_EXIT_CODE if self.interrupted else PREEMPTED_EXIT_CODE
