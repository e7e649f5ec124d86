"""Preemption: SIGTERM or SIGUSR1 asks the run to save a checkpoint and stop.

The handler only sets a flag; the loop checks it after each optimizer step (all ranks agree
through an all-reduce), saves, and exits with `PREEMPTED_EXIT_CODE` so that a job script can
tell "preempted, requeue me" from success (0), a user error (2) or a crash (1).
"""

from __future__ import annotations

import signal

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: a temporary failure, try again (requeue and resume)
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionFlag:
    """Set by SIGTERM/SIGUSR1 while installed; `received` names the signal."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._previous: dict = {}

    def install(self) -> "PreemptionFlag":
        for sig in PREEMPTION_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        self.received = signal.Signals(signum)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @property
    def is_set(self) -> bool:
        return self.received is not None
