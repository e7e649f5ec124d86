"""What this machine has, for checks that refuse a job before it starts rather than let it fail
midway: the memory available to a new process, and the CUDA device a flag names."""

from __future__ import annotations

from danastar.errors import UserError


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


def check_cuda_device(requested: str, index: int, instead: str) -> None:
    """Refuse a `--device` (as given, `requested`) that names CUDA device `index` where this
    machine has no such device; `instead` is the flag to use then (e.g. "--device cpu")."""
    # torch takes seconds to import, and `danastar generate --help` and `eval --help` import
    # this module: only a check of a --device pays for it
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():
        raise UserError(f"--device {requested} asks for a GPU, but no CUDA device is visible; "
                        f"use {instead}.")
    count = torch.cuda.device_count()
    if index >= count:
        raise UserError(f"--device {requested}: {count} CUDA device(s) are visible (cuda:0 to "
                        f"cuda:{count - 1}); name one of them.")
