"""`danastar theory compare --framework jax`: the simulator runs the optax optimizers, and its
curves are the torch optimizers' curves."""

import json

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("matplotlib")

from danastar.cli import main  # noqa: E402
from danastar.theory import PLRF, TorchOptimizer, figures, simulate  # noqa: E402

OPTIMIZERS = [TorchOptimizer("adana", 2e-3, {"kappa": 0.5}),
              TorchOptimizer("dana-star-mk4", 2e-3, {"omega": 4.0, "total_steps": 400.0})]


def test_the_simulator_gives_the_same_curves_with_either_framework():
    """Both step in float64 on the same data; each step's gradient comes from the optimizer's
    own parameters, so a rounding difference feeds back, but through a convex quadratic: the
    risks agree to far below the seeds' spread (1e-9 relative; they differ at 2e-15 here)."""
    model = PLRF(1.0, 0.3, 30, 150, seed=0)
    runs = {framework: simulate(model, batch=2, steps=400, seeds=2, seed=1,
                                optimizers=OPTIMIZERS, framework=framework)
            for framework in ("torch", "jax")}
    torch_risks, jax_risks = runs["torch"].risks, runs["jax"].risks
    assert np.all(torch_risks[:, :, -1] < 0.7 * torch_risks[:, :, 0])  # they did learn
    np.testing.assert_allclose(jax_risks, torch_risks, rtol=1e-9, atol=0)
    assert not jax.config.jax_enable_x64  # x64 only while the run lasted


def test_the_compare_figure_names_the_framework(tmp_path):
    code = main(["theory", "compare", "--d", "30", "--T", "300", "--sim-steps", "300",
                 "--seeds", "2", "--dtau", "1e-2", "--framework", "jax",
                 "--optim", "dana-mk4:lr=1e-3,kappa=0.5", "--out", str(tmp_path)])
    assert code == 0
    data = json.loads((tmp_path / "compare.json").read_text())
    assert data["optimizers"][0]["framework"] == "jax"
    legend = [t.get_text() for t in figures.plot_compare(data).axes[0].get_legend().get_texts()]
    assert "dana-mk4 (danastar.optax, lr 0.001, κ=0.5)" in legend


@pytest.mark.parametrize("optim, needle", [
    ("adamw:lr=1e-3", "--framework jax has adana, dana-mk4, dana-star, dana-star-mk4 "
                      "(danastar.optax); run adamw with --framework torch."),
    ("adana:lr=1e-3,kappa=5", "kappa must be in (0, 1]"),
    ("adana:lr=1e-3,foo=2", "unexpected keyword argument 'foo'"),
    ("adana:lr=-1", "lr must be a number > 0"),
])
def test_framework_jax_refuses_what_it_cannot_run_in_one_sentence(optim, needle, tmp_path,
                                                                   capsys):
    assert main(["theory", "compare", "--framework", "jax", "--optim", optim,
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not list(tmp_path.iterdir())
