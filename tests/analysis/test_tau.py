"""The τ figure (`danastar plot tau`): the CDF rebuilt from order statistics, τ̃, the grouping by
parameter type, checked by hand; the figure from synthetic files and from a real Dana-Star run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from danastar.analysis import plots, tau
from danastar.models import build_model
from danastar.train.tau_stats import order_statistics

pytest.importorskip("matplotlib")


def test_cdf_points_place_the_kth_smallest_and_largest():
    # n = 10, I = [0, 1, 2]: smallest at ranks 0, 1, 2 -> 0.1, 0.2, 0.3; largest at ranks
    # 9, 8, 7 -> (10 - I)/10 = 1.0, 0.9, 0.8
    x, f = tau.cdf_points([0.01, 0.02, 0.03], [0.9, 0.8, 0.7], [0, 1, 2], 10)
    assert x.tolist() == [0.01, 0.02, 0.03, 0.7, 0.8, 0.9]
    assert np.allclose(f, [0.1, 0.2, 0.3, 0.8, 0.9, 1.0])
    # n = 3, every index from both ends: each rank once
    x, f = tau.cdf_points([1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [0, 1, 2], 3)
    assert x.tolist() == [1.0, 2.0, 3.0] and np.allclose(f, [1 / 3, 2 / 3, 1])


def test_cdf_points_agree_with_the_empirical_cdf_of_the_kept_order_statistics():
    values = torch.rand(37, 11, generator=torch.Generator().manual_seed(0))
    stats = order_statistics(values)
    x, f = tau.cdf_points(stats["smallest"], stats["largest"], stats["indices"], values.numel())
    ordered = np.sort(values.numpy().reshape(-1))
    assert np.allclose(f, [np.mean(ordered <= v) for v in x])


def test_regularised_tau_is_capped_odds_with_a_floor_of_one_over_one_plus_t():
    got = tau.regularised([0.0, 0.05, 0.25, 0.5, 0.9], step=9)
    # floor 1/10; 0.05/0.95 = 0.0526 < 0.1 -> floor; 0.25/0.75 = 1/3; τ >= ½ -> odds 1
    assert np.allclose(got, [0.1, 0.1, 1 / 3, 1.0, 1.0])
    assert np.allclose(tau.regularised([0.05], step=99), [0.05 / 0.95])


def test_tensor_cdf_keeps_the_highest_fraction_at_a_tie():
    # n = 6, τ = 0, 0, 0.2, 0.25, 0.6, 0.7 kept whole; at t = 3 the floor is 1/4, so τ = 0, 0
    # and 0.2 (odds 0.25) all sit at τ̃ = 0.25 -> F = 3/6; 0.25 -> 1/3 at 4/6; ½ and above -> 1
    arrays = {"smallest": np.array([0.0, 0.0, 0.2]), "largest": np.array([0.7, 0.6, 0.25]),
              "indices": np.array([0, 1, 2]), "shape": np.array([2, 3])}
    x, f = tau.tensor_cdf(arrays, step=3)
    assert np.allclose(x, [0.25, 1 / 3, 1.0]) and np.allclose(f, [0.5, 4 / 6, 1.0])


def test_mean_cdf_averages_at_the_union_of_points():
    first = (np.array([1.0, 4.0]), np.array([0.5, 1.0]))
    second = (np.array([2.0]), np.array([1.0]))
    x, f = tau.mean_cdf([first, second])
    # at 1: (0.5 + 0) / 2; at 2 (halfway in log between 1 and 4): (0.75 + 1) / 2; at 4: 1
    assert x.tolist() == [1.0, 2.0, 4.0] and np.allclose(f, [0.25, 0.875, 1.0])


def test_parameter_types_of_enoki_and_qwen3():
    shape = dict(n_layer=1, n_head=2, n_embd=8, head_dim=4, mlp_hidden=16, vocab_size=64,
                 max_seq_len=16)
    for arch, attention, mlp in (("enoki", 2, 2), ("qwen3", 4, 3)):
        names = [name for name, _ in build_model(arch, **shape).named_parameters()]
        kinds = [tau.parameter_type(name) for name in names]
        assert kinds.count("embedding") == 1 and kinds.count("output") == 1, arch
        assert kinds.count("attention") == attention and kinds.count("MLP") == mlp, arch
        assert "other" not in kinds and tau.parameter_type("embed.weight") == "embedding"
    assert tau.parameter_type("blocks.3.attn.q_norm.weight") == "norm"
    assert tau.parameter_type("blocks.3.self_attn.o_proj.weight") == "attention"
    assert tau.parameter_type("lm_head.weight") == "output"


def test_routed_experts_and_their_slices_are_their_own_type_shared_experts_stay_mlp():
    assert tau.parameter_type("blocks.0.mlp.experts.up_proj") == "experts"
    assert tau.parameter_type("blocks.2.mlp.experts.down_proj[11]") == "experts"
    assert tau.parameter_type("blocks.0.mlp.shared_experts.up_proj") == "MLP"
    assert tau.parameter_type("blocks.0.mlp.shared_expert.up_proj.weight") == "MLP"
    assert tau.parameter_type("blocks.0.mlp.router.weight") == "MLP"
    names = ["blocks.0.mlp.experts.up_proj", "blocks.0.mlp.experts.up_proj[0]",
             "blocks.0.mlp.experts.up_proj[1]", "lm_head.weight"]
    groups = tau.panel_tensors(names)  # the experts panel averages the slices
    assert groups == {"experts": names[1:3], "output": ["lm_head.weight"]}
    assert tau.panel_tensors(names[:1]) == {"experts": names[:1]}  # no slices: the whole


NAMES = ("embed.weight", "blocks.0.attn.qkv_proj.weight", "blocks.0.attn.o_proj.weight",
         "blocks.0.mlp.up_proj.weight", "blocks.0.mlp.down_proj.weight",
         "blocks.0.attn_norm.weight", "lm_head.weight")


def write_collections(run_dir: Path, steps=(10, 20, 40), names=NAMES) -> None:
    directory = run_dir / "tau_stats"
    directory.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    for step in steps:
        arrays = {}
        for name in names:
            shape = (8,) if "norm" in name else (16, 8)
            # τ drifting up with the step, different per tensor
            values = torch.rand(shape, generator=generator) * 0.3 + step / 100
            for key, value in order_statistics(values).items():
                arrays[f"{name}::{key}"] = value
        np.savez(directory / f"step-{step:08d}.npz", **arrays)


def check_tau_figure(figure, steps: int, panels=4):
    axes = [ax for ax in figure.axes if ax.get_label() != "<colorbar>"]
    assert len(axes) == panels
    for ax in axes:
        assert ax.get_xscale() == "log" and ax.get_yscale() == "logit"
        assert np.allclose(ax.get_ylim(), (0.001, 0.999))
        assert ax.get_xlabel().startswith("τ̃ = max(min(τ,½)")
        assert ax.get_ylabel() == "fraction of coordinates ≤ τ̃"
        assert len(ax.get_lines()) == steps
        for line in ax.get_lines():
            f = np.asarray(line.get_ydata())
            assert np.all(np.diff(f) >= 0) and f[-1] == pytest.approx(1.0)
    return axes


def test_summary_and_single_parameter_figures_from_synthetic_files(tmp_path):
    write_collections(tmp_path)
    collections = tau.read_collections(tmp_path)
    assert [c.step for c in collections] == [10, 20, 40]
    axes = check_tau_figure(plots.tau(collections), steps=3)
    assert [ax.get_title() for ax in axes] == [
        "embedding (1 tensor, mean CDF)", "attention (2 tensors, mean CDF)",
        "MLP (2 tensors, mean CDF)", "output (1 tensor, mean CDF)"]
    # later steps are drawn in darker colours of one sequential map
    brightness = [sum(line.get_color()[:3]) for line in axes[0].get_lines()]
    assert brightness == sorted(brightness, reverse=True)
    (ax,) = check_tau_figure(plots.tau(collections, param="blocks.0.attn_norm.weight"), 3, 1)
    assert ax.get_title() == "blocks.0.attn_norm.weight"


def test_tied_embeddings_leave_the_output_panel_empty(tmp_path):
    write_collections(tmp_path, steps=(10,), names=NAMES[:-1])
    axes = [ax for ax in plots.tau(tau.read_collections(tmp_path)).axes
            if ax.get_label() != "<colorbar>"]
    assert [len(ax.get_lines()) for ax in axes] == [1, 1, 1, 0]
    assert axes[3].get_title() == "output (0 tensors, mean CDF)"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "danastar", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_plot_tau_refuses_bad_input_in_one_sentence(tmp_path):
    write_collections(tmp_path / "run")
    (tmp_path / "untraced").mkdir()
    (tmp_path / "corrupt" / "tau_stats").mkdir(parents=True)
    (tmp_path / "corrupt" / "tau_stats" / "step-00000010.npz").write_text("cut short")
    cases = [
        (["plot", "tau", str(tmp_path / "untraced")], "train it with --collect_tau_stats"),
        (["plot", "tau", str(tmp_path / "run"), "--param", "blocks.9.nope"],
         "--param takes one of: blocks.0.attn.o_proj.weight, "),
        (["plot", "tau", str(tmp_path / "run"), str(tmp_path / "run")], "one run directory"),
        (["plot", "tau", str(tmp_path / "corrupt")], "is not a readable τ statistics file"),
    ]
    for args, message in cases:
        result = cli(*args, "--out", str(tmp_path / "f"))
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "f.png").exists()


def test_plot_tau_of_a_real_dana_star_run(tmp_path):
    # as tests/train/test_tau_stats.py: a tiny model, evaluations 10 and 20 collected
    run_dir = tmp_path / "run"
    trained = cli("train", "--dataset", "synthetic", "--heads", "2", "--batch_size", "4",
                  "--sequence_length", "32", "--no_wandb", "train.eval_batches=2",
                  "train.final_eval_batches=2", "train.sample_tokens=0", "logging.progress=false",
                  "--opt", "dana-star-mk4", "--collect_tau_stats", "--eval_interval", "1",
                  "--iterations", "21", "checkpoint.latest_every=-1", "--run_dir", str(run_dir))
    assert trained.returncode == 0, trained.stderr[-3000:]
    out = tmp_path / "figs" / "tau"
    result = cli("plot", "tau", str(run_dir), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert out.with_suffix(".pdf").stat().st_size > 10_000
    collections = tau.read_collections(run_dir)
    axes = check_tau_figure(plots.tau(collections, title="run"), steps=2)  # steps 10 and 20
    assert [ax.get_title().split(" (")[0] for ax in axes] == list(tau.TYPES)
    assert "blocks.0.mlp.up_proj.weight" in collections[0].tensors
