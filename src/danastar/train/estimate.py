"""The dry run's time estimate: a step of the planned model measured on this machine (`StepTimer`
times a stand-in of it, cut to one block of each kind), scaled to the run's batch and steps."""

from __future__ import annotations

import dataclasses
import os
import time

import torch

from danastar.config import TrainConfig, make_run_plan, model_config
from danastar.errors import UserError
from danastar.models import build_model
from danastar.models.config import ModelConfig
from danastar.scaling import Plan
from danastar.train.memory import free_memory, memory_problem, training_memory
from danastar.train.optimizer import make_optimizer
from danastar.train.parallel import autocast_context, choose_device


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
    optimizer_seconds = timer.optimizer_step() * (plan.params.exact_total_params
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
        tokens = torch.randint(self.plan.model.vocab_size, (batch, length), device=self.device)
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
