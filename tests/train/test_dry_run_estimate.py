"""The dry run's time estimate times a stand-in of the planned model: one block of each kind it
has, with the whole model's widths, so that its passes run the same matrix shapes (docs/training.md,
"--dry_run")."""

import dataclasses

import pytest
import torch

from danastar.cli import main as danastar_main
from danastar.models import ModelConfig, build_model
from danastar.train.plan import timing_stand_in


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
    line = next(line for line in capsys.readouterr().out.splitlines()
                if line.startswith("  time "))
    assert "measured here on the model cut to 1 of its 3 blocks: forward/backward passes of " \
        in line, line
    assert "scaled to the whole model and the batch; an optimizer step of " in line
    assert line.endswith(", scaled to its parameters)"), line
