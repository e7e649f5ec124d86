"""What this machine has, for checks that refuse a job before it starts rather than let it fail
midway: the memory available to a new process."""

from __future__ import annotations


def available_memory() -> int | None:
    """Bytes of memory a new process can use without swapping (Linux's MemAvailable), None where
    the system does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
