"""One live run per directory: the lock refuses a second holder naming the first, and the
operating system releases it when its holder ends, even by `kill -9` (no stale pid file)."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from danastar.errors import UserError
from danastar.rundir.lock import LOCK_FILE, check_free, hold

WAY_OUT = "use another --run_dir"


def test_a_second_holder_is_refused_naming_the_first_until_it_lets_go(tmp_path):
    held = f"pid {os.getpid()} on host {socket.gethostname()}"
    with hold(tmp_path, "danastar train", WAY_OUT) as unlocked:
        assert unlocked is None
        for attempt in (lambda: hold(tmp_path, "danastar train", WAY_OUT).__enter__(),
                        lambda: check_free(tmp_path, WAY_OUT)):
            with pytest.raises(UserError) as refused:
                attempt()
            message = str(refused.value)
            assert message.startswith(f"{tmp_path} is in use by danastar train ({held}, since ")
            assert message.endswith("; wait for it to end or use another --run_dir.")
    check_free(tmp_path, WAY_OUT)  # released: the file left behind blocks nothing
    with hold(tmp_path, "danastar sweep", WAY_OUT):
        pass


def test_looking_creates_nothing(tmp_path):
    check_free(tmp_path, WAY_OUT)
    assert list(tmp_path.iterdir()) == []


def test_a_holder_killed_with_sigkill_leaves_no_lock(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from danastar.rundir.lock import hold\n"
         f"with hold({str(tmp_path)!r}, 'danastar train', ''):\n"
         "    print('held', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"pid {holder.pid} on host"):
            check_free(tmp_path, WAY_OUT)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert (tmp_path / LOCK_FILE).exists()  # what a stale pid file would be, and it blocks nothing
    check_free(tmp_path, WAY_OUT)
    with hold(tmp_path, "danastar train", WAY_OUT):
        pass
