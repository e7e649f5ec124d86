"""A danastar model as a live transformers model, and that model written as a directory that
``AutoModelForCausalLM.from_pretrained`` loads."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from danastar.extras import MissingExtra

try:  # first, so that without the extra this says so before importing anything else
    import safetensors  # noqa: F401  (save_pretrained writes safetensors through it)
    import transformers
except ModuleNotFoundError as error:
    if error.name not in ("transformers", "safetensors"):
        raise
    raise MissingExtra("danastar export", "export", error.name) from None

import torch

from danastar.export import hf_model
from danastar.export.mapping import CUSTOM, Mapping, from_hf
from danastar.models.config import ModelConfig

REMOTE_CODE_FILE = "modeling_danastar.py"
MAX_SHARD_SIZE = "5GB"  # transformers' own default: one file below it, shards above


def build(mapping: Mapping) -> transformers.PreTrainedModel:
    """The transformers model of ``mapping`` with its weights, in eval mode, float32, CPU."""
    if mapping.native:
        fields = dict(mapping.config)
        config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
        model = getattr(transformers, mapping.architecture)(config)
    else:
        model = hf_model.DanastarForCausalLM(hf_model.DanastarConfig(**mapping.config))
    missing, unexpected = model.load_state_dict(mapping.state_dict, strict=False)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"the {mapping.architecture} mapping left weights missing "
                           f"{sorted(set(missing) - tied)} or unknown {sorted(unexpected)}")
    model.tie_weights()
    return model.float().eval()


def read(export_dir: Path, config: ModelConfig, architecture: str) -> dict[str, torch.Tensor]:
    """danastar's weights for ``config`` from the export ``export_dir`` of ``architecture``."""
    if architecture == CUSTOM:  # danastar's own class: this module, no remote code to trust
        model = hf_model.DanastarForCausalLM.from_pretrained(export_dir, dtype=torch.float32)
    else:
        model = getattr(transformers, architecture).from_pretrained(export_dir,
                                                                    dtype=torch.float32)
    return from_hf(config, architecture, model.state_dict())


def generation_settings(model: transformers.PreTrainedModel, config: ModelConfig,
                        eot_id: int | None) -> None:
    """Generation as danastar's: never a padding id of the vocabulary; stop at end of text.
    danastar's models have no beginning-of-text token."""
    generation = model.generation_config
    generation.suppress_tokens = list(range(config.vocab_size, config.padded_vocab_size)) or None
    for settings in (generation, model.config):
        settings.bos_token_id = None
        settings.eos_token_id = eot_id
        settings.pad_token_id = eot_id


def save(model: transformers.PreTrainedModel, mapping: Mapping, out: Path) -> list[str]:
    """Write ``model`` into ``out`` (safetensors, config.json, generation_config.json, and the
    modeling file of a custom class); returns the names of the files written."""
    transformers.utils.logging.disable_progress_bar()  # a bar per shard says nothing here
    model.save_pretrained(out, max_shard_size=MAX_SHARD_SIZE)
    if not mapping.native:
        # the class travels with the weights: `trust_remote_code=True` imports it
        (out / REMOTE_CODE_FILE).write_text(inspect.getsource(hf_model))
        config_path = out / "config.json"
        config = json.loads(config_path.read_text())
        module = Path(REMOTE_CODE_FILE).stem
        config["auto_map"] = {"AutoConfig": f"{module}.DanastarConfig",
                              "AutoModelForCausalLM": f"{module}.DanastarForCausalLM"}
        config["architectures"] = ["DanastarForCausalLM"]
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return sorted(p.name for p in out.iterdir())


__all__ = ["MAX_SHARD_SIZE", "REMOTE_CODE_FILE", "build", "save"]
