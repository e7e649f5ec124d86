"""`danastar generate RUN_DIR|CHECKPOINT --prompt TEXT`: sample from a trained model.

    danastar generate runs/my-run --prompt "ROMEO:" --tokens 200
    danastar generate runs/my-run/checkpoints/permanent-00001000 --prompt "The" --temperature 0

The model is rebuilt from the run's own config.yaml and plan.json, its weights read from the
newest complete checkpoint of the run (or the one named), single-file (`state.pt`) or sharded
(`torch.distributed.checkpoint`, read whole in this one process), and the prompt encoded with
the run's own tokenizer (the synthetic source has none: the prompt is then token ids, e.g.
"1 2 3"). Sampling uses the model's KV cache, with temperature, top-k and a seed; it reads
checkpoints and writes nothing. It names the checkpoint it sampled from (path and step) on
standard error, so that standard output holds the sample alone.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import warnings
from pathlib import Path

from danastar.errors import UserError

DEVICES = re.compile(r"auto|cpu|cuda(?::([0-9]+))?")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="danastar generate",
                                     description="Sample text from a trained run's checkpoint.")
    parser.add_argument("path", metavar="RUN_DIR|CHECKPOINT",
                        help="a run directory (its newest checkpoint) or one checkpoint folder")
    parser.add_argument("--prompt", default="", help="text to continue (default: none)")
    parser.add_argument("--tokens", type=int, default=200, help="new tokens (default 200)")
    parser.add_argument("--temperature", type=float, default=0.8,
                        help="0 is greedy (default 0.8)")
    parser.add_argument("--top_k", type=int, default=50, help="0 keeps all (default 50)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    args = parser.parse_args(argv)
    if args.tokens < 1:
        raise UserError(f"--tokens {args.tokens} must be at least 1.")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise UserError(f"--temperature {args.temperature:g} must be a finite number >= 0 (0 is "
                        "greedy; 0.8 the default).")
    if args.top_k < 0:
        raise UserError(f"--top_k {args.top_k} must be >= 0 (0 keeps every token).")
    print(generate(Path(args.path), args.prompt, tokens=args.tokens,
                   temperature=args.temperature, top_k=args.top_k or None, seed=args.seed,
                   device=args.device))
    return 0


def find_checkpoint(path: Path) -> tuple[Path, Path, dict]:
    """(run directory, checkpoint folder, its meta) for a run directory or a checkpoint folder."""
    from danastar.train.checkpoint import META_FILE, Checkpointer, verify

    if (path / META_FILE).is_file():
        meta, problem = verify(path)
        if meta is None:
            raise UserError(f"checkpoint {path} cannot be used ({problem}); name another "
                            f"checkpoint or the run directory.")
        return path.parent.parent, path, meta
    if not (path / "config.yaml").is_file():
        raise UserError(f"{path} is neither a run directory (with config.yaml) nor a checkpoint "
                        f"folder (with {META_FILE}); give one of them.")
    # Not Checkpointer.find_latest: that sets corrupt checkpoints aside, and this only reads.
    skipped = []
    for candidate in reversed(Checkpointer(path / "checkpoints", sharded=False).checkpoints()):
        meta, problem = verify(candidate)
        if meta is not None:
            for newer, why in skipped:
                _say(f"checkpoint {newer} cannot be used ({why}); sampling from the older "
                     f"{candidate.name} instead.")
            return path, candidate, meta
        skipped.append((candidate, problem))
    if skipped:
        listed = "; ".join(f"{c.name}: {why}" for c, why in skipped)
        raise UserError(f"run {path} has no usable checkpoint ({listed}); train it further or "
                        f"name another checkpoint folder.")
    raise UserError(f"run {path} has no complete checkpoint yet; train it further or name a "
                    f"checkpoint folder.")


def _say(message: str) -> None:
    print(f"danastar generate: {message}", file=sys.stderr, flush=True)


def pick_device(requested: str):
    """The torch device `--device` names: auto (a GPU when one is visible), cpu, cuda, cuda:N."""
    import torch

    text = requested.strip().lower()
    match = DEVICES.fullmatch(text)
    if match is None:
        raise UserError(f"--device {requested!r} is not known; use auto, cpu, cuda or cuda:N.")
    if text == "cpu" or (text == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError(f"--device {requested} asks for a GPU, but no CUDA device is visible; "
                        "use --device cpu (or auto).")
    index, count = int(match.group(1) or 0), torch.cuda.device_count()
    if index >= count:
        raise UserError(f"--device {requested}: {count} CUDA device(s) are visible (cuda:0 to "
                        f"cuda:{count - 1}); name one of them.")
    return torch.device("cuda", index)


def load_model(run_dir: Path, checkpoint: Path, layout: str, device):
    """The run's model with the checkpoint's weights, in eval mode on `device`."""
    import torch

    from danastar.config import load_config, make_run_plan, model_config
    from danastar.models import build_model
    from danastar.train.checkpoint import STATE_FILE

    try:
        config, _ = load_config(["--config", str(run_dir / "config.yaml")])
        saved = json.loads((run_dir / "plan.json").read_text())
    except (OSError, ValueError) as error:
        raise UserError(f"run {run_dir} has no readable plan.json ({error}); give a run "
                        f"directory written by danastar train.") from None
    plan = make_run_plan(config, saved["plan"]["vocab_size"],
                         saved["batch_layout"]["data_parallel_size"])
    with torch.device(device):
        model = build_model(model_config(config, plan))
    if layout == "single":
        state = torch.load(checkpoint / STATE_FILE, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
    else:
        import torch.distributed.checkpoint as dcp

        # The shards of every rank, read whole into this process (no process group needed).
        weights = {"model": model.state_dict()}
        with warnings.catch_warnings():  # "assuming ... a single process": that is the intent
            warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
            dcp.load(weights, checkpoint_id=str(checkpoint))
        model.load_state_dict(weights["model"])
    return model.eval(), config


def generate(path: Path, prompt: str, *, tokens: int, temperature: float, top_k: int | None,
             seed: int, device: str = "auto") -> str:
    import torch

    from danastar.data.loader import TokenData
    from danastar.data.prepare import ensure_prepared

    device = pick_device(device)
    run_dir, checkpoint, meta = find_checkpoint(path)
    model, config = load_model(run_dir, checkpoint, meta["layout"], device)
    tokenizer = None
    if config.data.dataset != "synthetic":
        tokenizer = TokenData.open(ensure_prepared(config.data.dataset)).tokenizer()
    if tokenizer is not None:
        ids = tokenizer.encode(prompt) if prompt else [tokenizer.eot_id]
    else:
        try:
            ids = [int(token) for token in prompt.split()] or [0]
        except ValueError:
            raise UserError("this run's data has no tokenizer; give the prompt as token ids "
                            "separated by spaces, e.g. --prompt '1 2 3'.") from None
    vocab = model.config.vocab_size
    outside = sorted({i for i in ids if not 0 <= i < vocab})
    if outside and tokenizer is None:
        raise UserError(f"--prompt holds token id(s) {', '.join(map(str, outside[:5]))} outside "
                        f"this model's vocabulary of {vocab} (ids 0 to {vocab - 1}); give ids "
                        "in that range.")
    if outside:
        raise UserError(f"the tokenizer of {config.data.dataset} turns --prompt into id(s) up to "
                        f"{outside[-1]}, outside this model's vocabulary of {vocab}: the data was "
                        "prepared again with another tokenizer after the run trained; prepare it "
                        "with the run's tokenizer to sample from this run.")
    context = model.config.max_seq_len
    room = context - len(ids)
    if room < 1:
        raise UserError(f"--prompt is {len(ids)} tokens, as long as the model's context "
                        f"({context}); give a shorter --prompt.")
    if tokens > room:
        _say(f"stopped after {room} new tokens, at the model's context of {context} tokens (the "
             f"prompt takes {len(ids)}); ask for --tokens {room} or fewer, or give a shorter "
             "--prompt.")
    _say(f"sampling from {checkpoint} (step {meta.get('step', '?')}, {device.type})")
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids], device=device), min(tokens, room),
                             temperature=temperature, top_k=top_k)
    new = out[0].tolist()
    return tokenizer.decode(new) if tokenizer is not None else " ".join(map(str, new))
