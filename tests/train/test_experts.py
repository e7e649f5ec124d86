"""Per-expert statistics of a mixture of experts: the routing tally against the logged per-step
load, the weight norms and τ against the saved checkpoint, the tally across a resume in a fresh
process, the per-expert τ slices of `--collect_tau_stats` with the experts panel of `plot tau`,
and `plot experts` with its refusals. Tiny sparse runs: 8 experts, top-1, no load balancing and
8 tokens a step, so that some experts go unrouted in some steps."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from danastar.analysis import experts, plots, tau
from danastar.train.experts import ExpertTally
from danastar.train.tau_stats import order_indices

from train_helpers import assert_ok, assert_stopped_with_work_left, metrics, run_train

# The module's fixture trains its runs once: keep its tests on one xdist worker, which
# would otherwise train them again.
pytestmark = pytest.mark.xdist_group("experts-runs")

# 8 experts, n_embd 64: the optimizer's groups stay below the size it compiles on a CPU
LAYERS, ROUTED, STEPS = 2, 8, 12
SPARSE = ["--arch", "enoki", "--moe", "--moe_num_experts", str(ROUTED),
          "--moe_num_experts_per_tok", "1", "--moe_softmax_order", "softmax_topk",
          "--moe_aux_loss_factor", "0", f"model.n_layer={LAYERS}", "model.n_embd=64",
          "--batch_size", "1", "--acc_steps", "1", "--sequence_length", "8", "--eval_interval", "1",
          "--iterations", str(STEPS), "checkpoint.latest_every=-1",
          "--omega", "0.4"]  # ω 4 would zero every expert matrix at the first step of 12
STAR = [*SPARSE, "--opt", "dana-star-mk4", "--collect_tau_stats"]  # τ collected at step 10
DENSE = ("--iterations", "40", "checkpoint.latest_every=3")  # test_loop's reference run


def test_the_tally_counts_routed_steps_and_load_and_restores_from_its_state():
    tally = ExpertTally()
    assert tally.shares(2, 3) == ([[0.0] * 3] * 2, [[0.0] * 3] * 2)  # before the first step
    tally.add(None)  # a dense model's step: nothing
    tally.add([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    tally.add([[0.25, 0.0, 0.75], [1.0, 0.0, 0.0]])
    again = ExpertTally(tally.state_dict())
    again.add([[0.0, 0.0, 1.0], [0.0, 0.5, 0.5]])
    routed, load = again.shares(2, 3)
    assert again.steps == 3
    assert routed == [[2 / 3, 1 / 3, 2 / 3], [2 / 3, 1 / 3, 1 / 3]]
    assert np.allclose(load, [[0.25, 0.5 / 3, 1.75 / 3], [2 / 3, 0.5 / 3, 0.5 / 3]])
    assert ExpertTally(None).steps == 0  # a checkpoint from before the tally


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A Dana-Star-MK4 run, the same stopped after 5 steps and resumed in a fresh process, and
    a short AdamW run (no τ)."""
    root = tmp_path_factory.mktemp("experts")
    star, resumed, adamw = root / "star", root / "resumed", root / "adamw"
    assert_ok(run_train(STAR, star))
    assert_stopped_with_work_left(run_train([*STAR, "--iterations_to_run", "5"], resumed))
    assert_ok(run_train(STAR, resumed))
    assert_ok(run_train([*SPARSE, "--opt", "adamw", "--iterations", "4"], adamw))
    return {"star": star, "resumed": resumed, "adamw": adamw}


def entries(run_dir):
    return [(m["step"], m["experts"]) for m in metrics(run_dir) if "experts" in m]


@pytest.mark.slow
def test_the_experts_entry_agrees_with_the_logged_load_the_weights_and_the_optimizer(runs):
    run_dir = runs["star"]
    logged = metrics(run_dir)
    assert [step for step, _ in entries(run_dir)] == list(range(STEPS + 1))  # every evaluation
    assert not any("experts" in m for m in logged if "train_loss" in m)
    step, entry = entries(run_dir)[-1]
    assert step == STEPS and entry["steps"] == STEPS

    # the tally, recomputed from the per-step load of the training records (log_interval 1)
    loads = np.array([m["moe_load"] for m in logged if "train_loss" in m])  # (steps, L, R)
    assert loads.shape == (STEPS, LAYERS, ROUTED)
    assert entry["routed_share"] == ((loads > 0).sum(0) / STEPS).tolist()
    assert np.allclose(entry["load_share"], loads.sum(0) / STEPS, rtol=1e-12)
    assert np.allclose(np.sum(entry["load_share"], axis=1), 1.0)
    routed = np.array(entry["routed_share"])
    assert ((routed > 0) & (routed < 1)).any()  # the sparse regime: experts skip some steps

    state = torch.load(run_dir / "checkpoints" / f"latest-{STEPS:08d}" / "state.pt",
                       weights_only=False)
    index = {name: i for group in state["optimizer"]["param_groups"]
             for name, i in zip(group["names"], group["params"])}
    for layer in range(LAYERS):
        names = [f"blocks.{layer}.mlp.experts.{p}" for p in ("up_proj", "down_proj")]
        weights = [state["model"][name].double() for name in names]
        norms = sum(w.square().sum(dim=(1, 2)) for w in weights).sqrt()
        assert entry["weight_norm"][layer] == pytest.approx(norms.tolist(), rel=1e-5)
        taus = torch.cat([state["optimizer"]["state"][index[name]]["tau"].reshape(ROUTED, -1)
                          for name in names], dim=1).double()
        assert entry["tau_mean"][layer] == pytest.approx(taus.mean(1).tolist(), rel=1e-5)
        assert entry["tau_median"][layer] == pytest.approx(
            np.median(taus.numpy(), axis=1).tolist(), rel=1e-5)
        # an expert never routed has τ = 0 while the optimizer's clock advanced
        for e in np.flatnonzero(routed[layer] == 0):
            assert entry["tau_mean"][layer][e] == 0.0

    adamw = entries(runs["adamw"])[-1][1]
    assert "tau_mean" not in adamw and len(adamw["weight_norm"]) == LAYERS


@pytest.mark.slow
def test_a_resumed_run_continues_the_tally_exactly(runs):
    assert "at step 5" in (runs["resumed"] / "logs" / "rank0.log").read_text()
    assert entries(runs["resumed"]) == entries(runs["star"])  # bitwise on the CPU


@pytest.mark.slow
def test_tau_statistics_hold_each_expert_slice_and_plot_tau_adds_an_experts_panel(runs):
    run_dir = runs["star"]
    (collection,) = tau.read_collections(run_dir)
    assert collection.step == 10
    routed_at_10 = dict(entries(run_dir))[10]["routed_share"]
    for layer in range(LAYERS):
        for proj in ("up_proj", "down_proj"):
            name = f"blocks.{layer}.mlp.experts.{proj}"
            whole = collection.tensors[name]  # kept whole, too
            assert whole["shape"][0] == ROUTED and tau.parameter_type(name) == "experts"
            for e in range(ROUTED):
                part = collection.tensors[f"{name}[{e}]"]
                assert part["shape"].tolist() == whole["shape"][1:].tolist()
                assert part["indices"].tolist() == order_indices(int(np.prod(part["shape"])))\
                    .tolist()
                # an expert's τ is 0 exactly when no token has gone to it yet
                assert (part["largest"][0] > 0) == (routed_at_10[layer][e] > 0), (name, e)
    assert len([n for n in collection.tensors if tau.is_expert_slice(n)]) == LAYERS * 2 * ROUTED

    figure = plots.tau(tau.read_collections(run_dir))
    axes = {ax.get_title().split(" (")[0]: ax for ax in figure.axes
            if ax.get_label() != "<colorbar>"}
    assert list(axes) == ["embedding", "attention", "experts", "MLP", "output"]  # 2×3, by rows
    assert axes["experts"].get_title() == f"experts ({LAYERS * 2 * ROUTED} expert slices, mean " \
        "CDF)"
    assert [len(ax.get_lines()) for ax in axes.values()] == [1] * 5  # one collected step
    f = axes["experts"].get_lines()[0].get_ydata()
    assert np.all(np.diff(f) >= 0) and f[-1] == pytest.approx(1.0)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "danastar", *map(str, args)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_plot_experts_of_two_runs_and_its_refusals(runs, reference_runs, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "experts"
    result = cli("plot", "experts", runs["star"], runs["adamw"], "--out", out)
    assert result.returncode == 0, result.stderr
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"

    snapshots = experts.snapshots([runs["star"], runs["adamw"]])
    assert [s.step for s in snapshots] == [STEPS, 4]  # the last entry of each
    tau_ax, norm_ax = plots.experts(snapshots).axes
    assert tau_ax.get_yscale() == "log" and tau_ax.get_ylabel().startswith("mean τ")
    assert norm_ax.get_ylabel().startswith("weight norm")
    for ax in (tau_ax, norm_ax):
        assert ax.get_xlabel().startswith("ρ_e = share of steps")

    def points(ax):
        return sum(len(c.get_offsets()) for c in ax.collections)

    assert points(tau_ax) == LAYERS * ROUTED  # Dana-Star-MK4 alone has a τ
    assert points(norm_ax) == 2 * LAYERS * ROUTED
    labels = norm_ax.get_legend_handles_labels()[1]
    assert labels[0].startswith("Dana-Star-MK4 lr=") and labels[1].startswith("AdamW lr=")
    assert experts.snapshot(runs["star"], step=3).entry == dict(entries(runs["star"]))[3]

    cases = [
        ([reference_runs(DENSE)], "needs a mixture-of-experts run (--moe)"),
        ([tmp_path / "nowhere"], "does not exist"),
        ([runs["adamw"], "--step", "7"], "--step takes one of its evaluation steps: 0, 1, 2"),
    ]
    for args, message in cases:
        result = cli("plot", "experts", *args, "--out", tmp_path / "refused")
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "refused.png").exists()
