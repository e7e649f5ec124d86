"""`danastar generate RUN_DIR|CHECKPOINT --prompt TEXT`: sample from a trained model.

    danastar generate runs/my-run --prompt "ROMEO:" --tokens 200
    danastar generate runs/my-run/checkpoints/permanent-00001000 --prompt "The" --temperature 0

The model and its weights come from `danastar.train.weights.load_weights`: the newest complete
checkpoint of the run (or the one named), single-file (`state.pt`) or sharded
(`torch.distributed.checkpoint`, read whole in this one process), and the prompt is encoded with
the run's own tokenizer (the synthetic source has none: the prompt is then token ids, e.g.
"1 2 3"). Sampling uses the model's KV cache, with temperature, top-k and a seed; it reads
checkpoints and writes nothing. It names the checkpoint it sampled from (path and step) on
standard error, so that standard output holds the sample alone.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from danastar.errors import UserError
from danastar.machine import check_cuda_device

DEVICES = re.compile(r"auto|cpu|cuda(?::([0-9]+))?")
DEFAULT_TOKENS = 200  # new tokens when --tokens is not given, if the model's context has room


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="danastar generate",
                                     description="Sample text from a trained run's checkpoint.")
    parser.add_argument("path", metavar="RUN_DIR|CHECKPOINT",
                        help="a run directory (its newest checkpoint) or one checkpoint folder")
    parser.add_argument("--prompt", default="", help="text to continue (default: none)")
    parser.add_argument("--tokens", type=int, default=None,
                        help=f"new tokens (default {DEFAULT_TOKENS}, or as many as the model's "
                             "context leaves after the prompt)")
    parser.add_argument("--temperature", type=float, default=0.8,
                        help="0 is greedy (default 0.8)")
    parser.add_argument("--top_k", type=int, default=50, help="0 keeps all (default 50)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    args = parser.parse_args(argv)
    if args.tokens is not None and args.tokens < 1:
        raise UserError(f"--tokens {args.tokens} must be at least 1.")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise UserError(f"--temperature {args.temperature:g} must be a finite number >= 0 (0 is "
                        "greedy; 0.8 the default).")
    if args.top_k < 0:
        raise UserError(f"--top_k {args.top_k} must be >= 0 (0 keeps every token).")
    if not -2**63 <= args.seed < 2**64:  # torch's generator takes no other
        raise UserError(f"--seed {args.seed} is outside the seeds torch takes ({-2**63} to "
                        f"{2**64 - 1}); give a seed in that range, e.g. --seed 0.")
    print(generate(Path(args.path), args.prompt, tokens=args.tokens,
                   temperature=args.temperature, top_k=args.top_k or None, seed=args.seed,
                   device=args.device))
    return 0


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
    index = int(match.group(1) or 0)
    check_cuda_device(requested, index, "--device cpu (or auto)")
    return torch.device("cuda", index)


def generate(path: Path, prompt: str, *, tokens: int | None, temperature: float,
             top_k: int | None, seed: int, device: str = "auto") -> str:
    import torch

    from danastar.data.loader import TokenData
    from danastar.models import build_model
    from danastar.train.weights import load_weights

    device = pick_device(device)
    weights = load_weights(path, say=_say, using="sampling from")
    with torch.device(device):
        model = build_model(weights.model_config)
    model.load_state_dict(weights.state_dict)
    model.eval()
    dataset = weights.dataset
    tokenizer = None
    if dataset != "synthetic":
        tokenizer = TokenData.open(prepared_data(dataset, weights.identity)).tokenizer()
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
        raise UserError(f"the tokenizer of {dataset} turns --prompt into id(s) up to "
                        f"{outside[-1]}, outside this model's vocabulary of {vocab}: the data was "
                        "prepared again with another tokenizer after the run trained; prepare it "
                        "with the run's tokenizer to sample from this run.")
    context = model.config.max_seq_len
    room = context - len(ids)
    if room < 1:
        raise UserError(f"--prompt is {len(ids)} tokens, as long as the model's context "
                        f"({context}); give a shorter --prompt.")
    if tokens is None:  # the default fits the model: no more than its context leaves
        tokens = min(DEFAULT_TOKENS, room)
    if tokens > room:
        _say(f"stopped after {room} new tokens, at the model's context of {context} tokens (the "
             f"prompt takes {len(ids)}); ask for --tokens {room} or fewer, or give a shorter "
             "--prompt.")
    _say(f"sampling from {weights.checkpoint} (step {weights.step}, {device.type})")
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids], device=device), min(tokens, room),
                             temperature=temperature, top_k=top_k)
    new = out[0].tolist()
    return tokenizer.decode(new) if tokenizer is not None else " ".join(map(str, new))


def prepared_data(dataset: str, identity: dict) -> Path:
    """The prepared directory of the run's data, whose tokenizer reads the prompt and writes the
    sample; refused, naming what to do here, where it is gone or not prepared."""
    from danastar.data.prepare import AUTO_PREPARED, default_data_dir, ensure_prepared, is_prepared
    from danastar.data.sources import SOURCES

    tokenizer = identity.get("tokenizer")
    needed = "sampling needs the tokenizer prepared with it" + (f" ({tokenizer})" if tokenizer
                                                                else "")
    if dataset in SOURCES:
        directory = default_data_dir(dataset)
        if dataset not in AUTO_PREPARED and not is_prepared(directory):
            raise UserError(f"this run trained on {dataset}, which is not prepared here "
                            f"({directory}), and {needed}; run `danastar prepare {dataset}` "
                            "first.")
    elif not Path(dataset).expanduser().exists():
        raise UserError(f"this run trained on the data in {dataset}, which is not there now (a "
                        f"relative path is read from the current folder), and {needed}; put that "
                        "directory back, or run danastar generate from the folder the run was "
                        "trained in.")
    return ensure_prepared(dataset)
