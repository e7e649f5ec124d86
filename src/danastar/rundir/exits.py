"""How a training process ends, for whoever runs it (a shell, torchrun's agent, a SLURM job
script, `sweep`): its exit code, and the signals that ask it to save and stop.

    0    the run reached its total iterations
    2    a user error (a bad flag, a diverged run, a resume with other settings): one sentence
    75   a checkpoint was saved and work remains (SIGTERM/SIGUSR1, the STOP file,
         `--iterations_to_run`): requeue or run again to resume
    130  Ctrl-C (after a saved checkpoint, or at once on a second Ctrl-C)

Any other code is a crash (1) or a death by another signal (128 + its number).
"""

from __future__ import annotations

import signal

from danastar.errors import UserError

COMPLETE_EXIT_CODE = 0
USER_ERROR_EXIT_CODE = UserError.exit_code
PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: a temporary failure, try again (requeue and resume)
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what shells report after Ctrl-C
# The codes whose cause the process has already told the user (any other is a crash).
EXPLAINED_EXIT_CODES = (COMPLETE_EXIT_CODE, USER_ERROR_EXIT_CODE, PREEMPTED_EXIT_CODE,
                        INTERRUPTED_EXIT_CODE)

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # save, stop and exit 75
STOP_SIGNALS = (*PREEMPTION_SIGNALS, signal.SIGINT)  # SIGINT: save, stop and exit 130
