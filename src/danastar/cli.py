"""The `danastar` command: a thin dispatcher to each subcommand's own `main(argv)`.

Subcommands are imported lazily so that `danastar prepare` does not pay for importing the
training engine and `--help` stays instant.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

from danastar import __version__
from danastar.errors import UserError, report
from danastar.extras import missing_optional_module, needs_extra

# subcommand -> (module, one-line help). Each module exposes `main(argv: list[str]) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "danastar.commands.train",
        "train a model (the main job; no arguments: a CPU run on Shakespeare)",
    ),
    "prepare": ("danastar.commands.prepare", "tokenise a corpus into token files + meta.json"),
    "submit": (
        "danastar.commands.submit",
        "train on SLURM as a job that requeues itself until the run is complete",
    ),
    "sweep": ("danastar.commands.sweep", "train every run of a sweep file (grid of configs) here"),
    "generate": ("danastar.commands.generate", "sample text from a trained run's checkpoint"),
    "export": ("danastar.commands.export", "write a run's model in the Hugging Face format"),
    "eval": ("danastar.commands.eval", "score a run or an export on lm-eval tasks"),
    "clusters": ("danastar.commands.clusters", "list cluster profiles; --check: their capacity"),
    "results": ("danastar.commands.results", "table of runs: best LR per size, seeds, multipliers"),
    "plot": (
        "danastar.commands.plot",
        "figures: scaling, within-size, curves, lrlaw, lr-sweep, lr-sensitivity, tau, experts",
    ),
    "theory": (
        "danastar.commands.theory",
        "figures of the PLRF model: SGD vs DANA, scaling, exponents, kappa",
    ),
}

# subcommand -> the extra that installs what it imports (pyproject.toml; danastar.extras): a
# command run without it says so in one sentence, exit 2.
COMMAND_EXTRAS: dict[str, str] = {
    "train": "train", "prepare": "train", "submit": "train", "sweep": "train",
    "generate": "train", "clusters": "train", "results": "analysis", "plot": "plots",
    "theory": "theory", "export": "export", "eval": "eval",
}


def usage() -> str:
    lines = [f"danastar {__version__}", "", "usage: danastar <command> [options]", "", "commands:"]
    width = max(len(name) for name in SUBCOMMANDS)
    lines += [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in SUBCOMMANDS.items()]
    lines += ["", "Run `danastar <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] == "--version":
        print(__version__)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in SUBCOMMANDS:
        print(
            f"danastar: unknown command {command!r}; choose one of: {', '.join(SUBCOMMANDS)}.",
            file=sys.stderr,
        )
        return 2
    try:
        module = import_deferring_ctrl_c(SUBCOMMANDS[command][0])
        if module is None:
            raise KeyboardInterrupt
        return int(module.main(rest) or 0)
    except UserError as error:
        return report(error, command)
    except ImportError as error:
        if missing_optional_module(error) is None:
            raise  # not a missing extra: a bug or a broken install, with its traceback
        print(needs_extra(f"danastar {command}", COMMAND_EXTRAS[command]), file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the shell's code, no traceback
        print(f"\ndanastar {command}: interrupted (Ctrl-C).", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`danastar ... | head`): as a Unix tool, stop quietly.
        # Standard output is pointed at /dev/null so that Python's final flush does not fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what the shell reports for a command killed by it


def import_deferring_ctrl_c(name: str):
    """Import a subcommand; None if Ctrl-C was pressed meanwhile. A KeyboardInterrupt inside an
    import can leave a C extension half-initialised (numpy then fails with an ImportError and a
    traceback), so Ctrl-C is noted and honoured once the import is done."""
    pressed: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.default_int_handler:
        signal.signal(signal.SIGINT, lambda signum, _frame: pressed.append(signum))
    try:
        module = importlib.import_module(name)
    finally:
        if previous is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous)
    return None if pressed else module


if __name__ == "__main__":
    raise SystemExit(main())
