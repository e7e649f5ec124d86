"""`danastar train`: parse the configuration, then plan (`--dry_run`), launch (`--nproc N`) or
train.

    danastar train                                   # the CPU preset on Shakespeare
    danastar train --arch enoki --opt adana --heads 3 --dataset fineweb --dry_run
    danastar train --heads 6 --dry_run --json         # the whole resolved plan, for tools
    danastar train --heads 2 --nproc 2 --distributed_backend fsdp
    torchrun --nproc_per_node 8 -m danastar train --heads 12 --distributed_backend fsdp

Every flag and key is documented in docs/training.md (`danastar train --help` lists the flags).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import NoReturn

from danastar.config import (
    TrainConfig,
    batch_layout,
    check_run_dir,
    epochs_text,
    load_config,
    make_run_plan,
    model_config,
    repetition_warning,
    run_directory,
    schedule_options,
)
from danastar.data.prepared import META_FILE, RAW_META, prepared_format
from danastar.errors import UserError, report


def main(argv: list[str]) -> int:
    config, args = load_config(argv)
    planning = getattr(args, "dry_run", False)
    if getattr(args, "json", False) and not planning:
        raise UserError("--json prints the plan of --dry_run as JSON; add --dry_run or drop "
                        "--json.")
    # srun/mpirun workers: ranks from the launcher's variables, exported as torch's (train reads
    # only those, so the engine stays launcher-agnostic).
    from danastar.launch.env import export_torch_environment

    export_torch_environment()
    from danastar.launch.local import launch, under_torchrun
    from danastar.train.identity import planned_run_dir

    worker = under_torchrun()  # one of N processes: rank 0 decides about the run directory
    world_size = int(os.environ.get("WORLD_SIZE", config.parallel.nproc))
    # --run_dir, or the automatic directory of these settings (rank 0 chooses it again when the
    # run starts); a worker leaves the checks below to rank 0.
    run_dir, note = (run_directory(config), None) if worker else \
        planned_run_dir(config, world_size)
    if not planning and not worker:
        # A run directory in use by another live process is said first (rank 0 takes its lock
        # when the run starts; this only looks).
        from danastar.rundir.lock import check_free

        check_free(run_dir, "use another --run_dir")
    # What training would refuse is refused here, as the dry run does: once (not by each of N
    # workers), before data is prepared, a process is started or a file is written.
    planned = dry_run(config, run_dir=run_dir, run_dir_note=note)
    if not worker:
        check_resume(config, run_dir, planned["batch_layout"]["world_size"])
    if planning:
        warning = planned_warning(planned)
        if getattr(args, "json", False):
            print(json.dumps(planned, indent=2))
            if warning:
                print(warning, file=sys.stderr)
        else:
            print(summary(config, planned))
        return 0
    if not under_torchrun():
        # Facts of this machine, which a dry run (planning for any machine) does not check: here
        # they are refused once rather than by each worker, and before data is prepared.
        check_this_machine(config)
    if config.parallel.nproc > 1 and not under_torchrun():
        if config.data.dataset != "synthetic":
            from danastar.data.prepare import ensure_prepared

            ensure_prepared(config.data.dataset)  # missing data is one message; prepared once
        # The workers' stop file goes in the run directory (now the data is there to compare).
        return launch(config.parallel.nproc, argv, planned_run_dir(config, world_size)[0])
    return run_training(config)


def run_training(config: TrainConfig) -> int:
    """Train in this process. A user error that every rank raises is printed by rank 0 alone;
    Ctrl-C pressed twice (or before training starts) stops at once with exit 130, no traceback."""
    from danastar.launch.local import under_torchrun

    if not (under_torchrun() and int(os.environ["WORLD_SIZE"]) > 1):
        return train_here(config)
    try:
        code = train_here(config)
    except UserError as error:  # said here, so that rank 0 too leaves through leave_worker
        code = report(error, "train")
    leave_worker(code)  # after a complete run, a stop, a refusal or Ctrl-C alike


def train_here(config: TrainConfig) -> int:
    from danastar.launch.local import is_main_process
    from danastar.train.signals import INTERRUPTED_EXIT_CODE

    try:
        from danastar.train.loop import train

        return train(config)
    except UserError as error:
        if error.reported_by_rank_0:
            return error.exit_code
        raise
    except KeyboardInterrupt:
        if is_main_process():
            print("\nCtrl-C: stopped at once; checkpoints are written atomically, so none is "
                  "left half-written: run the same command again to resume from the last one.",
                  file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT_CODE


def leave_worker(code: int) -> NoReturn:
    """End a distributed worker whose run is over (complete, stopped or refused): every file is
    closed and the process group destroyed, but the model, its meshes and sharded modules still hold
    the group, and the interpreter's exit would tear it down again, which now and then aborts
    inside gloo's threads ("terminate called without an active exception") and fails the job
    after a complete run. Flush what is buffered and leave without that second teardown."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def dry_run(config: TrainConfig, world_size: int | None = None, run_dir: Path | None = None,
            run_dir_note: str | None = None) -> dict:
    """The resolved plan, batch layout, corpus epochs, compute, run directory and config as
    JSON-ready data; needs no data on disk. `run_dir` (with its `planned_run_dir` note): where
    the caller will run it; None: where `danastar train` would."""
    from danastar.train.identity import planned_run_dir

    if world_size is None:  # `danastar submit` knows the world it asks SLURM for
        world_size = int(os.environ.get("WORLD_SIZE", config.parallel.nproc))
    layout = batch_layout(config, world_size)
    vocab_size, vocab_from = planned_vocab_size(config.data.dataset)
    plan = make_run_plan(config, vocab_size, layout.data_parallel_size)
    model = check_optimizer_settings(plan, config)
    if run_dir is None:
        run_dir, run_dir_note = planned_run_dir(config, world_size)
    check_run_dir(run_dir)
    corpus_tokens, corpus_from = planned_train_tokens(config.data.dataset)
    flops_per_token = model.flops_per_token(layout.sequence_length)
    return {
        "plan": plan.to_dict(),
        "batch_layout": layout.to_dict(),
        "schedule": {"name": config.optim.scheduler, **schedule_options(config)},
        "dataset": config.data.dataset,
        "vocab_size_from": vocab_from,
        # how many times the run reads the corpus (None: not known before it is prepared)
        "corpus": {"train_tokens": corpus_tokens, "train_tokens_from": corpus_from,
                   "epochs": plan.tokens / corpus_tokens if corpus_tokens else None},
        # training FLOPs: 6·N per token for the weights, plus attention (as for the MFU)
        "compute": {"flops_per_token": flops_per_token, "flops": flops_per_token * plan.tokens},
        "run_dir": str(run_dir),
        "run_dir_note": run_dir_note,
        "config": config.to_dict(),
    }


def planned_warning(planned: dict) -> str | None:
    """The plan's one-line warning when it reads its corpus too many times (see
    `repetition_warning`)."""
    plan = planned["plan"]
    return repetition_warning(plan["tokens"], plan["tokens_per_step"],
                              planned["corpus"]["train_tokens"], planned["dataset"])


def check_resume(config: TrainConfig, run_dir: Path, world_size: int) -> None:
    """Refuse, as training would when it resumes (the same sentence), to continue the run that
    `run_dir` holds with settings that change its trajectory. Reads the directory, writes nothing;
    data not prepared yet is compared by training once it is."""
    from danastar.train import identity
    from danastar.train.data import open_tokens

    if not config.checkpoint.auto_resume or not identity.has_earlier_run(run_dir):
        return  # training starts afresh there, moving an earlier run aside
    tokens = open_tokens(config, prepare=False)
    if tokens is None:
        return
    changes = identity.recorded_changes(run_dir, identity.planned_identity(config, world_size,
                                                                          tokens))
    if changes is not None and changes[1]:
        step, refused, _accepted = changes
        raise identity.refusal(run_dir, step, refused)


def check_this_machine(config: TrainConfig) -> None:
    """This machine has the devices the processes will ask for and the trackers asked for."""
    import importlib.util

    import torch

    from danastar.train.parallel import choose_device

    device = choose_device(config.train.device)
    nproc, gpus = config.parallel.nproc, torch.cuda.device_count()
    if device.type == "cuda" and nproc > gpus:
        raise UserError(f"--nproc {nproc} starts one process per GPU but this machine has {gpus}; "
                        f"use --nproc {gpus} or less (or train.device=cpu).")
    if config.logging.wandb and importlib.util.find_spec("wandb") is None:
        raise UserError("wandb is not installed; pip install 'danastar[wandb]' or pass --no_wandb.")
    if config.logging.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise UserError("TensorBoard is not installed; pip install 'danastar[tensorboard]' or drop "
                        "logging.tensorboard.")


def check_optimizer_settings(plan, config: TrainConfig):
    """Build the planned optimizer and schedule over the real model's parameter groups, with the
    model built on the meta device (no memory, no initialisation), so that a dry run rejects the
    settings training would reject; returns that model (for its FLOPs)."""
    import torch

    from danastar.models import build_model
    from danastar.train.loop import make_optimizer

    with torch.device("meta"):
        model = build_model(model_config(config, plan))
    make_optimizer(plan, config, model.param_groups(plan.weight_decay))
    return model


def planned_vocab_size(dataset: str) -> tuple[int, str]:
    """(vocabulary size, where it comes from) of a dataset, prepared or not."""
    from danastar.data import prepare, sources

    gpt2_vocab_size = RAW_META["vocab_size"]  # what raw token files hold (FineWeb's tokenizer too)
    path = Path(dataset).expanduser()
    for directory in (path, prepare.default_data_dir(dataset)):
        layout = prepared_format(directory) if directory.is_dir() else None
        if layout == "meta":
            meta = prepare.read_meta(directory)
            if meta is None or not isinstance(meta.get("vocab_size"), int):
                if dataset in prepare.AUTO_PREPARED and directory != path:
                    continue  # training prepares this default directory again before it starts
                from danastar.data.prepared import repair_command
                from danastar.errors import UserError

                raise UserError(f"{directory / META_FILE} is unreadable; repair the directory "
                                f"with {repair_command(directory, meta)}.")
            return int(meta["vocab_size"]), f"{directory / META_FILE}"
        if layout == "raw":
            return gpt2_vocab_size, "raw GPT-2 train.bin/val.bin"
    if dataset == "synthetic":
        from danastar.train.data import SYNTHETIC_VOCAB_SIZE

        return SYNTHETIC_VOCAB_SIZE, "the synthetic source"
    if dataset in sources.SOURCES and dataset != "fineweb":
        return sources.Corpus.default_vocab_size, f"the BPE {dataset} is prepared with on first use"
    return gpt2_vocab_size, "GPT-2 (fineweb's tokenizer; assumed for data not prepared yet)"


def planned_train_tokens(dataset: str) -> tuple[int | None, str]:
    """(training tokens, where the number comes from) of a dataset, prepared or not; None where
    it is not known before the data is prepared."""
    from danastar.data import prepare, sources

    if dataset == "synthetic":
        from danastar.train.data import SYNTHETIC_TRAIN_TOKENS

        return SYNTHETIC_TRAIN_TOKENS, "the synthetic source"
    path = Path(dataset).expanduser()
    for directory in (path, prepare.default_data_dir(dataset)):
        layout = prepared_format(directory) if directory.is_dir() else None
        if layout == "meta":
            tokens = (prepare.read_meta(directory) or {}).get("train_tokens")
            if isinstance(tokens, int):
                return tokens, str(directory / META_FILE)
        elif layout == "raw" and (directory / "train.bin").is_file():
            train = directory / "train.bin"  # the original release's uint16 GPT-2 tokens
            return train.stat().st_size // 2, str(train)
    if dataset == "shakespeare":
        return sources.SHAKESPEARE_TRAIN_TOKENS, ("what `danastar prepare shakespeare` gives (not "
                                                  "prepared yet)")
    return None, f"{dataset} is not prepared yet"


# ----------------------------------------------------------------------------------------------
# The dry run as a person reads it

def summary(config: TrainConfig, planned: dict) -> str:
    """The dry run in about twenty lines: model and parameters, tokens and epochs, batch, LR and
    schedule, weight decay, compute, an estimated time on this machine, the run directory."""
    plan, layout, corpus = planned["plan"], planned["batch_layout"], planned["corpus"]
    rows: list[tuple[str, str]] = []
    vocabulary = f"vocabulary {plan['vocab_size']:,}"
    if plan["padded_vocab_size"] != plan["vocab_size"]:
        vocabulary += f" (padded to {plan['padded_vocab_size']:,})"
    layers = f"{plan['n_layer']} layer{'s' if plan['n_layer'] != 1 else ''}"
    rows.append(("model", f"{plan['arch']}, {plan['heads']} heads: {layers}, "
                          f"width {plan['n_embd']:,}, {plan['n_head']} attention heads of "
                          f"{plan['head_dim']}, MLP {plan['mlp_hidden']:,}; {vocabulary}"))
    convention = f"P = 12·d²·L = {plan['non_embedding_params']:,} for the LR law"
    if plan["moe"]:
        convention = (f"P = {plan['active_non_embedding_params']:,} active for the LR law, "
                      f"12·d²·L with the experts a token passes through")
        shared = ("a gated shared expert" if plan["use_gated_shared_expert"]
                  else f"{plan['moe_num_shared_experts']} shared")
        rows.append(("experts", f"{plan['moe_num_experts']} per MoE layer ({shared}), "
                                f"{plan['moe_num_experts_per_tok']} routed per token, in "
                                f"{len(plan['moe_layers'])} of {plan['n_layer']} layers"))
        rows.append(("parameters", f"{plan['exact_total_params']:,} in all, "
                                   f"{plan['exact_active_params']:,} active per token "
                                   f"({convention})"))
    else:
        rows.append(("parameters", f"{plan['exact_total_params']:,} "
                                   f"({plan['exact_non_embedding_params']:,} without the "
                                   f"embeddings; {convention})"))
    budget = ("iterations as configured" if config.train.iterations is not None else
              f"the Chinchilla budget: 20 tokens per {'active ' if plan['moe'] else ''}parameter")
    rows.append(("tokens", f"{plan['tokens']:,} = {plan['iterations']:,} steps × "
                           f"{plan['tokens_per_step']:,} tokens ({budget})"))
    epochs = epochs_text(plan["tokens"], corpus["train_tokens"], planned["dataset"])
    rows.append(("data", epochs + (f" (from {corpus['train_tokens_from']})"
                                   if corpus["train_tokens"] else "")))
    processes = layout["world_size"]
    rows.append(("batch", f"{layout['global_batch']:,} sequences × {layout['sequence_length']:,} "
                          f"tokens per step: {layout['micro_batch_per_rank']:,} per process × "
                          f"{layout['data_parallel_size']} data-parallel "
                          f"process{'es' if layout['data_parallel_size'] > 1 else ''} × "
                          f"{layout['acc_steps']} accumulation step"
                          f"{'s' if layout['acc_steps'] > 1 else ''}"
                          + (f" ({processes} processes in all)"
                             if processes != layout["data_parallel_size"] else "")))
    settings = ", ".join(f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}"
                         for key, value in plan["optimizer_hparams"].items()
                         if key not in ("weight_decay", "wd_ts"))
    clip = (f"gradient clip {config.optim.grad_clip:g}" if config.optim.grad_clip
            else "no gradient clip")
    rows.append(("optimizer", f"{plan['opt']}" + (f" ({settings})" if settings else "")
                 + f", {clip}"))
    source = ("given" if plan["lr_rule"] == "override" else f"the fitted law {plan['lr_rule']}")
    schedule = dict(planned["schedule"])
    name = schedule.pop("name")
    options = ", ".join(f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}"
                        for key, value in schedule.items())
    rows.append(("LR", f"peak {plan['lr']:.3g} ({source}); schedule {name}"
                       + (f" ({options})" if options else "")
                       + f", {plan['warmup_steps']:,} warm-up steps"))
    if config.optim.weight_decay is not None:
        decay = f"{plan['weight_decay']:.3g} (given)"
    elif plan["wd_ts"]:
        decay = (f"{plan['weight_decay']:.3g} (ω {plan['omega']:g} over wd_ts "
                 f"{plan['wd_ts']:,} steps)")
    elif plan["weight_decay"]:
        decay = f"{plan['weight_decay']:.3g} (ω {plan['omega']:g})"
    else:
        decay = "none"
    rows.append(("weight decay", decay))
    compute = planned["compute"]
    rows.append(("compute", f"{compute['flops']:.3g} FLOPs ({compute['flops_per_token']:.3g} per "
                            f"token: 6 per weight, plus attention)"))
    rows.append(("time", estimated_time(config, planned)))
    run_dir = Path(planned["run_dir"])
    rows.append(("run dir", f"{run_dir} ({run_dir_state(run_dir, config, plan['iterations'])})"))
    lines = ["plan (--dry_run --json prints all of it as JSON):"]
    lines += [f"  {label:<13}{text}" for label, text in rows]
    if planned.get("run_dir_note"):
        lines.append(f"  {'':<13}{planned['run_dir_note']}")
    warning = planned_warning(planned)
    if warning:
        lines.append(warning)
    return "\n".join(lines)


def run_dir_state(run_dir: Path, config: TrainConfig, iterations: int) -> str:
    """What a run started now would do in `run_dir`."""
    from danastar.train import identity

    if not identity.has_earlier_run(run_dir):
        return "new"
    if not config.checkpoint.auto_resume:
        return "holds a run, which --no_auto_resume moves aside to start afresh"
    step = identity.newest_step(run_dir)
    if step == 0:
        return "holds a run without a checkpoint, which is moved aside to start afresh"
    if step >= iterations:
        return f"complete at step {step:,}: nothing to train"
    return f"resumes from its checkpoint at step {step:,}"


def estimated_time(config: TrainConfig, planned: dict) -> str:
    """The training steps' time on this machine, from a forward/backward pass and an optimizer
    step of the planned model measured here (evaluations not counted); or why not."""
    measured = measure_step(config, planned)
    if isinstance(measured, str):
        return measured
    seconds, device, how = measured
    processes = planned["batch_layout"]["world_size"]
    on = (f"this {device}" if processes == 1
          else f"{processes} processes, each on a {device} like this one")
    return (f"about {duration(seconds * planned['plan']['iterations'])} on {on}, without "
            f"evaluations ({how})")


def measure_step(config: TrainConfig, planned: dict) -> tuple[float, str, str] | str:
    """(seconds per optimizer step of one process, the device, how it was measured), or why it
    was not. The forward/backward pass is timed on batches grown from one short sequence
    towards the run's micro-batch for a few seconds at most; the last two give its fixed cost
    and its FLOP rate (the model's FLOPs per token, as for the MFU), scaled to the run's batch.
    One optimizer step is timed as it is."""
    import math
    import time

    import torch

    from danastar.models import build_model
    from danastar.train.loop import autocast_context, make_optimizer
    from danastar.train.parallel import choose_device

    try:
        device = choose_device(config.train.device)
    except UserError as error:
        return f"not estimated: {str(error).rstrip('.')}"
    layout = planned["batch_layout"]
    plan = make_run_plan(config, planned["plan"]["vocab_size"], layout["data_parallel_size"])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    need = plan.exact_total_params * 4 * 4  # weights, gradients and two optimizer states (fp32)
    free = free_memory(device)
    if free is not None and need > free // 2:
        return (f"not estimated: the model with its gradients and optimizer state (about "
                f"{need / 2**30:.1f} GiB) would not fit in half of this {name}'s "
                f"{free / 2**30:.1f} GiB free")

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    torch.manual_seed(0)
    with torch.device(device):
        model = build_model(model_config(config, plan))
    model.train()
    autocast = autocast_context(config, device)

    def forward_backward(batch: int, length: int) -> float:
        tokens = torch.randint(plan.vocab_size, (batch, length), device=device)
        synchronize()
        started = time.perf_counter()
        with autocast:
            out = model(tokens, tokens)
        out.loss.backward()
        synchronize()
        return time.perf_counter() - started

    full_batch, full_length = layout["micro_batch_per_rank"], layout["sequence_length"]
    # From one sequence of 32 tokens, or of as many (32 · 4^k) as fit in about 2 GFLOPs (a
    # fraction of a second on a CPU: a small model's passes are then not all fixed costs).
    batch, length = 1, min(full_length, 32)
    while length * 4 <= full_length and model.flops_per_token(length * 4) * length * 4 <= 2e9:
        length *= 4
    def timed(batch: int, length: int) -> float:
        # after a first pass that tunes the new shape on a GPU, the faster of two passes when
        # they are short (and so easily delayed by whatever else the machine runs)
        if device.type == "cuda":
            forward_backward(batch, length)
        first = forward_backward(batch, length)
        return first if first > 0.5 else min(first, forward_backward(batch, length))

    forward_backward(batch, length)  # the first pass allocates
    shapes = [(batch, length)]
    times = [timed(batch, length)]
    passes = 3 if device.type == "cuda" else 2
    # Grow towards the run's micro-batch for a few seconds, while the next pass (up to four
    # times longer) stays short.
    while (batch, length) != (full_batch, full_length) and sum(times) * passes < 4 and \
            times[-1] * passes < 2:
        if length < full_length:
            length = min(full_length, length * 4)
        else:
            batch = min(full_batch, batch * 4)
        shapes.append((batch, length))
        times.append(timed(batch, length))
    # A pass costs a fixed time (one call per operation, whatever the batch) plus its FLOPs at
    # some rate: from the last two shapes, both; from one, the rate alone.
    flops = [model.flops_per_token(length) * batch * length for batch, length in shapes]
    rate = flops[-1] / times[-1]
    if len(times) > 1 and times[-1] > times[-2]:
        rate = (flops[-1] - flops[-2]) / (times[-1] - times[-2])
    fixed = max(0.0, times[-1] - flops[-1] / rate)
    optimizer, _ = make_optimizer(plan, config, model.param_groups(plan.weight_decay))
    optimizer.step()  # the first step creates the optimizer's state
    optimizer_seconds = math.inf
    for _ in range(2):  # the faster of two: a step is short, and easily delayed
        synchronize()
        started = time.perf_counter()
        optimizer.step()
        synchronize()
        optimizer_seconds = min(optimizer_seconds, time.perf_counter() - started)
    micro_step = fixed + model.flops_per_token(full_length) * full_batch * full_length / rate
    seconds = layout["acc_steps"] * micro_step + optimizer_seconds
    measured = " and ".join(f"{batch} × {length}" for batch, length in shapes[-2:])
    return seconds, name, (f"measured here: forward/backward passes of {measured} tokens, "
                           f"{rate:.3g} FLOP/s beyond a fixed {duration(fixed)} per pass, "
                           f"scaled to the batch; an optimizer step of "
                           f"{duration(optimizer_seconds)}")


def free_memory(device) -> int | None:
    """Bytes free on `device` (a CPU: the memory available to new processes), None if unknown."""
    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def duration(seconds: float) -> str:
    """A time as a person says it: 0.12 s, 45 s, 12 min, 2 h 10 min, 3.5 days."""
    if seconds < 1:
        return f"{seconds:.2g} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        hours, minutes = divmod(round(seconds / 60), 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days = seconds / 86400
    return f"{days:.1f} days" if days < 100 else f"{days:,.0f} days"
