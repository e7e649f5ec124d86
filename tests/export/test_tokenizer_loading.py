"""An export's tokenizer loads as its model card says, in a fresh process whose stdin is closed:
no question about running code (transformers' `trust_remote_code` prompt), no warning (Python's
or transformers' logging), and the ids of danastar's own tokenizer, for each class an export
can be: `LlamaForCausalLM`, `Qwen3NextForCausalLM` and danastar's own class."""

import dataclasses
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

# the model card's lines (card.py) for each (export, way) in turn, in one process; per load the
# tokenizer's ids, decodings and any warning as one JSON line
LOAD = """
import json, logging, sys, warnings
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
loads, texts = json.loads(sys.argv[1]), json.loads(sys.argv[2])
logged = []
handler = logging.Handler(level=logging.WARNING)
handler.emit = lambda record: logged.append(record.getMessage())
logging.getLogger("transformers").addHandler(handler)
for path, how in loads:
    logged.clear()
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


def load_in_a_fresh_process(loads, tmp_path) -> list[dict]:
    """What each (export folder, way) of `loads` gave, loaded in turn in one fresh process."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                   "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run([sys.executable, "-c", LOAD, json.dumps(loads), json.dumps(TEXTS)],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=300, env=environment)
    said = result.stdout + result.stderr
    assert "[y/N]" not in said and "custom code" not in said, said[-3000:]
    assert result.returncode == 0, said[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines()[-len(loads):]]


EXPORTS = {  # arch, tokenizer
    "llama": ("llama", bpe), "llama-bytes": ("llama", ByteTokenizer), "qwen3": ("qwen3", bpe),
    "enoki": ("enoki", bpe)}
# Each process loads as its model card says; a load that runs the export's code (which
# registers its classes) is last in its process or alone, so that no load is helped by another.
PROCESSES = {
    "transformers-classes": [("llama", "alone"), ("llama-bytes", "alone"), ("qwen3", "alone")],
    "enoki-alone": [("enoki", "alone, as its own class"), ("enoki", "alone, trusted")],
    "enoki-after-the-model": [("enoki", "after the model")],
}


@pytest.mark.slow
@pytest.mark.parametrize("process", PROCESSES)
def test_the_tokenizer_loads_without_a_question_or_a_warning(process, tmp_path):
    tokenizers, loads = {}, []
    for name, how in PROCESSES[process]:
        arch, make_tokenizer = EXPORTS[name]
        folder = tmp_path / name
        if name not in tokenizers:
            tokenizers[name] = make_tokenizer()
            mapping = exported(arch, tokenizers[name], folder)
            assert (mapping.architecture == CUSTOM) == (arch == "enoki")
            settings = json.loads((folder / "tokenizer_config.json").read_text())
            assert settings["tokenizer_class"] == TOKENIZER_CLASS == "PreTrainedTokenizerFast"
            assert "auto_map" not in settings  # no tokenizer code of its own
        loads.append((str(folder), how))
    for (name, how), loaded in zip(PROCESSES[process],
                                   load_in_a_fresh_process(loads, tmp_path)):
        tokenizer = tokenizers[name]
        assert loaded["warnings"] == [], (name, how, loaded["warnings"])
        assert loaded["ids"] == [tokenizer.encode(text) for text in TEXTS], (name, how)
        assert loaded["decoded"] == TEXTS, (name, how)
        assert loaded["eos"] == tokenizer.eot_id, (name, how)


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


def test_the_model_card_of_an_extended_run_says_where_and_how(tmp_path):
    """run.json's `extensions` (`danastar train --extend`): a row per extension, the warm-up the
    run kept, and the weight decay it holds, not that of a run planned that long."""
    config = ModelConfig.from_dict(dict(arch="enoki", n_layer=1, n_head=2, n_embd=64,
                                        head_dim=32, mlp_hidden=96, vocab_size=300,
                                        max_seq_len=64))
    state = build_model(config).state_dict()
    identity = {"opt": "adana", "iterations": 200, "warmup_steps": 4, "weight_decay": 0.02,
                "wd_ts": 20}
    extension = {"from_step": 100, "from_iterations": 100, "iterations": 200,
                 "schedule_rule": "stretch", "decay_rule": "keep", "warmup_steps": 2}
    weights = Weights(model_config=config, state_dict=state, run_dir=tmp_path / "run",
                      checkpoint=tmp_path / "run", step=200, layout="single",
                      identity=identity, val_loss=None, dataset=None, extensions=[extension])
    card = model_card(weights, to_hf(config, state), 0.0, "none")
    assert "| planned steps | 200 |" in card and "| warm-up steps | 2 |" in card
    assert ("| extended | from step 100, 100 → 200 steps: LR schedule by stretch, weight decay "
            "by keep (docs/training.md) |") in card
    assert "wd_ts" not in card and "| weight decay |" not in card  # not recorded: not shown
    # recorded with the extension (since the decay in effect is kept): the decay it holds
    held = {**extension, "weight_decay": 0.04, "wd_ts": 10}
    card = model_card(dataclasses.replace(weights, extensions=[held]), to_hf(config, state),
                      0.0, "none")
    assert "| weight decay | 0.04 |" in card and "| 0.02 |" not in card, card
    # a rewarm says how many steps it took back to the peak
    rewarmed = {**held, "schedule_rule": "rewarm", "rewarm_steps": 8}
    card = model_card(dataclasses.replace(weights, extensions=[rewarmed]), to_hf(config, state),
                      0.0, "none")
    assert ("LR schedule by rewarm (back to the peak over 8 steps), weight decay by keep"
            in card), card
