"""Data preparation throughput and loader cost relative to a training step.

    python benchmarks/prepare.py [--repeats 3] [--copies 4] [--steps 60]

1. Preparation: tokens/s of `prepare_source` on a local .jsonl corpus (the Shakespeare works,
   `--copies` times) with the Shakespeare BPE, with 1 worker and with one per core: in total (per
   wall-clock second) and per core (per CPU-second of all processes), medians of `--repeats`.
   Also the first-time Shakespeare preparation, end to end (download cached, BPE training included).
2. Loader: time a training step of the CPU default run (src/danastar/configs/cpu_shakespeare.yaml:
   model, micro-batch, sequence length) spends blocked in `TrainLoader.get` (prefetching, as in
   training), and the time to assemble one batch without prefetching, both relative to the step.

Writes benchmarks/results/prepare-<device>.json; docs/benchmarks.md has the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import torch
import yaml

from danastar.data.loader import TokenData, TrainLoader
from danastar.data.prepare import prepare_source
from danastar.data.sources import download_shakespeare, shakespeare_documents
from danastar.train.logging import cpu_model

ROOT = Path(__file__).resolve().parent.parent


def timed(function) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process and its finished children) of one call."""

    def cpu() -> float:
        return sum(
            r.ru_utime + r.ru_stime
            for r in (
                resource.getrusage(resource.RUSAGE_SELF),
                resource.getrusage(resource.RUSAGE_CHILDREN),
            )
        )

    wall, start = time.perf_counter(), cpu()
    function()
    return time.perf_counter() - wall, cpu() - start


def preparation(scratch: Path, repeats: int, copies: int) -> dict:
    start = time.perf_counter()
    shakespeare_meta = prepare_source("shakespeare", scratch / "shakespeare", progress=False)
    first_time = time.perf_counter() - start

    documents = [text for _, text in shakespeare_documents(download_shakespeare())] * copies
    corpus = scratch / "corpus"
    corpus.mkdir()
    (corpus / "works.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in documents))
    tokenizer = str(scratch / "shakespeare" / "tokenizer.json")
    # One core per worker in every run, so that per-core figures compare (the pool's workers do
    # this themselves; the single in-process worker would otherwise use the tokenizers' threads).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    cores = len(os.sched_getaffinity(0))
    results = {
        "shakespeare_first_time_s": first_time,
        "shakespeare_tokens": shakespeare_meta["train_tokens"] + shakespeare_meta["val_tokens"],
        "corpus_bytes": (corpus / "works.jsonl").stat().st_size,
        "cores": cores,
        "runs": [],
    }
    for workers in sorted({1, cores}):
        outputs = iter(range(repeats))
        tokens = {}

        # Called within this iteration only, so binding the loop's variables late is intended.
        def run(workers=workers, outputs=outputs, tokens=tokens):
            meta = prepare_source(
                str(corpus),
                scratch / f"out-{workers}-{next(outputs)}",
                tokenizer=tokenizer,
                workers=workers,
                val_fraction=0.1,
                progress=False,
            )
            tokens["count"] = meta["train_tokens"] + meta["val_tokens"]

        times = [timed(run) for _ in range(repeats)]
        wall, cpu = statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
        # Per core: tokens per CPU-second of all the processes involved, which does not depend on
        # how many cores other users of a shared machine leave free; in total: per wall second.
        results["runs"].append(
            {
                "workers": workers,
                "wall_s": wall,
                "cpu_s": cpu,
                "tokens": tokens["count"],
                "tokens_per_s": tokens["count"] / wall,
                "tokens_per_cpu_s": tokens["count"] / cpu,
            }
        )
    return results


def loader_cost(scratch: Path, steps: int) -> dict:
    from danastar.models import ModelConfig, build_model
    from danastar.optim import build_optimizer

    preset = yaml.safe_load(
        (ROOT / "src" / "danastar" / "configs" / "cpu_shakespeare.yaml").read_text()
    )
    batch, seq = preset["train"]["batch_size"], preset["train"]["sequence_length"]
    data = TokenData.open(scratch / "shakespeare")
    torch.manual_seed(0)
    config = ModelConfig.from_heads(
        preset["model"]["arch"],
        preset["model"]["heads"],
        vocab_size=data.vocab_size,
        max_seq_len=seq,
    )
    model = build_model(config)
    optimizer = build_optimizer(preset["optim"]["name"], model.named_parameters(), lr=1e-3)

    def train_step(x, y):
        loss = model(x, y)[0]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    waits, totals = [], []
    with TrainLoader(data, seq_len=seq, micro_batch_size=batch, acc_steps=1, seed=0) as loader:
        for step in range(steps):
            start = time.perf_counter()
            x, y = loader.get(step)
            got = time.perf_counter()
            train_step(x, y)
            end = time.perf_counter()
            if step >= 5:  # warm-up steps excluded
                waits.append(got - start)
                totals.append(end - start)
    with TrainLoader(
        data, seq_len=seq, micro_batch_size=batch, acc_steps=1, seed=0, prefetch=False
    ) as loader:
        assemble = [timed(lambda s=s: loader.get(s))[0] for s in range(steps)]
    step_s = statistics.median(totals)
    return {
        "model": f"{config.arch} heads={preset['model']['heads']} "
        f"({sum(p.numel() for p in model.parameters()):,} parameters)",
        "micro_batch": batch,
        "seq_len": seq,
        "optimizer": preset["optim"]["name"],
        "threads": torch.get_num_threads(),
        "step_s": step_s,
        "get_wait_s": statistics.median(waits),
        "assemble_s": statistics.median(assemble),
        "get_wait_fraction": statistics.median(waits) / step_s,
        "assemble_fraction": statistics.median(assemble) / step_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--copies", type=int, default=4, help="copies of the Shakespeare works in the timed corpus"
    )
    parser.add_argument(
        "--steps", type=int, default=60, help="training steps timed for the loader cost"
    )
    args = parser.parse_args()
    device = (
        torch.cuda.get_device_name().replace(" ", "-").lower()
        if torch.cuda.is_available()
        else "cpu"
    )
    with tempfile.TemporaryDirectory() as scratch:
        prep = preparation(Path(scratch), args.repeats, args.copies)
        loader = loader_cost(Path(scratch), args.steps)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "processor": cpu_model(),
            "cores": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "load_average_at_end": os.getloadavg(),
        },
        "versions": {
            name: version(name) for name in ("danastar", "torch", "numpy", "tokenizers", "tiktoken")
        },
        "preparation": prep,
        "loader": loader,
    }
    out = ROOT / "benchmarks" / "results" / f"prepare-{device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
