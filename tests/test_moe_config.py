"""Mixture of experts in `danastar train`'s configuration and plan: the release's flags with their
defaults, the refusals (one sentence naming the fix, before anything is built or written), and
the plan's total and active parameter counts, LR and token budget (docs/moe.md)."""

import json
import os
import subprocess
import sys

import pytest
import torch

import danastar
from danastar.cli import main as danastar_main
from danastar.config import load_config, model_config
from danastar.errors import UserError
from danastar.models import build_model
from danastar.scaling import lr_law, make_plan
from danastar.train.plan import dry_run

BASE = ["--dataset", "synthetic", "--heads", "2", "--batch_size", "4", "--sequence_length", "32",
        "--iterations", "3"]


def planned(argv: list[str]) -> dict:
    config, _ = load_config([*BASE, *argv])
    return dry_run(config, world_size=1)


def refusal(argv: list[str]) -> str:
    with pytest.raises(UserError) as raised:
        planned(argv)
    return str(raised.value)


def test_the_release_flags_map_to_their_keys_with_the_release_defaults():
    config, _ = load_config([*BASE, "--moe"])
    moe = config.model.moe
    assert (moe.enabled, moe.num_experts, moe.num_shared_experts,
            moe.num_experts_per_tok) == (True, 8, 0, 2)
    assert (moe.routing, moe.softmax_order, moe.router_loss) == (
        "standard_gating", "topk_softmax", "load_balancing_z_loss")
    assert (moe.aux_loss_factor, moe.z_loss_factor, moe.entropy_loss_factor) == (0.1, 0.01, 0.01)
    assert moe.expert_capacity_factor == 0.0  # dropless here; the release's is 1.5
    assert (moe.budget, moe.decoder_sparse_step, moe.mlp_only_layers) == ("active", 1, ())
    config, _ = load_config([
        *BASE, "--arch", "qwen3next", "--moe_num_experts", "6", "--moe_num_experts_per_tok", "1",
        "--moe_softmax_order", "softmax_topk", "--moe_router_loss", "entropy",
        "--moe_aux_loss_factor", "0", "--moe_z_loss_factor", "0.5",
        "--moe_entropy_loss_factor", "0.2", "--moe_expert_capacity_factor", "1.5", "--ep_size", "2",
        "--use_gated_shared_expert", "--shared_expert_intermediate_size", "96",
        "--decoder_sparse_step", "2", "--mlp_only_layers", "2", "--mlp_dim_exp_factor", "0.5",
        "--plot_router_logits", "--moe_budget", "total"])
    moe = config.model.moe
    assert moe.enabled  # qwen3next implies --moe
    assert (moe.num_experts, moe.num_experts_per_tok, moe.softmax_order, moe.router_loss) == (
        6, 1, "softmax_topk", "entropy")
    assert (moe.aux_loss_factor, moe.z_loss_factor, moe.entropy_loss_factor,
            moe.expert_capacity_factor) == (0.0, 0.5, 0.2, 1.5)
    assert (moe.use_gated_shared_expert, moe.shared_expert_intermediate_size,
            moe.decoder_sparse_step, moe.mlp_only_layers) == (True, 96, 2, (2,))
    assert (moe.mlp_dim_exp_factor, moe.plot_router_logits, moe.budget) == (0.5, True, "total")
    plan = planned(["--arch", "qwen3next", "--decoder_sparse_step", "2", "--mlp_only_layers",
                    "2", "--use_gated_shared_expert"])["plan"]
    assert plan["moe"] and plan["moe_layers"] == [0]  # of 4 layers: 0 and 2 by the step, 2 dense


def test_llama_ties_its_embeddings_and_has_no_z_loss():
    config, _ = load_config([*BASE, "--arch", "llama"])
    assert config.model.tie_embeddings and config.model.z_loss == 0.0
    assert not config.model.moe.enabled
    plan = planned(["--arch", "llama"])
    assert plan["config"]["model"]["tie_embeddings"] and not plan["plan"]["moe"]


REFUSED = [
    (["--moe_num_experts", "4"], "model.moe.num_experts (--moe_num_experts) configures a "
     "mixture of experts; add --moe"),
    (["--use_gated_shared_expert"], "add --moe"),
    (["--moe", "--moe_routing", "expert_choice"], "--moe_routing expert_choice is not built"),
    (["--moe", "--moe_routing", "tokens"], "model.moe.routing (--moe_routing) 'tokens' is not"),
    (["--moe", "--moe_num_experts", "4", "--moe_num_shared_experts", "4"],
     "--moe_num_shared_experts 4 leaves no routed expert"),
    (["--moe", "--moe_num_experts", "4", "--moe_num_shared_experts", "1",
      "--moe_num_experts_per_tok", "4"], "must be between 1 and the 3 routed experts"),
    (["--moe", "--moe_num_experts_per_tok", "0"], "must be between 1 and the 8 routed"),
    (["--moe", "--distributed_backend", "fsdp", "parallel.tp_size=2"],
     "tensor parallelism with MoE is not supported, as in the release; use FSDP or --ep_size"),
    (["--arch", "qwen3next", "--decoder_sparse_step", "0"], "--decoder_sparse_step 0 must be at"),
    (["--arch", "qwen3next", "--mlp_only_layers", "0,4"], "names layer 4, but the model has "
     "layers 0 to 3"),
    (["--arch", "qwen3next", "--mlp_only_layers", "0,x"], "takes layer indices separated by"),
    (["--arch", "qwen3next", "--mlp_only_layers", "0,2", "--decoder_sparse_step", "2"],
     "leaves no MoE layer"),
    (["--moe", "--decoder_sparse_step", "2"], "applies to --arch qwen3next only"),
    (["--arch", "qwen3next", "--shared_expert_intermediate_size", "64"],
     "add --use_gated_shared_expert"),
    (["--arch", "qwen3next", "--use_gated_shared_expert", "--moe_num_shared_experts", "1"],
     "--use_gated_shared_expert replaces the shared experts"),
    (["--moe", "--moe_budget", "some"], "model.moe.budget (--moe_budget) 'some' is not known"),
    (["--arch", "llama", "model.z_loss=0.001"], "--arch llama fixes model.z_loss at 0.0"),
]


@pytest.mark.parametrize("argv, fragment", REFUSED, ids=[" ".join(argv) for argv, _ in REFUSED])
def test_impossible_moe_settings_are_one_sentence_naming_the_fix(argv, fragment):
    message = refusal(argv)
    assert fragment in message
    assert "\n" not in message and message.endswith((".", "?"))


def test_the_command_line_refuses_with_exit_2_and_writes_nothing(tmp_path):
    source = os.path.dirname(os.path.dirname(danastar.__file__))
    result = subprocess.run(
        [sys.executable, "-m", "danastar", "train", *BASE, "--moe", "--moe_num_experts", "2",
         "--moe_num_experts_per_tok", "3", "--run_dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": source})
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "--moe_num_experts_per_tok 3 must be between 1 and the 2 routed experts" in \
        result.stderr and "Traceback" not in result.stderr
    assert os.listdir(tmp_path) == []


def test_the_plan_counts_a_moe_enoki_in_both_conventions_and_budgets_its_active_params():
    # The spec's example: Enoki, 12 heads, 8 experts, top-2 (12·d²·L convention for the dense
    # part): dense 63.7M, total 361.0M, active 106.2M non-embedding parameters.
    moe = {"moe": True, "moe_num_experts": 8, "moe_num_experts_per_tok": 2}
    plan = make_plan("enoki", "adamw", 12, model_options=moe)
    assert round(plan.params.non_embedding_params / 1e6, 1) == 63.7
    assert round(plan.params.total_non_embedding_params / 1e6, 1) == 361.0
    assert round(plan.params.active_non_embedding_params / 1e6, 1) == 106.2
    with torch.device("meta"):
        model = build_model(plan.model_config())
    assert plan.params.exact_total_params == model.num_params()
    assert plan.params.exact_active_params == model.num_params(active=True)
    assert plan.params.exact_active_params < plan.params.exact_total_params
    # the LR law at the active count, the budget 20 × (active + embeddings)
    assert plan.lr == lr_law("enoki", "adamw", plan.params.active_non_embedding_params)[0]
    assert plan.params.active_params == plan.params.active_non_embedding_params + 2 * 768 * 50304
    assert plan.chinchilla_tokens == 20 * plan.params.active_params
    total = make_plan("enoki", "adamw", 12, model_options=moe, moe_budget="total")
    assert total.chinchilla_tokens == 20 * total.params.total_params > plan.chinchilla_tokens
    dense = make_plan("enoki", "adamw", 12)
    counts = dense.params
    assert (counts.active_params, counts.exact_active_params) == (counts.total_params,
                                                                  counts.exact_total_params)
    assert dense.params.active_non_embedding_params == dense.params.non_embedding_params


def test_the_dry_run_shows_total_and_active_and_the_lr_tables_each_arch_reads(capsys):
    assert danastar_main(["train", *BASE[:-2], "--moe", "--moe_num_experts", "4",
                          "--moe_num_experts_per_tok", "1", "--moe_softmax_order", "softmax_topk",
                          "--opt", "adamw", "--dry_run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["moe"] and plan["moe_num_experts"] == 4 and plan["moe_layers"] == [0]
    assert plan["total_params"] > plan["active_params"]
    assert plan["exact_total_params"] > plan["exact_active_params"]
    assert plan["iterations"] == 20 * plan["active_params"] // plan["tokens_per_step"]
    assert plan["lr_rule"].startswith("enoki/")
    for arch, table in (("llama", "enoki/"), ("qwen3next", "qwen3/")):
        assert planned(["--arch", arch, "--opt", "adamw", "--lr", "1e-3"])  # plans with a flag
        config, _ = load_config([*BASE[:-2], "--arch", arch, "--opt", "adamw"])
        assert dry_run(config, world_size=1)["plan"]["lr_rule"].startswith(table)


def test_the_model_built_for_a_run_has_the_configured_experts():
    config, _ = load_config([*BASE, "--moe", "--moe_num_experts", "4",
                             "--moe_num_shared_experts", "1", "--moe_num_experts_per_tok", "3"])
    from danastar.config import make_run_plan

    model = model_config(config, make_run_plan(config, 256, 1))
    assert (model.moe.num_experts, model.moe.num_shared_experts,
            model.moe.num_experts_per_tok) == (4, 1, 3)


def test_runs_with_other_experts_get_other_default_directories():
    from danastar.config import default_run_dir

    names = {str(default_run_dir(load_config([*BASE, *argv])[0])) for argv in (
        [], ["--moe"], ["--moe", "--moe_num_experts", "16"],
        ["--moe", "--moe_aux_loss_factor", "0"],
        ["--arch", "qwen3next", "--mlp_only_layers", "0,2"])}
    assert len(names) == 5 and any("moe16x2" in name for name in names)
    assert any("-moe8x2-aux0-" in name for name in names)
    assert any("-moe8x2-dense0_2-" in name for name in names)
