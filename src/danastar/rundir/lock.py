"""One live run per run directory: an exclusive lock that the operating system releases when its
holder ends, however it ends (a normal exit, a crash, `kill -9`, a job killed by its scheduler).

The lock is `fcntl.flock` on the file `.lock` in the directory, held open for the whole run. After
taking it, the holder writes into the file who it is (pid, host, command, start time), so that a
second process is refused with one sentence that names it. A lock file left behind by a run that
has ended holds no lock: it never blocks the next start, as a stale pid file would. The file is
never removed (a process that removed it while another still held it would let a third lock a
new file of the same name), and nothing moves it: it is not one of the run's files.

`train` holds its run directory's lock on rank 0 (the one process that decides what happens to
the directory's files), `sweep` the lock of its sweep's folder. On a filesystem that offers no
locks (a Lustre mount without `flock`, NFS without its lock service) the run goes on unlocked and
says so.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from danastar.errors import UserError

LOCK_FILE = ".lock"
# What flock raises where the filesystem offers no locks (rather than "held by another process").
NO_LOCKS_ERRNOS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL)
HOLDER_WAIT_S = 1.0  # how long to wait for a holder that has just taken the lock to say who it is


@contextlib.contextmanager
def hold(directory: Path, command: str, way_out: str) -> Iterator[str | None]:
    """Hold `directory`'s lock (the directory must exist) until the block ends, or refuse at once
    when another process holds it: one sentence naming the holder, then `way_out` (such as "use
    another --run_dir"). Yields None, or a note to report when the filesystem offers no locks."""
    path = Path(directory) / LOCK_FILE
    try:
        # (Python's descriptors are not inherited by the programs a run starts.)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise UserError(f"cannot create the lock file {path} ({error.strerror}); make "
                        f"{directory} writable or {way_out}.") from None
    try:
        note = None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(in_use(directory, read_holder(descriptor), way_out)) from None
        except OSError as error:
            if error.errno not in NO_LOCKS_ERRNOS:
                raise
            note = (f"the filesystem of {directory} offers no file locks ({error.strerror}), so "
                    f"nothing stops a second process from using it at the same time.")
        if note is None:
            holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                      "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            try:
                os.ftruncate(descriptor, 0)
                os.pwrite(descriptor, (json.dumps(holder) + "\n").encode(), 0)
            except OSError:
                # The lock is held all the same; only the name a refusal would show is lost (a
                # full disk is then refused with its own sentence by the run's space check).
                pass
        yield note
    finally:
        os.close(descriptor)  # releases the lock


def check_free(directory: Path, way_out: str) -> None:
    """Refuse, as `hold` would, when another process holds `directory`'s lock now; takes nothing
    and creates nothing (for a refusal before any work starts: the lock itself is taken later)."""
    path = Path(directory) / LOCK_FILE
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file: no run has held this directory; an unreadable one: `hold` says
    try:
        # A shared lock conflicts with the holder's exclusive one, needs only read access (NFS),
        # and never with another such check.
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UserError(in_use(directory, read_holder(descriptor), way_out)) from None
    except OSError:
        return  # no locks on this filesystem: `hold` says so
    finally:
        os.close(descriptor)


def read_holder(descriptor: int) -> dict:
    """Who holds the lock, as it wrote it; waits a moment for one that has just taken it."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        try:
            holder = json.loads(os.pread(descriptor, 4096, 0).decode())
            if isinstance(holder, dict) and "pid" in holder:
                return holder
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            return {}
        time.sleep(0.05)


def in_use(directory: Path, holder: dict, way_out: str) -> str:
    if not holder:
        return (f"{directory} is in use by another process (which has not yet said which); wait "
                f"for it to end or {way_out}.")
    since = str(holder.get("since", "?")).replace("T", " ").replace("Z", " UTC")
    return (f"{directory} is in use by {holder.get('command', 'another process')} (pid "
            f"{holder['pid']} on host {holder.get('host', '?')}, since {since}); wait for it to "
            f"end or {way_out}.")
