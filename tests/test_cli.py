import subprocess
import sys

import pytest

from danastar.cli import COMMAND_EXTRAS, SUBCOMMANDS, main
from danastar.extras import EXTRA_MODULES, MissingExtra, missing_optional_module


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


def run_without(modules: list[str], argv: list[str]) -> subprocess.CompletedProcess:
    """The command line in a fresh interpreter where ``modules`` cannot be imported, as in an
    install without the extra that brings them (tests/test_packaging.py runs a real one)."""
    code = (f"import sys\nfor name in {modules!r}: sys.modules[name] = None\n"
            f"from danastar.cli import main\nsys.exit(main({argv!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_a_command_without_its_extra_names_it_in_one_sentence():
    for argv, hidden, extra in ((["train", "--dry_run"], ["omegaconf"], "train"),
                                (["prepare", "shakespeare"], ["tiktoken", "numpy"], "train"),
                                (["results", "runs"], ["scipy"], "analysis"),
                                (["theory", "compare"], ["scipy"], "theory")):
        result = run_without(hidden, argv)
        assert result.returncode == 2, (argv, result.stderr)
        assert result.stderr == (f"danastar {argv[0]} needs the {extra!r} extra: "
                                 f"pip install 'danastar[{extra}]'\n"), (argv, result.stderr)


def test_only_a_missing_optional_package_is_an_extra_to_name():
    assert missing_optional_module(ModuleNotFoundError("x", name="scipy.optimize")) == "scipy"
    assert missing_optional_module(MissingExtra("danastar.x", "train", "yaml")) == "yaml"
    # Anything else is a bug or a broken install: the command line lets it raise.
    assert missing_optional_module(ModuleNotFoundError("x", name="danastar.nothing")) is None
    assert missing_optional_module(ImportError("cannot import name 'f' from 'numpy'")) is None


def test_every_extra_module_is_installed_by_its_extra_in_pyproject():
    """danastar.extras' import names match pyproject.toml's extras (one source per fact)."""
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    distribution = {"yaml": "pyyaml"}
    for extra, modules in EXTRA_MODULES.items():
        names = set()
        for requirement in extras[extra]:
            if requirement.startswith("danastar["):
                for included in requirement[len("danastar["):-1].split(","):
                    names |= {r.split(">")[0] for r in extras[included]}
            names.add(requirement.split(">")[0])
        assert {distribution.get(m, m) for m in modules} <= names, extra
    assert set(COMMAND_EXTRAS) == set(SUBCOMMANDS) and set(COMMAND_EXTRAS.values()) <= set(
        EXTRA_MODULES)


def test_output_into_a_closed_pipe_ends_quietly():
    """`danastar train --dry_run --json | head -1`: the reader goes away before the output is
    written; the command stops without a traceback, with the code a shell gives SIGPIPE."""
    process = subprocess.Popen([sys.executable, "-m", "danastar", "train", "--dry_run", "--json",
                                "--config", "synthetic_smoke"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # long before the plan is printed
    errors = process.stderr.read()
    assert process.wait(timeout=300) == 141, errors
    assert "Traceback" not in errors and "BrokenPipe" not in errors, errors


def command_help(argv: list[str], capsys) -> str:
    try:
        code = main([*argv, "--help"])
    except SystemExit as stop:  # argparse's own exit after printing the help
        code = stop.code
    captured = capsys.readouterr()
    assert code == 0 and not captured.err, (argv, captured.err)
    return captured.out


def test_every_commands_help_renders(capsys):
    """argparse formats help with %: a stray one printed a dict of argparse's internals in
    `danastar train --help`. Each command's help (and each theory figure's) renders whole."""
    from danastar.commands import theory

    commands = [[name] for name in SUBCOMMANDS]
    commands += [["theory", name] for name in theory.FIGURES]
    for argv in commands:
        out = command_help(argv, capsys)
        assert out.startswith("usage: danastar") and "option_strings" not in out, argv
    assert "i % step == 0" in command_help(["train"], capsys)


def test_the_overview_names_every_plot_kind(capsys):
    from danastar.commands.plot import KINDS

    assert main(["--help"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "  plot " in line)
    assert all(kind in line.replace(",", " ").split() for kind in KINDS), line
