"""The dry run's time estimate times a stand-in of the planned model: one block of each kind it
has, with the whole model's widths, so that its passes run the same matrix shapes (docs/training.md,
"--dry_run")."""

import dataclasses
import types

import pytest
import torch

from danastar.cli import main as danastar_main
from danastar.models import ModelConfig, build_model
from danastar.train.estimate import how_measured, timing_stand_in


def model(arch: str, heads: int, **overrides) -> ModelConfig:
    return ModelConfig.from_heads(arch, heads, vocab_size=1000, max_seq_len=256, **overrides)


def shapes(config: ModelConfig, block: int) -> dict[str, tuple]:
    """The parameters' shapes of one block, and of everything outside the blocks."""
    with torch.device("meta"):
        built = build_model(config)
    inside = {name.split(".", 2)[2]: tuple(p.shape)
              for name, p in built.named_parameters() if name.startswith(f"blocks.{block}.")}
    outside = {name: tuple(p.shape)
               for name, p in built.named_parameters() if not name.startswith("blocks.")}
    return inside | outside


@pytest.mark.parametrize("arch, heads, overrides, kinds", [
    ("enoki", 12, {}, [False]),
    ("qwen3", 8, {}, [False]),
    ("enoki", 8, {"moe": True, "moe_num_experts": 4}, [True]),
    ("qwen3next", 6, {"moe": True, "moe_num_experts": 4, "mlp_only_layers": [0, 3]},
     [True, False]),
    ("qwen3next", 6, {"moe": True, "moe_num_experts": 4, "decoder_sparse_step": 2},
     [True, False]),
])
def test_the_stand_in_keeps_one_block_of_each_kind_with_the_models_shapes(arch, heads, overrides,
                                                                         kinds):
    full = model(arch, heads, **overrides)
    stand_in = timing_stand_in(full)
    assert full.n_layer > len(kinds) and stand_in.n_layer == len(kinds)
    assert [stand_in.is_moe_layer(i) for i in range(stand_in.n_layer)] == kinds
    # everything but the depth and the layers' kinds is the model's own
    assert dataclasses.replace(stand_in, n_layer=full.n_layer, moe=full.moe) == full
    for block, moe in enumerate(kinds):
        like = next(i for i in range(full.n_layer) if full.is_moe_layer(i) == moe)
        assert shapes(stand_in, block) == shapes(full, like)


@pytest.mark.parametrize("arch, heads, overrides", [
    ("enoki", 2, {}),  # one block
    ("qwen3next", 3, {"n_layer": 2, "moe": True, "moe_num_experts": 4, "mlp_only_layers": [1]}),
])
def test_a_model_with_no_more_blocks_than_kinds_is_timed_itself(arch, heads, overrides):
    full = model(arch, heads, **overrides)
    kinds = {full.is_moe_layer(i) for i in range(full.n_layer)}
    assert full.n_layer == len(kinds)
    assert timing_stand_in(full) is full


def test_the_dry_run_says_it_timed_a_cut_model_and_scales_it(capsys):
    assert danastar_main(["train", "--dataset", "synthetic", "--heads", "4", "--batch_size", "4",
                          "--sequence_length", "64", "--iterations", "10", "--dry_run"]) == 0
    out, err = capsys.readouterr()
    line = next(line for line in out.splitlines() if line.startswith("  time "))
    threads = torch.get_num_threads()
    assert f" for its 10 steps on this CPU with {threads} thread" in line, line
    assert "not counting evaluations, start-up or compiling (measured just now on the model " \
        "cut to 1 of its 3 blocks, with the machine's load average at " in line, line
    assert ": forward/backward passes of " in line and " tokens ran at " in line
    assert " GFLOP/s" in line and "fixed 0 s" not in line and " plus 0 s" not in line
    assert line.endswith(", scaled to the whole model and the batch)"), line
    # the wait said before it starts, on standard error (the plan itself is on standard output)
    assert err.splitlines()[0].startswith("danastar train: timing forward/backward passes and an "
                                          "optimizer step of the model here for the time "
                                          "estimate")


@pytest.mark.parametrize("rate, fixed, said", [
    (2.0e10, 0.0, "at 20 GFLOP/s and"), (2.0e10, 0.004, "at 20 GFLOP/s and"),
    (3.1e14, 0.0123, "at 310 TFLOP/s plus 0.012 s each and")])
def test_a_pass_without_a_fixed_cost_says_its_rate_alone(rate, fixed, said):
    timer = types.SimpleNamespace(full=model("enoki", 2), stand_in=model("enoki", 2),
                                  device=torch.device("cuda"))
    text = how_measured(timer, [(1, 32), (4, 32)], rate, fixed, 0.25)
    assert f"passes of 1 × 32 and 4 × 32 tokens ran {said} an optimizer step took 0.25 s" in text
    assert "load average" not in text  # said of a CPU only
