"""The C library's allocator for the training processes that danastar starts itself (a sweep's
runs, the `--nproc` workers).

glibc's malloc maps a block larger than 32 MiB afresh on each use and unmaps it on free, so the
chunked loss's logits (64 MiB for 32 × 128 tokens of a 4,096-token vocabulary) fault in every
4 KiB page each step: a quarter of a small CPU run's wall time. Asked for transparent huge pages
(the `glibc.malloc.hugetlb=1` tunable), it faults them in 2 MiB at a time: on this project's
2-core test machine 2.9M page faults became 89K and a run's wall time 0.68×, every logged value
bitwise the same (benchmarks/huge_pages.py). glibc before 2.35, other C libraries
and a kernel with transparent huge pages off ignore it. A tunable is read when a process starts,
so a `danastar train` started by hand takes it only from its own environment
(docs/training.md, "The loop").
"""

from __future__ import annotations

from typing import Mapping

HUGE_PAGES = "glibc.malloc.hugetlb=1"


def with_huge_pages(environment: Mapping[str, str]) -> dict[str, str]:
    """`environment` with GLIBC_TUNABLES asking for huge pages, unless it already says how."""
    tunables = environment.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tunables:
        return dict(environment)
    return {**environment, "GLIBC_TUNABLES": ":".join(filter(None, (tunables, HUGE_PAGES)))}
