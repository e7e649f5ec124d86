import json
import os
import subprocess
import sys

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
    # each stage said as it starts (its steps counted by a bar on a terminal only)
    assert capsys.readouterr().err.splitlines() == [
        "danastar theory: drawing W, a 200 × 40 random-feature matrix, and its SVD ...",
        "danastar theory: solving the ODE of 5 methods at d = 40, up to t = 2,000 ...",
        "danastar theory: simulating 2 runs of each of 6 methods for 300 steps ..."]
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
    assert "adana (danastar.optim, lr 0.001, κ=0.5)" in legend  # its options, κ included
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figure = figures.plot_compare(data)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()  # the legend beside the axes, over no line or point
    ax = figure.axes[0]
    renderer = canvas.get_renderer()
    assert ax.get_legend().get_window_extent(renderer).x0 > ax.get_window_extent(renderer).x1
    assert "will take about" not in capsys.readouterr().err  # a quick run: no warning


def test_compare_with_optim_warns_before_a_run_of_minutes(tmp_path):
    """The default size (d = 500, 10^5 steps, 5 seeds) takes minutes per --optim optimizer:
    the warning comes before the work (the run is stopped once it is read)."""
    assert figures.optimizer_seconds(500, 5, 100_000, 1) > 120
    assert figures.optimizer_seconds(40, 2, 300, 1) < 1
    process = subprocess.Popen(
        [sys.executable, "-m", "danastar", "theory", "compare", "--optim", "adana:lr=1e-3",
         "--optim", "adamw:lr=1e-3", "--out", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        first = process.stderr.readline()
    finally:
        process.kill()
        process.wait()
    assert first.startswith("danastar theory: the 2 --optim run(s) will take about ")
    assert "minutes (100,000 steps x 5 seeds at d = 500" in first and "--sim-steps 1e4" in first
    assert not (tmp_path / "compare.png").exists()


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
    (["compare", "--alpha", "-1"], "--alpha must be a finite number > 0"),
    (["compare", "--alpha", "inf"], "--alpha must be a finite number > 0, got inf."),
    (["compare", "--d", "100", "--v", "50"], "--v must be >= d"),
    (["compare", "--T", "0"], "--T must be"),
    (["compare", "--optim", "adana"], "needs a learning rate"),
    (["compare", "--optim", "nosuch:lr=1"], "unknown optimizer"),
    (["scaling", "--ds", "100"], "--ds needs two or more"),
    (["kappa", "--kappas", "a,b"], "--kappas must be comma-separated numbers"),
    # parsed and range-checked before any work
    (["scaling", "--ds", "20,20"], "--ds lists 20 twice; give each value once."),
    (["scaling", "--ds", "20.5,40"], "--ds must be comma-separated whole numbers"),
    (["scaling", "--ds", "2,4", "--T-factor", "1e300"],
     "the largest size's horizon T-factor·d^(2α) is about 10^301 steps"),
    (["kappa", "--kappas", "2"], "--kappas must lie in [0, 1)"),
    (["kappa", "--kappas", ""], "--kappas is empty; give comma-separated numbers"),
    (["kappa", "--kappas", "0.5,nan"], "--kappas must hold finite numbers, got 'nan'."),
    (["compare", "--T", "1e300"], "--T must be a number of steps from 1 to 1e+15, got 1e+300."),
    (["compare", "--d", "3000", "--alpha", "3"], "the default horizon T = d^(2α) is about 10^21"),
    (["compare", "--optim", "adana:lr=abc"], "lr must be a number > 0, e.g. adana:lr=1e-3."),
    (["compare", "--optim", "adana:lr=nan"], "lr must be a number > 0"),
    (["compare", "--optim", "adana:lr=1e-3,foo=2"], "unknown hyperparameter(s) foo"),
    (["compare", "--optim", "adana:lr=1e-3,kappa=5"], "kappa must be in (0, 1]"),
    (["compare", "--optim", "adana:lr=1e-3,lr=2"], "sets lr twice; give it once."),
    (["compare", "--optim", "adana:=3,lr=1"], "write options as key=value"),
    (["compare", "--seed", "-1"], "--seed must be >= 0"),
    # a draw of 5e6 x 1e6 float64 features: refused before it is attempted
    (["compare", "--d", "1000000"], "--d 1000000 with v = 5000000 draws a v × d random-feature "
                                    "matrix and takes its SVD, about 223,517.4 GiB"),
])
def test_user_errors_are_one_sentence_and_exit_2(argv, needle, capsys, tmp_path):
    assert main(["theory", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_the_output_folder_is_created_or_refused_before_any_work(tmp_path, capsys):
    kappa = ["theory", "kappa", "--d", "20", "--T", "100", "--kappas", "0.5"]
    out = tmp_path / "new" / "figures"  # a missing folder is created, as train does
    assert main([*kappa, "--out", str(out)]) == 0
    assert (out / "kappa.png").exists() and (out / "kappa.json").exists()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("kept")
    cases = {str(a_file): f"--out {a_file} is a file; give --out a folder.",
             str(a_file / "sub"): f"--out {a_file / 'sub'} cannot be written: {a_file} is a "
                                  "file, not a folder"}
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        cases[str(locked / "f")] = f"cannot be written: {locked} does not take new files"
    elif not os.access("/proc/sys", os.W_OK):  # chmod does not stop root; a read-only fs does
        cases["/proc/sys/f"] = "cannot be written: /proc/sys does not take new files"
    for path, message in cases.items():
        assert main([*kappa, "--out", path]) == 2
        assert message in capsys.readouterr().err
    assert a_file.read_text() == "kept"
