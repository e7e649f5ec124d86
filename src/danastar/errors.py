"""Errors a user can cause, reported as one sentence and exit code 2 by the command line."""

import sys


class UserError(Exception):
    """A problem with the user's input (flag, file, data, checkpoint) rather than a bug.

    The message is one clear sentence that names the fix; the command line prints it without a
    traceback and exits with code 2.
    """

    exit_code = 2
    # Raised alike by every rank of a distributed run (a decision broadcast from rank 0): the
    # ranks may meet once more before the process group goes, and rank 0 alone prints it.
    raised_by_every_rank = False
    reported_by_rank_0 = False

    @classmethod
    def on_every_rank(cls, message: str, is_main: bool) -> "UserError":
        error = cls(message)
        error.raised_by_every_rank = True
        error.reported_by_rank_0 = not is_main  # one message, not one per process
        return error


def report(error: UserError, command: str) -> int:
    """Say ``error`` as the command line does (one line on stderr); returns its exit code."""
    print(f"danastar {command}: {error}", file=sys.stderr, flush=True)
    return error.exit_code
