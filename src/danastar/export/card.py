"""The model card (``README.md`` of an export): how the model was trained, from the run's own
records, so that a shared model says which optimizer made it."""

from __future__ import annotations

from danastar.export.mapping import Mapping
from danastar.train.weights import Weights

# run.json identity fields shown under "Training", in this order, with their labels
TRAINING_FIELDS = (
    ("opt", "optimizer"), ("lr", "peak learning rate"), ("scheduler", "LR schedule"),
    ("warmup_steps", "warm-up steps"), ("weight_decay", "weight decay"), ("wd_ts", "wd_ts"),
    ("kappa", "kappa"), ("delta", "delta"), ("omega", "omega"), ("grad_clip", "gradient clip"),
    ("iterations", "planned steps"), ("global_batch", "global batch (sequences)"),
    ("sequence_length", "sequence length"), ("dataset", "dataset"), ("tokenizer", "tokenizer"),
    ("seed", "seed"),
)


def model_card(weights: Weights, mapping: Mapping, max_error: float, tokenizer_note: str) -> str:
    config, identity = weights.model_config, weights.identity
    moe = ""
    if config.moe:
        moe = (f", mixture of experts ({config.moe.num_experts} experts, "
               f"{config.moe.num_experts_per_tok} per token)")
    loading = ("AutoModelForCausalLM.from_pretrained(path)" if mapping.native else
               "AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)")
    has_tokenizer = "tokenizer.json" in tokenizer_note
    tokenizer_line = "tokenizer = AutoTokenizer.from_pretrained(path)\n" if has_tokenizer else ""
    tokenizer_alone = ""
    if has_tokenizer and not mapping.native:
        # transformers 5 reads the model's config before the tokenizer, and this config is
        # defined in modeling_danastar.py: known once the model is loaded, else code to trust
        tokenizer_alone = ("\nThe tokenizer is transformers' own `PreTrainedTokenizerFast`. "
                           "Loaded after the model, as above, it asks nothing; loaded alone, "
                           "`PreTrainedTokenizerFast.from_pretrained(path)` runs no code, "
                           "where `AutoTokenizer.from_pretrained(path)` in transformers 5 "
                           "first reads the model's config, defined in `modeling_danastar.py`, "
                           "and so asks for `trust_remote_code=True`.\n")
    rows = [("step", f"{weights.step:,}")]
    if weights.tokens is not None:
        rows.append(("training tokens", f"{weights.tokens:,}"))
    if weights.val_loss is not None:
        rows.append(("validation loss", f"{weights.val_loss:.4f}"))
    rows += training_rows(identity, weights.extensions)
    table = "\n".join(f"| {label} | {value} |" for label, value in rows)
    class_note = (f"`{mapping.architecture}` (transformers' own class)" if mapping.native else
                  f"`{mapping.architecture}`, defined in `modeling_danastar.py` beside the "
                  f"weights ({mapping.why_custom})")
    tags = "\n".join(f"- {tag}" for tag in ("danastar", config.arch,
                                            identity.get("opt") or "pretraining"))
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags:
{tags}
---

# {config.arch} ({_millions(weights)} parameters), trained by danastar

A {config.n_layer}-layer {config.arch} language model (width {config.n_embd}, \
{config.n_head} heads of {config.head_dim}, MLP {config.mlp_hidden}{moe}, context \
{config.max_seq_len}, vocabulary {config.vocab_size}), exported from the danastar run \
`{weights.run_dir.name}` at step {weights.step:,}.

Class: {class_note}. Its logits equal danastar's own on random tokens to {max_error:.1e} \
(float32, checked by the export).

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
path = "."  # this directory, or its name on the hub
model = {loading}
{tokenizer_line}```
{tokenizer_alone}
Tokenizer: {tokenizer_note}.

## Training

| | |
|---|---|
{table}
"""


def training_rows(identity: dict, extensions: list[dict]) -> list[tuple[str, str]]:
    """The "Training" rows of run.json's identity; a run extended past its planned steps
    (`danastar train --extend`) shows the warm-up it kept, the weight decay it holds since its
    newest join (recorded with the extension; not shown where an older record lacks it) rather
    than a run planned that long's, and a row per extension."""
    if extensions:
        first, last = extensions[0], extensions[-1]
        identity = {**identity, "warmup_steps": first["warmup_steps"],
                    "weight_decay": last.get("weight_decay"), "wd_ts": last.get("wd_ts")}
    rows = [(label, _value(identity[key])) for key, label in TRAINING_FIELDS
            if identity.get(key) is not None]
    rows += [("extended", f"from step {e['from_step']:,}, {e['from_iterations']:,} → "
                          f"{e['iterations']:,} steps: LR schedule by {e['schedule_rule']}"
                          f"{_climb(e)}, weight decay by {e['decay_rule']} (docs/training.md)")
             for e in extensions]
    return rows


def _climb(extension: dict) -> str:
    """How many steps a rewarm took back to the peak LR (nothing for the other rules)."""
    steps = extension.get("rewarm_steps")
    return f" (back to the peak over {steps:,} step{'s' * (steps != 1)})" if steps else ""


def _value(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _millions(weights: Weights) -> str:
    count = sum(t.numel() for t in weights.state_dict.values())
    if weights.model_config.tie_embeddings:  # the head is the embedding, listed twice
        count -= weights.state_dict["lm_head.weight"].numel()
    return f"{count / 1e6:.1f}M"
