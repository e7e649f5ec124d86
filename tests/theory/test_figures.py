import json

import pytest

from danastar.cli import main
from danastar.theory import figures

pytest.importorskip("matplotlib")


def labels(figure):
    return [line.get_label() for line in figure.axes[0].get_lines()]


def test_compare_command_writes_the_figure_and_its_data(tmp_path, capsys):
    code = main(["theory", "compare", "--d", "40", "--T", "2000", "--sim-steps", "300",
                 "--seeds", "2", "--optim", "adana:lr=1e-3,kappa=0.5", "--out", str(tmp_path)])
    assert code == 0
    assert (tmp_path / "compare.png").stat().st_size > 10_000
    data = json.loads((tmp_path / "compare.json").read_text())
    assert [m["key"] for m in data["methods"]] == list(figures.COMPARE_METHODS)
    assert data["ode_times"][-1] == 2000 and data["sim_times"][-1] == 300
    assert data["optimizers"][0]["hparams"] == {"kappa": 0.5}
    shown = labels(figures.plot_compare(data))
    for name in ("SGD", "SGD + momentum 0.9", "DANA-constant", "DANA-decaying", "AdEMAMix",
                 "R∞ (this W)"):
        assert name in shown
    legend = [t.get_text() for t in figures.plot_compare(data).axes[0].get_legend().get_texts()]
    assert any(text.startswith("adana (danastar.optim") for text in legend)


def test_exponents_command_prints_the_table(tmp_path, capsys):
    assert main(["theory", "exponents", "--d", "100", "--T", "1e4", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| SGD |" in out and "predicted" in out
    data = json.loads((tmp_path / "exponents.json").read_text())
    shown = labels(figures.plot_exponents(data))
    assert "SGD" in shown and "DANA-decaying" in shown
    assert any(label.startswith("predicted SGD") for label in shown)


def test_scaling_and_kappa_commands(tmp_path):
    assert main(["theory", "scaling", "--ds", "30,60", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "scaling.json").read_text())
    assert set(data["envelopes"]) == set(figures.SCALING_METHODS)
    assert sum("envelope" in label for label in labels(figures.plot_scaling(data))) == 3
    assert main(["theory", "kappa", "--d", "50", "--T", "1000", "--kappas", "0,0.3,0.6",
                 "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "kappa.json").read_text())
    assert data["kappas"] == [0, 0.3, 0.6] and len(data["horizons"]) == 3
    assert [label for label in labels(figures.plot_kappa(data)) if label.startswith("t =")] == [
        "t = 1e+01", "t = 1e+02", "t = 1e+03"]


@pytest.mark.parametrize("argv,needle", [
    (["compare", "--alpha", "-1"], "--alpha must be > 0"),
    (["compare", "--d", "100", "--v", "50"], "--v must be >= d"),
    (["compare", "--T", "0"], "--T must be"),
    (["compare", "--optim", "adana"], "needs a learning rate"),
    (["compare", "--optim", "nosuch:lr=1"], "unknown optimizer"),
    (["scaling", "--ds", "100"], "--ds needs two or more"),
    (["kappa", "--kappas", "a,b"], "--kappas must be comma-separated numbers"),
])
def test_user_errors_are_one_sentence_and_exit_2(argv, needle, capsys, tmp_path):
    assert main(["theory", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
