"""The run directory's protocol is the ground floor: what `train` writes and `launch` reads
comes from `rundir`, which imports nothing of danastar above `errors` and `durable`; its exit
codes and stop signals."""

import ast
import signal
from pathlib import Path

import pytest

import danastar
from danastar.errors import UserError
from danastar.rundir import exits
from danastar.train import signals

SOURCE = Path(danastar.__file__).resolve().parent
GROUND = {"danastar.errors", "danastar.durable"}


def danastar_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "danastar"}


def test_rundir_imports_only_the_ground_floor():
    for path in sorted((SOURCE / "rundir").glob("*.py")):
        above = {name for name in danastar_imports(path)
                 if name not in GROUND and not name.startswith("danastar.rundir")}
        assert not above, f"{path.name} imports {sorted(above)}"


def test_launch_learns_the_protocol_from_rundir_not_from_train():
    """`launch` may plan through `train`, but exit codes, signals, status and the STOP file it
    reads from `rundir` alone."""
    protocol_in_train = {"danastar.train.signals"}
    for path in sorted((SOURCE / "launch").glob("*.py")):
        assert not danastar_imports(path) & protocol_in_train, path.name
    assert "danastar.rundir.exits" in danastar_imports(SOURCE / "launch" / "local.py")
    assert "danastar.rundir.status" in danastar_imports(SOURCE / "launch" / "slurm.py")


def test_the_exit_codes_say_done_user_error_more_to_do_and_ctrl_c_apart():
    codes = exits.EXPLAINED_EXIT_CODES
    assert len(set(codes)) == 4 and exits.COMPLETE_EXIT_CODE == 0
    assert exits.USER_ERROR_EXIT_CODE == UserError.exit_code
    assert exits.INTERRUPTED_EXIT_CODE == 128 + signal.SIGINT  # what shells report for Ctrl-C
    assert exits.PREEMPTED_EXIT_CODE not in (0, 1, UserError.exit_code)
    assert exits.PREEMPTED_EXIT_CODE < 128  # not mistaken for a death by a signal
    assert set(exits.STOP_SIGNALS) == {*exits.PREEMPTION_SIGNALS, signal.SIGINT}


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, exits.PREEMPTED_EXIT_CODE),
                                       (signal.SIGUSR1, exits.PREEMPTED_EXIT_CODE),
                                       (signal.SIGINT, exits.INTERRUPTED_EXIT_CODE)])
def test_a_stop_signal_sets_the_flag_and_its_exit_code(sig, code):
    flag = signals.PreemptionFlag(announce=False).install()
    try:
        signal.raise_signal(sig)
        assert flag.is_set and flag.received == sig and flag.exit_code == code
    finally:
        flag.uninstall()

