"""`danastar eval RUN_DIR|EXPORT --tasks T1,T2 [--limit N]`: downstream scores with lm-eval.

    danastar eval runs/my-run --tasks hellaswag,arc_easy,piqa,lambada_openai --limit 500
    danastar eval hf/my-run --tasks my_task --include_path my_tasks/

A run directory or checkpoint is exported to a temporary directory first (as `danastar export`
does); an export directory is evaluated as it is. The scores go to `<run_dir>/eval/<step>.json`
and are printed as a table (docs/export.md).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from danastar.errors import UserError
from danastar.machine import check_cuda_device


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="danastar eval",
        description="Score a run or an export on lm-evaluation-harness tasks.")
    parser.add_argument("path", metavar="RUN_DIR|EXPORT",
                        help="a run directory, a checkpoint folder or a `danastar export` "
                             "directory")
    parser.add_argument("--tasks", required=True,
                        help="comma-separated lm-eval task names, e.g. hellaswag,arc_easy")
    parser.add_argument("--limit", type=int, default=None,
                        help="at most N examples per task (default: all)")
    parser.add_argument("--include_path", type=Path, default=None,
                        help="a folder of your own lm-eval YAML tasks")
    parser.add_argument("--num_fewshot", type=int, default=None,
                        help="examples in each prompt (default: the task's own)")
    parser.add_argument("--batch_size", type=int, default=8, help="default 8")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or mps")
    args = parser.parse_args(argv)
    tasks = [task.strip() for task in args.tasks.split(",") if task.strip()]
    if not tasks:
        raise UserError("--tasks names no task; give lm-eval task names, e.g. "
                        "--tasks hellaswag,arc_easy.")
    for flag, value, low in (("--limit", args.limit, 1), ("--batch_size", args.batch_size, 1),
                             ("--num_fewshot", args.num_fewshot, 0)):
        if value is not None and value < low:
            raise UserError(f"{flag} {value} must be at least {low}.")
    if args.include_path is not None and not args.include_path.is_dir():
        raise UserError(f"--include_path {args.include_path} is not a folder; give the folder "
                        "that holds your YAML tasks.")
    check_device(args.device)  # before the export and lm-eval's start-up
    from danastar.export.evaluate import evaluate, table

    result = evaluate(Path(args.path), tasks, limit=args.limit, include_path=args.include_path,
                      batch_size=args.batch_size, device=args.device,
                      num_fewshot=args.num_fewshot)
    print(table(result.scores))
    print(f"written to {result.written}")
    return 0


def check_device(requested: str) -> None:
    """Refuse a --device that lm-eval would not run on here: an unknown name (it would run on
    the CPU without a word), or a GPU this machine does not have."""
    import torch

    text = requested.strip().lower()
    match = re.fullmatch(r"cpu|mps|cuda(?::([0-9]+))?", text)
    if match is None:
        raise UserError(f"--device {requested!r} is not known; use cpu, cuda or cuda:N.")
    if text == "mps" and not torch.backends.mps.is_available():
        raise UserError("--device mps asks for Apple's GPU, which is not available here; use "
                        "--device cpu.")
    if text.startswith("cuda"):
        check_cuda_device(requested, int(match.group(1) or 0), "--device cpu")
