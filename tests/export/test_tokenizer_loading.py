"""An export's tokenizer loads as its model card says, in a fresh process whose stdin is closed:
no question about running code (transformers' `trust_remote_code` prompt), no warning (Python's
or transformers' logging), and the ids of danastar's own tokenizer, for each class an export
can be: `LlamaForCausalLM`, `Qwen3NextForCausalLM` and danastar's own class."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

from danastar.data.tokenizers import ByteTokenizer, train_bpe  # noqa: E402
from danastar.export import hf  # noqa: E402
from danastar.export.card import model_card  # noqa: E402
from danastar.export.mapping import CUSTOM, to_hf  # noqa: E402
from danastar.export.tokenizer import TOKENIZER_CLASS, write  # noqa: E402
from danastar.models import ModelConfig, build_model  # noqa: E402
from danastar.train.weights import Weights  # noqa: E402

TEXTS = ["the quick brown fox jumps over the lazy dog", "ROMEO: But soft, what light? 12345"]

# the model card's lines (card.py), then the tokenizer's ids, decodings and any warning as JSON
LOAD = """
import json, logging, sys, warnings
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
path, how, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
logged = []
handler = logging.Handler(level=logging.WARNING)
handler.emit = lambda record: logged.append(record.getMessage())
logging.getLogger("transformers").addHandler(handler)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    if how == "after the model":
        model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)
        tokenizer = AutoTokenizer.from_pretrained(path)
    elif how == "alone":
        tokenizer = AutoTokenizer.from_pretrained(path)
    elif how == "alone, trusted":
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    else:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
ids = [tokenizer(text)["input_ids"] for text in texts]
print(json.dumps({"ids": ids, "decoded": [tokenizer.decode(i) for i in ids],
                  "eos": tokenizer.eos_token_id, "class": type(tokenizer).__name__,
                  "warnings": logged + [str(w.message) for w in caught]}))
"""


def bpe():
    words = TEXTS[0].split() + ["ROMEO:", "But", "soft,", "what", "light?"]
    return train_bpe([" ".join(words[i:] + words[:i]) for i in range(len(words))] * 5, 300)


def exported(arch, tokenizer, folder):
    """The files `danastar export` writes for loading: the model (hf.save) and the tokenizer."""
    config = ModelConfig.from_dict(dict(arch=arch, n_layer=1, n_head=2, n_embd=64, head_dim=32,
                                        mlp_hidden=96, vocab_size=300, max_seq_len=64))
    mapping = to_hf(config, build_model(config).state_dict())
    model = hf.build(mapping)
    hf.generation_settings(model, config, eot_id=tokenizer.eot_id)
    hf.save(model, mapping, folder)
    write(tokenizer, folder)
    return mapping


def load_in_a_fresh_process(folder, how, tmp_path):
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                   "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run([sys.executable, "-c", LOAD, str(folder), how, json.dumps(TEXTS)],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=300, env=environment)
    said = result.stdout + result.stderr
    assert "[y/N]" not in said and "custom code" not in said, said[-3000:]
    assert result.returncode == 0, said[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


CASES = {  # arch, tokenizer, how the model card loads it
    "llama": ("llama", bpe, ["alone"]),
    "llama-bytes": ("llama", ByteTokenizer, ["alone"]),
    "qwen3": ("qwen3", bpe, ["alone"]),
    "enoki": ("enoki", bpe, ["after the model", "alone, trusted", "alone, as its own class"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_the_tokenizer_loads_without_a_question_or_a_warning(name, tmp_path):
    arch, make_tokenizer, ways = CASES[name]
    tokenizer = make_tokenizer()
    folder = tmp_path / "export"
    mapping = exported(arch, tokenizer, folder)
    assert (mapping.architecture == CUSTOM) == (arch == "enoki")
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    assert settings["tokenizer_class"] == TOKENIZER_CLASS == "PreTrainedTokenizerFast"
    assert "auto_map" not in settings  # no tokenizer code of its own
    for how in ways:
        loaded = load_in_a_fresh_process(folder, how, tmp_path)
        assert loaded["warnings"] == [], (how, loaded["warnings"])
        assert loaded["ids"] == [tokenizer.encode(text) for text in TEXTS], how
        assert loaded["decoded"] == TEXTS, how
        assert loaded["eos"] == tokenizer.eot_id, how


def test_the_model_card_shows_each_way_to_load_the_tokenizer(tmp_path):
    """Danastar's own class: the card loads the model first, and names the ways to load the
    tokenizer alone."""
    config = ModelConfig.from_dict(dict(arch="enoki", n_layer=1, n_head=2, n_embd=64,
                                        head_dim=32, mlp_hidden=96, vocab_size=300,
                                        max_seq_len=64))
    state = build_model(config).state_dict()
    mapping = to_hf(config, state)
    weights = Weights(model_config=config, state_dict=state, run_dir=tmp_path / "run",
                      checkpoint=tmp_path / "run", step=3, layout="single", identity={},
                      val_loss=None, dataset=None)
    card = model_card(weights, mapping, 0.0, "`bpe-300` (tokenizer.json; end of text: id 0)")
    model_line = "model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)"
    tokenizer_line = "tokenizer = AutoTokenizer.from_pretrained(path)"
    assert card.index(model_line) < card.index(tokenizer_line)
    assert "`PreTrainedTokenizerFast.from_pretrained(path)` runs no code" in card
