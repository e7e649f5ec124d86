"""Planning a run without training it: the library that `danastar train`, `submit` and `sweep`
call. `planned_run` resolves the plan, the batch layout, the corpus epochs, the compute and the
run directory, refusing (one sentence, before any process starts or file is written) what
training would refuse (data it cannot open); `checked_start` adds what `danastar train` checks of
its run directory before it starts, with `--dry_run` or without: another process training
there (the lock, probed, not taken) and a resume it would refuse (`check_resume`);
`memory_problem` says when the model cannot fit in this machine's memory; `measure_step` times a
step of the planned model on this machine for the dry run's estimate."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import torch

from danastar.config import (
    TrainConfig,
    batch_layout,
    check_run_dir,
    make_run_plan,
    model_config,
    repetition_warning,
    schedule_options,
)
from danastar.data import prepare, sources
from danastar.data.prepared import META_FILE, RAW_META, prepared_format, repair_command
from danastar.errors import UserError
from danastar.hparams import short_run_warning
from danastar.machine import available_memory
from danastar.models import build_model
from danastar.models.config import ModelConfig
from danastar.rundir.lock import check_free
from danastar.scaling import Plan, meta_model
from danastar.train import identity
from danastar.train.data import SYNTHETIC_TRAIN_TOKENS, SYNTHETIC_VOCAB_SIZE, open_tokens
from danastar.train.identity import planned_run_dir
from danastar.train.optimizer import make_optimizer
from danastar.train.parallel import (
    SHARDED_BACKENDS,
    autocast_context,
    choose_device,
    resolve_backend,
)


def planned_run(config: TrainConfig, world_size: int | None = None, run_dir: Path | None = None,
                run_dir_note: str | None = None) -> tuple[Plan, dict]:
    """The run's plan, and with it the dry run's JSON-ready record (see `dry_run`)."""
    if world_size is None:  # `danastar submit` knows the world it asks SLURM for
        world_size = int(os.environ.get("WORLD_SIZE", config.parallel.nproc))
    layout = batch_layout(config, world_size)
    vocab_size, vocab_from = planned_vocab_size(config.data.dataset)
    plan = make_run_plan(config, vocab_size, layout.data_parallel_size)
    model = check_optimizer_settings(plan, config)
    check_dataset(config.data.dataset)
    if run_dir is None:
        run_dir, run_dir_note = planned_run_dir(config, world_size)
    check_run_dir(run_dir)
    corpus_tokens, corpus_from = planned_train_tokens(config.data.dataset)
    flops_per_token = model.flops_per_token(layout.sequence_length)
    return plan, {
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


def dry_run(config: TrainConfig, world_size: int | None = None, run_dir: Path | None = None,
            run_dir_note: str | None = None) -> dict:
    """The resolved plan, batch layout, corpus epochs, compute, run directory and config as
    JSON-ready data; needs no data on disk. `run_dir` (with its `planned_run_dir` note): where
    the caller will run it; None: where `danastar train` would."""
    return planned_run(config, world_size, run_dir, run_dir_note)[1]


# What `danastar train` changes when a run is too short for its log-time weight decay.
SHORT_RUN_FIX = "a longer --iterations, a smaller --omega, or --omega 0 (no decay) for a smoke test"


def decay_warning(weight_decay, wd_ts) -> str | None:
    """The optimizers' short-run weight-decay warning in the command's words, as a line (the
    dry run prints it, a run logs it at its start)."""
    decay = short_run_warning(weight_decay, wd_ts, SHORT_RUN_FIX)
    return f"warning: {decay}." if decay else None


def planned_warning(planned: dict) -> str | None:
    """The plan's warnings, a line each: when it reads its corpus too many times (see
    `repetition_warning`), and when the run is too short for its log-time weight decay
    (`decay_warning`)."""
    plan = planned["plan"]
    lines = [repetition_warning(plan["tokens"], plan["tokens_per_step"],
                                planned["corpus"]["train_tokens"], planned["dataset"]),
             decay_warning(plan["weight_decay"], plan["wd_ts"])]
    return "\n".join(line for line in lines if line) or None


def checked_start(config: TrainConfig, run_dir: Path, run_dir_note: str | None = None
                  ) -> tuple[Plan, dict]:
    """`planned_run`, with what `danastar train` checks of `run_dir` before it starts: one
    function for the dry run and the real start, so that a dry run passes only what training
    would. Refuses a directory another live process holds (its lock probed, not taken: training
    takes it when it starts) and a resume training would refuse; writes nothing."""
    check_free(run_dir, "use another --run_dir")  # said first, before any planning
    plan, planned = planned_run(config, run_dir=run_dir, run_dir_note=run_dir_note)
    check_resume(config, run_dir, planned["batch_layout"]["world_size"])
    return plan, planned


def check_dataset(dataset: str) -> None:
    """Refuse, with training's own sentence, data that training could neither open nor prepare:
    a folder that does not exist or holds no prepared data, under a name that is no source. A
    source named but not prepared yet is planned from its name (a plan needs no data; a run here
    does: `train.data.check_prepared_here` refuses a source training would not prepare)."""
    if dataset != "synthetic" and dataset not in sources.SOURCES:
        prepare.ensure_prepared(dataset)  # a name that is no source: opened as it is, or refused


def check_resume(config: TrainConfig, run_dir: Path, world_size: int) -> None:
    """Refuse, as training would when it resumes (the same sentence), to continue the run that
    `run_dir` holds with settings that change its trajectory. Reads the directory, writes nothing;
    data not prepared yet is compared by training once it is."""
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


def check_optimizer_settings(plan, config: TrainConfig):
    """Build the planned optimizer and schedule over the real model's parameter groups, with the
    model built on the meta device (no memory, no initialisation), so that a dry run rejects the
    settings training would reject; returns that model (for its FLOPs)."""
    model = meta_model(model_config(config, plan))  # the one the plan counted
    make_optimizer(plan, config, model.param_groups(plan.weight_decay))
    return model


def planned_vocab_size(dataset: str) -> tuple[int, str]:
    """(vocabulary size, where it comes from) of a dataset, prepared or not."""
    gpt2_vocab_size = RAW_META["vocab_size"]  # what raw token files hold (FineWeb's tokenizer too)
    path = Path(dataset).expanduser()
    for directory in (path, prepare.default_data_dir(dataset)):
        layout = prepared_format(directory) if directory.is_dir() else None
        if layout == "meta":
            meta = prepare.read_meta(directory)
            if meta is None or not isinstance(meta.get("vocab_size"), int):
                if dataset in prepare.AUTO_PREPARED and directory != path:
                    continue  # training prepares this default directory again before it starts
                raise UserError(f"{directory / META_FILE} is unreadable; repair the directory "
                                f"with {repair_command(directory, meta)}.")
            return int(meta["vocab_size"]), f"{directory / META_FILE}"
        if layout == "raw":
            return gpt2_vocab_size, "raw GPT-2 train.bin/val.bin"
    if dataset == "synthetic":
        return SYNTHETIC_VOCAB_SIZE, "the synthetic source"
    if dataset in sources.SOURCES and dataset != "fineweb":
        return sources.Corpus.default_vocab_size, f"the BPE {dataset} is prepared with on first use"
    return gpt2_vocab_size, "GPT-2 (fineweb's tokenizer; assumed for data not prepared yet)"


def planned_train_tokens(dataset: str) -> tuple[int | None, str]:
    """(training tokens, where the number comes from) of a dataset, prepared or not; None where
    it is not known before the data is prepared."""
    if dataset == "synthetic":
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
# The dry run's time estimate: a step of the planned model measured on this machine

def estimated_time(config: TrainConfig, planned: dict, plan: Plan | None = None) -> str:
    """The training steps' time on this machine, from a forward/backward pass and an optimizer
    step of the planned model measured here, saying what it assumes (the device and its
    threads, what it leaves out, how it was measured); or why there is none."""
    measured = measure_step(config, planned, plan)
    if isinstance(measured, str):
        return measured
    seconds, device, how = measured
    processes, steps = planned["batch_layout"]["world_size"], planned["plan"]["iterations"]
    count = torch.get_num_threads()  # what a CPU's passes ran on (a GPU's name says enough)
    threads = f" with {count} thread{'s' * (count > 1)}" if device == "CPU" else ""
    on = (f"this {device}{threads}" if processes == 1
          else f"{processes} processes, each on a {device} like this one{threads}")
    return (f"about {duration(seconds * steps)} for its {steps:,} steps on {on}, not counting "
            f"evaluations, start-up or compiling ({how})")


def measure_step(config: TrainConfig, planned: dict, plan: Plan | None = None
                 ) -> tuple[float, str, str] | str:
    """(seconds per optimizer step of one process, the device, how it was measured), or why it
    was not. The forward/backward pass is timed on batches grown from one short sequence
    towards the run's micro-batch for a few seconds at most; the last two give its fixed cost
    and its FLOP rate (the model's FLOPs per token, as for the MFU), scaled to the run's batch.
    One optimizer step is timed as it is. `plan`: the run's (None: planned again)."""
    try:
        device = choose_device(config.train.device)
    except UserError as error:
        return f"not estimated: {str(error).rstrip('.')}"
    layout = planned["batch_layout"]
    if plan is None:
        plan = make_run_plan(config, planned["plan"]["vocab_size"], layout["data_parallel_size"])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    too_large = memory_problem(config, plan, layout["world_size"], device)
    if too_large:
        return f"not estimated: {too_large}, so `danastar train` refuses it here"
    need = training_memory(config, plan, layout["world_size"], device)[0]
    free = free_memory(device)
    if free is not None and need > free // 2:
        return (f"not estimated: the model with its gradients and optimizer state (about "
                f"{need / 2**30:.1f} GiB) would not fit in half of this {name}'s "
                f"{free / 2**30:.1f} GiB free")
    timer = StepTimer(config, plan, device)
    full_batch, full_length = layout["micro_batch_per_rank"], layout["sequence_length"]
    shapes, times = timer.grown_passes(full_batch, full_length)
    # A pass costs a fixed time (one call per operation, whatever the batch) plus its FLOPs at
    # some rate: from the last two shapes, both; from one, the rate alone. The stand-in's fixed
    # time grows with the blocks, its optimizer step with the parameters.
    flops = [timer.model.flops_per_token(length) * batch * length for batch, length in shapes]
    rate = flops[-1] / times[-1]
    if len(times) > 1 and times[-1] > times[-2]:
        rate = (flops[-1] - flops[-2]) / (times[-1] - times[-2])
    blocks = timer.full.n_layer / timer.stand_in.n_layer
    fixed = max(0.0, times[-1] - flops[-1] / rate) * blocks
    optimizer_seconds = timer.optimizer_step() * (plan.exact_total_params
                                                   / timer.model.num_params())
    full_flops = planned["compute"]["flops_per_token"] * full_batch * full_length
    seconds = layout["acc_steps"] * (fixed + full_flops / rate) + optimizer_seconds
    return seconds, name, how_measured(timer, shapes, rate, fixed / blocks, optimizer_seconds)


def how_measured(timer: StepTimer, shapes: list[tuple[int, int]], rate: float, fixed: float,
                 optimizer_seconds: float) -> str:
    """What the estimate rests on, in words: what was timed (the model or its cut), where (and,
    on a CPU, how busy the machine was: other work slows training as it slowed this), at what
    speed (`fixed`: each timed pass's cost beyond its FLOPs), and how it was scaled."""
    cut = timer.full.n_layer != timer.stand_in.n_layer
    what = (f"the model cut to {timer.stand_in.n_layer} of its {timer.full.n_layer} blocks"
            if cut else "the model")
    busy = ""
    if timer.device.type == "cpu" and hasattr(os, "getloadavg"):
        busy = (f", with the machine's load average at {os.getloadavg()[0]:.1f} on its "
                f"{os.cpu_count()} cores")
    passes = " and ".join(f"{batch} × {length}" for batch, length in shapes[-2:])
    speed = f"{flop_rate(rate)}" + (f" plus {duration(fixed)} each" if fixed >= 0.005 else "")
    return (f"measured just now on {what}{busy}: forward/backward passes of {passes} tokens ran "
            f"at {speed} and an optimizer step took {duration(optimizer_seconds)}, scaled to "
            f"{'the whole model and ' if cut else ''}the batch")


def flop_rate(rate: float) -> str:
    """FLOP/s as a person reads them: 19.9 GFLOP/s, 312 TFLOP/s."""
    return f"{rate / 1e12:.3g} TFLOP/s" if rate >= 1e12 else f"{rate / 1e9:.3g} GFLOP/s"


def timing_stand_in(model: ModelConfig) -> ModelConfig:
    """The planned model cut to one block of each kind it has (one mixture-of-experts block,
    one dense block), for timing: its passes run the same matrix shapes as the whole model's, at
    a fraction of the time and memory (a 12-head MoE's forward/backward of 32 tokens takes tens
    of seconds and 7 GB on a CPU, too slow to grow the batch towards the run's). The model
    itself when it has no more blocks than that."""
    kinds = {model.is_moe_layer(layer) for layer in range(model.n_layer)}
    if len(kinds) >= model.n_layer:
        return model
    moe = model.moe
    if moe is not None:  # block 0 a mixture of experts, block 1 (where the model has one) dense
        moe = dataclasses.replace(moe, decoder_sparse_step=1,
                                  mlp_only_layers=(1,) if len(kinds) == 2 else ())
    return dataclasses.replace(model, n_layer=len(kinds), moe=moe)


class StepTimer:
    """The planned model's timing stand-in (see `timing_stand_in`) on `device`, its passes and
    its optimizer step timed."""

    def __init__(self, config: TrainConfig, plan: Plan, device) -> None:
        self.config, self.plan, self.device = config, plan, device
        self.full = model_config(config, plan)
        self.stand_in = timing_stand_in(self.full)
        torch.manual_seed(0)
        with torch.device(device):
            self.model = build_model(self.stand_in)
        self.model.train()
        self.autocast = autocast_context(config, device)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def forward_backward(self, batch: int, length: int) -> float:
        tokens = torch.randint(self.plan.vocab_size, (batch, length), device=self.device)
        self.synchronize()
        started = time.perf_counter()
        with self.autocast:
            out = self.model(tokens, tokens)
        out.loss.backward()
        self.synchronize()
        return time.perf_counter() - started

    def timed(self, batch: int, length: int) -> float:
        # after a first pass that tunes the new shape on a GPU, the faster of two passes when
        # they take up to 2 s (a pause of a second or so, from whatever else the machine runs,
        # would otherwise stop the batch from growing and be scaled up to the whole run)
        if self.device.type == "cuda":
            self.forward_backward(batch, length)
        first = self.forward_backward(batch, length)
        return first if first > 2 else min(first, self.forward_backward(batch, length))

    def grown_passes(self, full_batch: int, full_length: int
                     ) -> tuple[list[tuple[int, int]], list[float]]:
        """The shapes timed and their times: from one sequence of 32 tokens, or of as many
        (32 · 4^k) as fit in about 2 GFLOPs (a fraction of a second on a CPU: a small model's
        passes are then not all fixed costs), grown towards the run's micro-batch for a few
        seconds, while the next pass (up to four times longer) stays short."""
        batch, length = 1, min(full_length, 32)
        while length * 4 <= full_length and \
                self.model.flops_per_token(length * 4) * length * 4 <= 2e9:
            length *= 4
        self.forward_backward(batch, length)  # the first pass allocates
        shapes = [(batch, length)]
        times = [self.timed(batch, length)]
        passes = 3 if self.device.type == "cuda" else 2
        while (batch, length) != (full_batch, full_length) and sum(times) * passes < 4 and \
                times[-1] * passes < 2:
            if length < full_length:
                length = min(full_length, length * 4)
            else:
                batch = min(full_batch, batch * 4)
            shapes.append((batch, length))
            times.append(self.timed(batch, length))
        return shapes, times

    def optimizer_step(self) -> float:
        """Seconds of one optimizer step, after a first that creates the optimizer's state: the
        faster of two when they are short (and so easily delayed), else the one (a large model's
        step on a CPU takes seconds, which a second would only double)."""
        optimizer, _ = make_optimizer(self.plan, self.config,
                                      self.model.param_groups(self.plan.weight_decay))
        optimizer.step()

        def one_step() -> float:
            self.synchronize()
            started = time.perf_counter()
            optimizer.step()
            self.synchronize()
            return time.perf_counter() - started

        first = one_step()
        return first if first > 0.5 else min(first, one_step())


def training_memory(config: TrainConfig, plan: Plan, world_size: int, device
                    ) -> tuple[int, int]:
    """(bytes, processes) that training needs at least on this machine's memory for `device`:
    each process builds the whole model in float32 before it shards it, and holds its share of
    the gradients and two optimizer states (each in `--state_dtype`); activations come on top.
    On a CPU the `--nproc` processes share the memory, on GPUs each has its own."""
    backend = resolve_backend(config.parallel.backend, world_size)
    shards = world_size if backend in SHARDED_BACKENDS or config.parallel.tp_size > 1 else 1
    state_bytes = 2 if config.optim.state_dtype == "bfloat16" else 4
    per_process = plan.exact_total_params * (4 + (4 + 2 * state_bytes) / shards)
    processes = 1 if device.type == "cuda" else world_size
    return int(per_process * processes), processes


def memory_problem(config: TrainConfig, plan: Plan, world_size: int, device) -> str | None:
    """Why the planned model cannot fit in the memory `device` has free on this machine (the
    memory available to new processes for a CPU), or None (it may fit, or the system does not
    say)."""
    need, processes = training_memory(config, plan, world_size, device)
    free = free_memory(device)
    if free is None or need <= free:
        return None
    where = (f"GPU {torch.cuda.get_device_name(device)} has {free / 2**30:.1f} GiB free"
             if device.type == "cuda" else f"machine has {free / 2**30:.1f} GiB available")
    each = f" in {processes} processes" if processes > 1 else ""
    return (f"the model's {plan.exact_total_params:,} parameters need at least "
            f"{need / 2**30:.1f} GiB{each} for their weights, gradients and optimizer state, "
            f"and this {where}")


def free_memory(device) -> int | None:
    """Bytes free on `device` (a CPU: the memory available to new processes), None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return available_memory()


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
