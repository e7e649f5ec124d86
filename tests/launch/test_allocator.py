"""The environment of the training processes danastar starts: glibc's malloc asked for huge
pages, without overriding what the user's GLIBC_TUNABLES already says."""

import os
import subprocess
import sys

from danastar.launch.allocator import HUGE_PAGES, with_huge_pages


def test_huge_pages_are_added_beside_other_tunables_and_never_override_a_choice():
    assert with_huge_pages({"PATH": "/bin"}) == {"PATH": "/bin", "GLIBC_TUNABLES": HUGE_PAGES}
    assert with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})["GLIBC_TUNABLES"] \
        == f"glibc.malloc.arena_max=2:{HUGE_PAGES}"
    chosen = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
    assert with_huge_pages(chosen) == chosen and with_huge_pages(chosen) is not chosen


def test_a_process_started_with_it_runs_and_sees_it():
    """An unknown or unsupported tunable must not stop a process from starting (glibc ignores
    it); the child sees the variable as given."""
    code = "import os; print(os.environ['GLIBC_TUNABLES'])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=with_huge_pages(os.environ), timeout=60)
    assert result.returncode == 0 and HUGE_PAGES in result.stdout, result.stderr
