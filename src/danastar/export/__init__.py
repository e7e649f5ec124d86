"""danastar.export: a trained run in the Hugging Face format, and its evaluation by lm-eval.

    from danastar.export import export
    result = export(Path("runs/my-run"), Path("hf/my-run"))   # AutoModelForCausalLM loads it

``mapping`` says which transformers class computes each model and renames the weights,
``hf_model`` is the class shipped where none does (loaded with ``trust_remote_code=True``),
``tokenizer`` writes the run's tokenizer, ``card`` the model card, ``evaluate`` runs lm-eval,
``init_from`` reads an export back as a run's starting weights (`danastar train --init_from`).
docs/export.md is the user's guide.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import torch

from danastar import __version__
from danastar.errors import UserError
from danastar.export.card import model_card
from danastar.export.mapping import to_hf
from danastar.export.tokenizer import run_tokenizer, write
from danastar.models import build_model
from danastar.models.config import ModelConfig
from danastar.rundir.files import CHECKPOINTS_DIR
from danastar.train.weights import load_weights

PROVENANCE_FILE = "danastar_export.json"  # which run and checkpoint an export came from
TOLERANCE = 1e-4  # an export whose logits differ more from danastar's is a bug, not rounding


@dataclasses.dataclass
class Exported:
    out: Path
    architecture: str
    native: bool
    step: int
    max_error: float  # largest |logit difference| against danastar's model, float32
    files: list[str]
    tokenizer_note: str  # what the export holds as tokenizer, or why none


def export(path: Path, out: Path, *, custom: bool = False) -> Exported:
    """Write the run (or checkpoint) ``path`` as a Hugging Face model directory ``out``.

    ``custom`` exports danastar's own class even where a native one exists."""
    # transformers, the export extra: first, so that without it this says so before any work
    from danastar.export import hf  # noqa: PLC0415

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} exists and is not empty; give a new directory or remove "
                        "it first.")
    weights = load_weights(Path(path))
    mapping = to_hf(weights.model_config, weights.state_dict, force_custom=custom)
    model = hf.build(mapping)
    max_error = compare_logits(weights, model)
    if not max_error <= TOLERANCE:  # NaN included
        raise RuntimeError(f"the {mapping.architecture} export's logits differ from danastar's "
                           f"by {max_error:.2e} (more than {TOLERANCE:g}): a mapping bug")
    tokenizer, why_none = run_tokenizer(weights.dataset)
    hf.generation_settings(model, weights.model_config,
                           None if tokenizer is None else tokenizer.eot_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    # written beside its destination and renamed into place: no half export under the name
    scratch = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        hf.save(model, mapping, scratch)
        note = why_none
        if tokenizer is not None:
            write(tokenizer, scratch)
            note = f"`{tokenizer.name}` (tokenizer.json; end of text: id {tokenizer.eot_id})"
        (scratch / "README.md").write_text(model_card(weights, mapping, max_error, note))
        (scratch / PROVENANCE_FILE).write_text(json.dumps({
            "run_dir": str(weights.run_dir.resolve()), "checkpoint": str(weights.checkpoint),
            "step": weights.step, "architecture": mapping.architecture,
            "max_logit_error": max_error, "danastar_version": __version__,
            "model_config": weights.model_config.to_dict(),
        }, indent=1) + "\n")
        if out.exists():
            out.rmdir()  # empty (checked above)
        scratch.rename(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Exported(out=out, architecture=mapping.architecture, native=mapping.native,
                    step=weights.step, max_error=max_error,
                    files=sorted(p.name for p in out.iterdir()), tokenizer_note=note)


def read_export(export_dir: Path):
    """(ModelConfig, danastar state dict) of a ``danastar export`` directory: the export read
    back into danastar's model."""
    from danastar.export import hf  # noqa: PLC0415 (transformers, the export extra)

    try:
        provenance = json.loads((Path(export_dir) / PROVENANCE_FILE).read_text())
        config = ModelConfig.from_dict(provenance["model_config"])
    except (OSError, ValueError, KeyError) as error:
        raise UserError(f"{export_dir} is not a danastar export ({PROVENANCE_FILE} with its "
                        f"model_config: {type(error).__name__}); give a directory that "
                        "`danastar export` wrote.") from None
    return config, hf.read(Path(export_dir), config, provenance["architecture"])


def compare_logits(weights, model, tokens: int = 32, seed: int = 0) -> float:
    """Largest |difference| between danastar's logits and ``model``'s over the real vocabulary,
    on ``tokens`` random tokens (fewer if the context is shorter), float32."""
    config = weights.model_config
    reference = build_model(config)
    reference.load_state_dict(weights.state_dict)
    reference.float().eval()
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (1, min(tokens, config.max_seq_len)),
                        generator=generator)
    with torch.no_grad():
        ours = reference(ids)[..., :config.vocab_size]
        theirs = model(ids).logits[..., :config.vocab_size]
    if not bool(torch.isfinite(ours).all()):  # finite weights too large: nothing to compare
        raise UserError(f"the weights of {weights.checkpoint} give non-finite logits (NaN or "
                        f"infinity) on random tokens, so the export cannot be checked; export an "
                        f"earlier checkpoint of {weights.run_dir / CHECKPOINTS_DIR}, or train the "
                        f"run again with a lower --lr.")
    return (ours - theirs).abs().max().item()  # NaN where only the export's are not finite
