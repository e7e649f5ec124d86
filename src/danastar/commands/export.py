"""`danastar export RUN_DIR|CHECKPOINT --out DIR`: a trained model in the Hugging Face format.

    danastar export runs/my-run --out hf/my-run
    python -c "from transformers import AutoModelForCausalLM; \\
               AutoModelForCausalLM.from_pretrained('hf/my-run')"

Writes safetensors weights, config.json, generation_config.json, the tokenizer where the run has
one, and a model card (README.md) with the run's optimizer, step, tokens and validation loss.
Llama and Qwen3 / Qwen3-Next map onto transformers' own classes; Enoki and the models no class
computes ship their class as modeling_danastar.py (loaded with trust_remote_code=True). The
export checks that its logits equal danastar's before writing anything (docs/export.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from danastar.errors import UserError
from danastar.progress import Stages


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="danastar export",
        description="Write a run's checkpoint as a Hugging Face model directory.")
    parser.add_argument("path", metavar="RUN_DIR|CHECKPOINT",
                        help="a run directory (its newest checkpoint) or one checkpoint folder")
    parser.add_argument("--out", required=True, type=Path,
                        help="the directory to write (new or empty)")
    parser.add_argument("--custom", action="store_true",
                        help="export danastar's own class (trust_remote_code) even where "
                             "transformers has one")
    args = parser.parse_args(argv)
    check_out(args.out)  # before the export's work, which the last step would otherwise lose
    from danastar.export import export

    Stages("danastar export").start(  # tens of seconds on a CPU for a small model
        f"reading {args.path}, checking that the export's logits equal danastar's, and writing "
        f"{args.out}", only_on_terminal=True)  # may end in a refusal: then one sentence
    result = export(Path(args.path), args.out, custom=args.custom)
    kind = "transformers' own class" if result.native else "trust_remote_code=True"
    print(f"exported step {result.step} to {result.out} as {result.architecture} ({kind}); "
          f"logits equal danastar's to {result.max_error:.1e}")
    print(f"files: {', '.join(result.files)}")
    print(f"tokenizer: {result.tokenizer_note}")
    return 0


def check_out(out: Path) -> None:
    """Refuse an --out the export could not be put at: a file on its way, or a folder that
    takes no new files. The export is written beside its destination and renamed into place, so
    the folder tried is the nearest existing one of --out's parent (tried by creating a folder
    there, as the export will)."""
    fix = "give --out a path in a writable folder"
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give --out a new or empty directory.")
    existing = next(p for p in (out.parent, *out.parent.parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"--out {out} cannot be written: {existing} is a file, not a folder; "
                        f"{fix}.")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".danastar-write-check-", dir=existing))
    except OSError as error:
        raise UserError(f"--out {out} cannot be written: {existing} does not take new files "
                        f"({error.strerror}); {fix}.") from None
