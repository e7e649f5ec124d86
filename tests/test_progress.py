"""danastar.progress: a command's stages said on standard error, their loops counted by a bar
on a terminal only."""

from __future__ import annotations

import io
import sys

from danastar.progress import SILENT, Stages, bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_stage_is_one_line_on_stderr_and_silent_says_nothing(capsys):
    Stages("danastar theory").start("solving the ODE of 5 methods")
    SILENT.start("anything")
    assert list(SILENT.counted(range(3), 3, "step")) == [0, 1, 2]
    captured = capsys.readouterr()
    assert captured.err == "danastar theory: solving the ODE of 5 methods ...\n"
    assert captured.out == ""


def test_steps_are_counted_by_a_bar_on_a_terminal_only(capsys, monkeypatch):
    stages = Stages("danastar theory")
    assert list(stages.counted(iter("abc"), 3, "step")) == ["a", "b", "c"]
    assert capsys.readouterr().err == ""  # a pipe or a file: no bar redrawn in it
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert list(stages.counted(iter("abc"), 3, "step")) == ["a", "b", "c"]
    drawn = terminal.getvalue()
    assert "theory:" in drawn and "0/3" in drawn and "step" in drawn


def test_a_bar_is_disabled_off_a_terminal_and_when_not_enabled():
    assert bar(3, desc="x", unit="step", file=io.StringIO()).disable
    assert bar(3, desc="x", unit="step", file=Terminal(), enabled=False).disable
    assert not bar(3, desc="x", unit="step", file=Terminal()).disable


def test_a_stage_that_may_end_in_a_refusal_is_said_on_a_terminal_only(capsys, monkeypatch):
    stages = Stages("danastar train")
    stages.start("planning the run", only_on_terminal=True)
    assert capsys.readouterr().err == ""  # a refusal that follows stays one sentence alone
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    stages.start("planning the run", only_on_terminal=True)
    assert terminal.getvalue() == "danastar train: planning the run ...\n"
