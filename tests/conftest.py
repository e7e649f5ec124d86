"""The `process` marker: which tests start processes, decided for every test at collection.

`pytest -m "not process"` is the fast inner loop (the in-process majority); CI runs everything.
tests/README.md names the kinds of tests and how to run each.

The rule. A test is a `process` test when the code it runs reaches a process starter:

* the code searched is the test function, the functions of every fixture it uses (pytest's
  closure of fixture names, so a fixture's own fixtures count), and, followed through global
  names, every function and class of the test tree those name (a helper such as
  `train_helpers.run_train`); nested functions and lambdas count as part of their function;
* a process starter is a global name bound to a module of `PROCESS_MODULES` or to something
  defined in one (`from subprocess import run`), an `os` function of `OS_PROCESS_FUNCTIONS`
  (`os.fork`, `os.system`...), `torch.compile` (its kernels are built by a C++ compiler, and the
  tests that compile are the slowest in-process ones), or a danastar callable of
  `PROCESS_CALLABLES`;
* the markers `slurm` (a local cluster), `cuda` (on a GPU, torch's compiler starts its worker
  pool and `ptxas`; none of these tests runs in the CPU inner loop anyway) and `process` itself
  mark it too, and so does `PROCESS_TESTS`: tests that reach a process through an in-process
  command whose arguments decide (`cli.main(["prepare", ..., "--workers", "2"])`), which no
  reading of names can tell.

The rule reads code, so it could miss a process started deep inside danastar or a library; a
check closes that gap: while an unmarked test runs, starting a process (other than the quick
look-ups of `INCIDENTAL_PROGRAMS`) fails the test with a sentence naming the fix.
"""

from __future__ import annotations

import inspect
import multiprocessing.process
import os
import subprocess
import types
from pathlib import Path

import pytest
import torch

from long_tier import is_long

TESTS = Path(__file__).resolve().parent
PROCESS_MODULES = ("subprocess", "multiprocessing", "torch.multiprocessing",
                   "torch.distributed.run", "torch.distributed.elastic",
                   "concurrent.futures.process")
OS_PROCESS_FUNCTIONS = frozenset({
    "fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp",
    "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
    "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
})
# danastar callables that start processes as tests call them: `prepare_source` tokenises in a
# pool of spawned workers (one per core by default).
PROCESS_CALLABLES = frozenset({"danastar.data.prepare.prepare_source"})
# Node ids (up to a `[` of the parameters) of the tests that start processes through danastar
# called in-process (a command, a compiled path, data prepared on first use); the check below
# names any that is missing.
PROCESS_TESTS = (
    "tests/data/test_prepare.py::test_fineweb_from_local_parquet_with_the_papers_split",
    "tests/data/test_prepare.py::test_fineweb_one_worker_and_resumed_give_identical_output",
    "tests/data/test_verify.py::test_bad_prepare_inputs_get_one_sentence_and_lose_nothing",
    "tests/launch/test_submit.py::test_submit_without_sbatch_says_where_to_run",
    "tests/models/test_loss_compiled.py::test_compiled_chunk_terms_match_eager",
    "tests/optim/test_optim_fast_paths.py::test_compiled_matches_reference_without_recompiling",
    "tests/optim/test_flat_buffers.py::test_compiled_flat_step_equals_the_compiled_per_tensor_step",
    "tests/optim/test_capturable.py::test_compiled_capturable_step_equals_the_compiled_host_step",
    "tests/train/test_loop.py::test_default_preset_shortened_learns_shakespeare_and_samples",
)
# Quick look-ups made in passing, not what the marker is about: `git` for the run record's
# commit, `uname` (Python's `platform`) for its machine, `scontrol` to expand a SLURM node list.
INCIDENTAL_PROGRAMS = frozenset({"git", "uname", "scontrol"})


def _is_process_module(name: str) -> bool:
    return any(name == module or name.startswith(module + ".") for module in PROCESS_MODULES)


def _in_test_tree(value) -> bool:
    code = getattr(value, "__code__", None)
    return code is not None and Path(code.co_filename).resolve().is_relative_to(TESTS)


def _code_objects(code: types.CodeType):
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _code_objects(constant)


def _is_starter(value) -> bool:
    module = value.__name__ if isinstance(value, types.ModuleType) else (
        getattr(value, "__module__", None) or "")
    qualified = f"{module}.{getattr(value, '__qualname__', '')}"
    return _is_process_module(module) or qualified in PROCESS_CALLABLES


def _starts_processes(function, seen: set) -> bool:
    """Whether `function`, or a function or class of the test tree it names, reaches a starter."""
    function = inspect.unwrap(function)
    code = getattr(function, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    namespace = getattr(function, "__globals__", {})
    for inner in _code_objects(code):
        names = set(inner.co_names)
        if namespace.get("os") is os and names & OS_PROCESS_FUNCTIONS:
            return True
        if namespace.get("torch") is torch and "compile" in names:
            return True
        for value in (namespace[name] for name in names if name in namespace):
            if _is_starter(value):
                return True
            if inspect.isclass(value):
                methods = [m for m in vars(value).values() if _in_test_tree(m)]
                if any(_starts_processes(method, seen) for method in methods):
                    return True
            elif _in_test_tree(value) and _starts_processes(value, seen):
                return True
    return False


MARKERS_THAT_START_PROCESSES = ("slurm", "cuda", "process")


def _is_process_test(item) -> bool:
    if any(item.get_closest_marker(marker) for marker in MARKERS_THAT_START_PROCESSES):
        return True
    if item.nodeid.split("[")[0] in PROCESS_TESTS:
        return True
    seen: set = set()
    if _starts_processes(getattr(item, "obj", None), seen):
        return True
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(_starts_processes(definition.func, seen)
               for name in getattr(item, "fixturenames", ())
               for definition in definitions.get(name, ()))


def pytest_collection_modifyitems(items):
    for item in items:
        if _is_process_test(item):
            item.add_marker(pytest.mark.process)
        if is_long(item.nodeid):  # the tier outside the default command (tests/long_tier.py)
            item.add_marker(pytest.mark.long)


# The check: while an unmarked test runs, each process start is recorded (by what it runs).
_started: list[str] | None = None


def _recording(original, describe):
    def start(*args, **kwargs):
        if _started is not None:
            what = describe(*args, **kwargs)
            if what is not None:
                _started.append(what)
        return original(*args, **kwargs)
    return start


def _program(popen, args, *rest, **options) -> str | None:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    name = Path(os.fsdecode(argv[0]).split()[0]).name if argv else ""
    return None if name in INCIDENTAL_PROGRAMS else f"`{name}`"


STARTS = (
    (subprocess.Popen, "_execute_child", _program),
    (multiprocessing.process.BaseProcess, "start", lambda *a, **k: "a multiprocessing process"),
    (os, "fork", lambda *a, **k: "os.fork"),
    (os, "posix_spawn", lambda path, *a, **k: f"`{Path(os.fsdecode(path)).name}`"),
)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    global _started
    if item.get_closest_marker("process"):
        return (yield)
    originals = [getattr(owner, name) for owner, name, _ in STARTS]
    for (owner, name, describe), original in zip(STARTS, originals):
        setattr(owner, name, _recording(original, describe))
    _started = []
    try:
        result = yield
    finally:
        for (owner, name, _), original in zip(STARTS, originals):
            setattr(owner, name, original)
        started, _started = _started, None
    if started:
        pytest.fail(f"{item.nodeid} started {started[0]} but is not marked `process`: add it to "
                    "PROCESS_TESTS in tests/conftest.py (or what it calls to PROCESS_CALLABLES).",
                    pytrace=False)
    return result
