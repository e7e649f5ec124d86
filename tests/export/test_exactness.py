"""Every architecture, dense and mixture of experts, written as a Hugging Face directory and
loaded back with `AutoModelForCausalLM`: its logits equal danastar's to 1e-5 in float32 and
greedy generation gives the same tokens. Models built here (tiny), nothing from the hub."""

import pytest
import torch

pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

from danastar.export import hf  # noqa: E402
from danastar.export.mapping import CUSTOM, half_split_order, to_hf, why_not_native  # noqa: E402
from danastar.models import ModelConfig, build_model  # noqa: E402

VOCAB = 300  # pads to 320: generation must never pick the 20 padding ids


def config(arch, **overrides) -> ModelConfig:
    fields = dict(arch=arch, n_layer=3, n_head=2, n_embd=64, head_dim=32, mlp_hidden=96,
                  vocab_size=VOCAB, max_seq_len=64)
    return ModelConfig.from_dict({**fields, **overrides})


MOE = dict(moe=True, moe_num_experts=4, moe_num_experts_per_tok=2)
GATED = dict(MOE, use_gated_shared_expert=True)
CASES = {  # name: (config, the class it exports as)
    "enoki": (config("enoki"), CUSTOM),
    "enoki-moe-shared": (config("enoki", **MOE, moe_num_shared_experts=1), CUSTOM),
    "llama-tied": (config("llama", tie_embeddings=True), "LlamaForCausalLM"),
    "llama-untied-theta": (config("llama", rope_theta=500000.0, norm_eps=1e-6),
                           "LlamaForCausalLM"),
    "llama-moe": (config("llama", **MOE), CUSTOM),
    "llama-residual-scale": (config("llama", residual_scale=0.5), CUSTOM),
    "qwen3": (config("qwen3"), "Qwen3NextForCausalLM"),
    "qwen3-tied": (config("qwen3", tie_embeddings=True), "Qwen3NextForCausalLM"),
    "qwen3-moe": (config("qwen3", **MOE, moe_softmax_order="softmax_topk"), CUSTOM),
    "qwen3next-gated": (config("qwen3next", **GATED, decoder_sparse_step=2),
                        "Qwen3NextForCausalLM"),
    "qwen3next-gated-dense-layers": (config("qwen3next", **GATED, mlp_only_layers=(1,),
                                            shared_expert_intermediate_size=48,
                                            moe_softmax_order="softmax_topk"),
                                     "Qwen3NextForCausalLM"),
    "qwen3next-shared": (config("qwen3next", **MOE, moe_num_shared_experts=1), CUSTOM),
}


def trained_looking(model_config: ModelConfig, seed: int = 0):
    """A model whose norms and weights are not at their initial values (a norm of ones would
    hide a permuted or shifted norm weight)."""
    torch.manual_seed(seed)
    model = build_model(model_config)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return model.eval()


def exported(model, tmp_path, custom=False):
    mapping = to_hf(model.config, model.state_dict(), force_custom=custom)
    hf_model = hf.build(mapping)
    hf.generation_settings(hf_model, model.config, eot_id=None)
    hf.save(hf_model, mapping, tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=not mapping.native,
                                                  dtype=torch.float32)
    return mapping, loaded.eval()


def assert_same_model(model, loaded):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, 40), generator=generator)
    with torch.no_grad():
        ours = model(ids)[..., :VOCAB]
        theirs = loaded(ids).logits[..., :VOCAB]
        assert (ours - theirs).abs().max().item() <= 1e-5
        prompt = ids[:1, :6]
        greedy = model.generate(prompt, 20, temperature=0)
        assert torch.equal(loaded.generate(prompt, max_new_tokens=20, do_sample=False), greedy)


@pytest.mark.parametrize("name", CASES)
def test_the_export_computes_danastars_model(name, tmp_path):
    model_config, architecture = CASES[name]
    model = trained_looking(model_config)
    mapping, loaded = exported(model, tmp_path)
    assert mapping.architecture == architecture == type(loaded).__name__
    assert_same_model(model, loaded)


@pytest.mark.parametrize("name", ["llama-tied", "qwen3next-gated"])
def test_natively_mapped_models_export_as_danastars_class_on_request(name, tmp_path):
    model = trained_looking(CASES[name][0])
    mapping, loaded = exported(model, tmp_path, custom=True)
    assert mapping.architecture == CUSTOM == type(loaded).__name__
    assert_same_model(model, loaded)


def test_left_padded_batches_generate_as_each_prompt_alone(tmp_path):
    """lm-eval's generation tasks pad prompts on the left: danastar's own class must mask the
    padding, so that each row continues as its prompt alone would."""
    model = trained_looking(CASES["enoki"][0])
    _, loaded = exported(model, tmp_path)
    prompts = [[5, 6, 7, 8, 9], [11, 12]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        batch = loaded.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
        for row, prompt in enumerate(prompts):
            alone = model.generate(torch.tensor([prompt]), 8, temperature=0)
            assert batch[row, width:].tolist() == alone[0, len(prompt):].tolist()


def test_the_rope_order_takes_even_dimensions_then_odd_ones():
    assert half_split_order(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


def test_each_custom_export_says_why():
    reasons = {name: why_not_native(model_config) for name, (model_config, architecture)
               in CASES.items()}
    for name, (_, architecture) in CASES.items():
        assert bool(reasons[name]) == (architecture == CUSTOM), name
    assert "Enoki" in reasons["enoki"] and "residual scale 0.5" in reasons["llama-residual-scale"]


@pytest.mark.parametrize("name", ["enoki-moe-shared", "llama-tied", "llama-untied-theta", "qwen3",
                                  "qwen3next-gated-dense-layers"])
def test_an_export_reads_back_into_danastars_weights(name, tmp_path):
    """The renaming undone (`hf.read`): the same tensors as the model exported, bitwise but for
    Qwen3-Next's zero-centred norm weights (w − 1 + 1, one rounding at most)."""
    model = trained_looking(CASES[name][0])
    mapping, _ = exported(model, tmp_path)
    back = hf.read(tmp_path, model.config, mapping.architecture)
    original = model.state_dict()
    assert set(back) == set(original)
    for key, tensor in original.items():
        assert back[key].shape == tensor.shape, key
        assert (back[key] - tensor).abs().max().item() <= 1e-7 * max(1, tensor.abs().max()), key
