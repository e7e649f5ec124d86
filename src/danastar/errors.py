"""Errors a user can cause, reported as one sentence and exit code 2 by the command line."""


class UserError(Exception):
    """A problem with the user's input (flag, file, data, checkpoint) rather than a bug.

    The message is one clear sentence that names the fix; the command line prints it without a
    traceback and exits with code 2.
    """

    exit_code = 2
