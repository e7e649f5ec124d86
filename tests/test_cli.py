import subprocess
import sys

from danastar.cli import SUBCOMMANDS, main


def test_help_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert name in out


def test_unknown_command_is_one_sentence_and_exit_2(capsys):
    assert main(["trian"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'trian'" in err and "train" in err


def test_module_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "danastar", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout.strip()
