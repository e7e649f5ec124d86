"""`danastar train --init_from DIR`: a `danastar export` directory as a run's starting weights.

    source = inspect(Path("hf/llama-h2"), model_config)   # refuses a mismatch, reads no tensor
    check_finite(source)                                   # refuses a NaN or an infinity
    state_dict = read(source)                              # danastar's names, float32, CPU

The export's own files are read with the safetensors package (``model.safetensors``, or the
shards ``model.safetensors.index.json`` names; transformers is not needed) and renamed back with
``mapping.from_hf``. ``inspect`` checks, from the files' headers alone, that the export is the
model the training configuration defines: its class, its shape (``danastar_export.json``, else
``config.json``) and every tensor's name and shape; a mismatch is one sentence naming the flags
that define the export's model. ``check_finite`` reads each tensor in turn and refuses an
export holding a NaN or an infinity (damaged bytes under an intact header), as ``read`` does.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from danastar.errors import UserError
from danastar.export import PROVENANCE_FILE
from danastar.export.mapping import CUSTOM, custom_config, from_hf, why_not_native
from danastar.extras import needs_extra
from danastar.models.config import MOE_FLAT_NAMES, ModelConfig, arch_defaults, dimensions
from danastar.models.meta import build_meta_model
from danastar.train.weights import non_finite

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CLASSES = ("LlamaForCausalLM", "Qwen3NextForCausalLM", CUSTOM)
# What may differ between the export's model and the run's: the context length (RoPE is computed,
# not stored) and what only training reads (custom_config leaves those out already).
NOT_COMPARED = ("max_seq_len",)


@dataclasses.dataclass(frozen=True)
class Source:
    """An export checked against the run's model: where, its class, what it holds."""

    path: Path
    architecture: str
    files: tuple[Path, ...]
    model_config: ModelConfig  # the run's model, which the weights are renamed for
    description: str  # the export's model in words, e.g. "llama at 2 heads (2 layers, ...)"
    step: int | None  # the training step it was exported at, where danastar_export.json says

    def summary(self) -> str:
        at = f", step {self.step:,}" if self.step is not None else ""
        return f"{self.path} ({self.architecture}{at}: {self.description})"


def inspect(path: Path, expected: ModelConfig) -> Source:
    """``path`` checked as the starting weights of a run whose model is ``expected``."""
    _safe_open()  # first: without the extra, say so before any work
    path = Path(path).expanduser()
    settings, architecture = _hf_config(path)
    provenance = _read_json(path / PROVENANCE_FILE)
    exported = _exported_config(provenance, settings, architecture)
    described = describe(exported) if exported else _describe_hf(settings)
    if exported is not None:
        _check_same_model(path, exported, expected, described)
    _check_class(path, architecture, expected, settings)
    files = weight_files(path)
    _check_tensors(path, architecture, expected, _shapes(files))
    step = provenance.get("step")
    return Source(path, architecture, files, expected, described,
                  step if isinstance(step, int) else None)


def read(source: Source) -> dict[str, torch.Tensor]:
    """The export's weights under danastar's names, float32 on the CPU (tied weights tied)."""
    safe_open = _safe_open()
    state: dict[str, torch.Tensor] = {}
    for file in source.files:
        with safe_open(str(file), framework="pt") as weights:
            state.update({name: weights.get_tensor(name) for name in weights.keys()})
    _refuse_non_finite(source.path, non_finite(state))
    return from_hf(source.model_config, source.architecture, stacked_experts(state))


def check_finite(source: Source) -> None:
    """Refuse an export holding a NaN or an infinity: each tensor read in turn (one in memory
    at a time), before a run starts from it."""
    safe_open = _safe_open()
    found = []
    for file in source.files:
        with safe_open(str(file), framework="pt") as weights:
            found += [name for name in weights.keys()
                      if non_finite({name: weights.get_tensor(name)})]
    _refuse_non_finite(source.path, found)


def _refuse_non_finite(path: Path, names: list[str]) -> None:
    if names:
        raise UserError(f"--init_from {path} holds non-finite values (NaN or infinity) in "
                        f"{len(names)} tensor(s), first {names[0]}, so a run from it could not "
                        f"learn; export the run again with `danastar export`, or start without "
                        f"--init_from.")


def _safe_open():
    """safetensors' `safe_open`; without the export extra that installs it, one sentence."""
    try:
        from safetensors import safe_open  # noqa: PLC0415 (the export extra)
    except ModuleNotFoundError as error:
        if error.name != "safetensors":
            raise
        raise UserError(needs_extra("danastar train --init_from", "export") + ".") from None
    return safe_open


# ----------------------------------------------------------------------------------------------
# The export's files

def _read_json(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _hf_config(path: Path) -> tuple[dict[str, Any], str]:
    """config.json's settings and the class it names; refuses what is no danastar export."""
    fix = "give a directory that `danastar export` wrote"
    if not path.exists():  # (`danastar train` says first why its fresh start needs it)
        raise UserError(f"--init_from {path} does not exist; {fix}.")
    if not path.is_dir():
        raise UserError(f"--init_from {path} is not a directory; {fix}.")
    settings = _read_json(path / "config.json")
    if not settings:
        raise UserError(f"--init_from {path} has no readable config.json, so it is not a "
                        f"Hugging Face model directory; {fix}.")
    classes = settings.get("architectures") or []
    if len(classes) != 1 or classes[0] not in CLASSES:
        raise UserError(f"--init_from {path} holds a {'/'.join(map(str, classes)) or 'model'} "
                        f"(config.json), and danastar trains from {', '.join(CLASSES)} only; "
                        f"{fix}.")
    return settings, classes[0]


def weight_files(path: Path) -> tuple[Path, ...]:
    """The safetensors files of the export: one, or the shards its index names."""
    if (path / WEIGHTS_FILE).is_file():
        return (path / WEIGHTS_FILE,)
    index = _read_json(path / INDEX_FILE)
    shards = sorted(set((index.get("weight_map") or {}).values()))
    missing = [name for name in shards if not (path / name).is_file()]
    if not shards or missing:
        what = f"lacks the shard {missing[0]} that {INDEX_FILE} names" if missing else \
            f"has no {WEIGHTS_FILE} (nor a readable {INDEX_FILE})"
        raise UserError(f"--init_from {path} {what}; export the run again with `danastar "
                        "export`.")
    return tuple(path / name for name in shards)


def _shapes(files: tuple[Path, ...]) -> dict[str, torch.Tensor]:
    """Each tensor of the files as a meta tensor of its shape: the headers alone are read."""
    safe_open = _safe_open()
    shapes = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as weights:
                for name in weights.keys():
                    shape = weights.get_slice(name).get_shape()
                    shapes[name] = torch.empty(shape, device="meta")
        except Exception as error:  # safetensors raises its own errors for a damaged header
            raise UserError(f"{file} cannot be read as safetensors ({type(error).__name__}: "
                            f"{str(error)[:120]}); export the run again.") from None
    return stacked_experts(shapes)


def stacked_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Qwen3-Next's experts as its class holds them (``experts.gate_up_proj`` (E, 2h, d),
    ``experts.down_proj`` (E, d, h)), from the per-expert tensors transformers writes
    (``experts.<e>.gate_proj.weight``, ...); other tensors unchanged."""
    out, experts = {}, {}
    for name, tensor in state.items():
        head, found, tail = name.partition(".mlp.experts.")
        index, _, rest = tail.partition(".")
        if found and index.isdigit():
            experts.setdefault(head, {}).setdefault(rest, {})[int(index)] = tensor
        else:
            out[name] = tensor
    for head, parts in experts.items():
        stacked = {rest: torch.stack([by_index[i] for i in sorted(by_index)])
                   for rest, by_index in parts.items()}
        prefix = f"{head}.mlp.experts."
        out[prefix + "gate_up_proj"] = torch.cat((stacked["gate_proj.weight"],
                                                  stacked["up_proj.weight"]), dim=1)
        out[prefix + "down_proj"] = stacked["down_proj.weight"]
    return out


# ----------------------------------------------------------------------------------------------
# The checks

def _exported_config(provenance: dict, settings: dict, architecture: str) -> ModelConfig | None:
    """The export's danastar model: danastar_export.json's, else (danastar's own class) the
    fields of config.json; None when neither says it."""
    fields = provenance.get("model_config")
    if not isinstance(fields, dict) and architecture == CUSTOM:
        known = {f.name for f in dataclasses.fields(ModelConfig)} | set(MOE_FLAT_NAMES)
        fields = {key: value for key, value in settings.items() if key in known}
    try:
        return ModelConfig.from_dict(fields) if isinstance(fields, dict) else None
    except (TypeError, ValueError):
        return None  # the tensors are still compared one by one


def describe(config: ModelConfig) -> str:
    """A model in words: ``llama at 2 heads (2 layers, width 128, MLP 512, vocabulary 300)``."""
    experts = ""
    if config.moe:
        experts = (f", {config.moe.num_experts} experts, {config.moe.num_experts_per_tok} per "
                   "token")
    layers = f"{config.n_layer} layer{'s' if config.n_layer != 1 else ''}"
    return (f"{config.arch} at {config.n_head} heads ({layers}, width {config.n_embd}, MLP "
            f"{config.mlp_hidden}{experts}, vocabulary {config.vocab_size})")


def _describe_hf(settings: dict) -> str:
    return (f"{settings.get('num_hidden_layers', '?')} layers, width "
            f"{settings.get('hidden_size', '?')}, {settings.get('num_attention_heads', '?')} "
            f"heads, vocabulary {settings.get('vocab_size', '?')}")


def _compared(config: ModelConfig) -> dict[str, Any]:
    fields = custom_config(config)
    for name in NOT_COMPARED:
        fields.pop(name)
    return fields


def _check_same_model(path: Path, exported: ModelConfig, expected: ModelConfig,
                      described: str) -> None:
    ours, theirs = _compared(expected), _compared(exported)
    differ = [key for key in theirs if theirs[key] != ours.get(key)]
    if not differ:
        return
    listed = "; ".join(f"{key} {_show(theirs[key])} (this run: {_show(ours.get(key))})"
                       for key in differ[:4])
    raise UserError(f"--init_from {path} is {described}, another model than this run's "
                    f"{describe(expected)}: {listed}; {fix_for(exported, expected)}.")


def fix_for(exported: ModelConfig, expected: ModelConfig) -> str:
    """What to pass so that the run's model is the export's."""
    if exported.vocab_size != expected.vocab_size and _compared(
            dataclasses.replace(exported, vocab_size=expected.vocab_size)) == _compared(expected):
        return (f"train on the data the export was trained on (its vocabulary has "
                f"{exported.vocab_size} ids, this run's data {expected.vocab_size})")
    flags = [f"--arch {exported.arch}", f"--heads {exported.n_head}"]
    try:
        ladder = dimensions(exported.arch, exported.n_head)
    except ValueError:
        ladder = {}
    flags += [f"model.{key}={getattr(exported, key)}" for key in ("n_layer", "n_embd")
              if ladder.get(key) != getattr(exported, key)]
    # --arch sets its own default (llama ties); the flag is needed where that is not the export's
    tied = (expected.tie_embeddings if exported.arch == expected.arch
            else arch_defaults(exported.arch).get("tie_embeddings", False))
    if exported.tie_embeddings != tied:
        flags.append(f"model.tie_embeddings={str(exported.tie_embeddings).lower()}")
    if exported.residual_scale != expected.residual_scale:
        flags.append(f"model.residual_scale={exported.residual_scale:g}")
    flags += _moe_flags(exported, expected)
    return f"pass {' '.join(flags)}"


def _moe_flags(exported: ModelConfig, expected: ModelConfig) -> list[str]:
    theirs, ours = exported.to_dict(), expected.to_dict()
    flags = []
    for name in ("moe", *MOE_FLAT_NAMES):
        value = theirs[name]
        if value == ours[name] or (name != "moe" and not theirs["moe"]):
            continue
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"(without --{name})")
        else:
            flags.append(f"--{name} {_show(value)}")
    return flags


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "(none)"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _check_class(path: Path, architecture: str, expected: ModelConfig, settings: dict) -> None:
    """The export's class is the one that exports the run's model (or danastar's own class,
    which any model exports as with `danastar export --custom`)."""
    if architecture == CUSTOM:
        return
    native = "" if why_not_native(expected) else (
        "LlamaForCausalLM" if expected.arch == "llama" else "Qwen3NextForCausalLM")
    if architecture == native:
        return
    arch = {"LlamaForCausalLM": "llama", "Qwen3NextForCausalLM":
            "qwen3next" if settings.get("num_experts") else "qwen3"}[architecture]
    heads = settings.get("num_attention_heads", "?")
    raise UserError(f"--init_from {path} is a {architecture} ({arch} at {heads} heads), which "
                    f"this run's {expected.arch} model is not exported as; pass --arch {arch} "
                    f"--heads {heads}.")


def _check_tensors(path: Path, architecture: str, expected: ModelConfig,
                   shapes: dict[str, torch.Tensor]) -> None:
    """Every tensor the run's model has, of its shape, and no other."""
    wanted = {name: tuple(t.shape) for name, t in
              build_meta_model(expected).state_dict().items()}
    try:
        found = {name: tuple(t.shape) for name, t in
                 from_hf(expected, architecture, shapes).items()}
    except KeyError as error:
        raise UserError(f"--init_from {path} has no tensor {error.args[0]}, which this run's "
                        f"{describe(expected)} needs; pass the flags of the model that was "
                        "exported (its README.md says them).") from None
    missing = sorted(set(wanted) - set(found))
    unknown = sorted(set(found) - set(wanted))
    shaped = sorted(name for name in set(wanted) & set(found) if wanted[name] != found[name])
    if not (missing or unknown or shaped):
        return
    what = (f"no {missing[0]}" if missing else f"a tensor {unknown[0]} that this run's model "
            f"has not" if unknown else f"{shaped[0]} of shape {list(found[shaped[0]])}, where "
            f"this run's is {list(wanted[shaped[0]])}")
    raise UserError(f"--init_from {path} holds {what} ({len(missing) + len(unknown) + len(shaped)}"
                    f" tensor(s) differ from this run's {describe(expected)}); pass the flags "
                    "of the model that was exported (its README.md says them).")
