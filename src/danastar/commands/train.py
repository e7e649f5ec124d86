"""`danastar train`: parse the configuration, then plan (`--dry_run`), launch (`--nproc N`) or
train.

    danastar train                                   # the CPU preset on Shakespeare
    danastar train --arch enoki --opt adana --heads 3 --dataset fineweb --dry_run
    danastar train --heads 6 --dry_run --json         # the whole resolved plan, for tools
    danastar train --heads 2 --nproc 2 --distributed_backend fsdp
    danastar train --arch llama --heads 2 --init_from hf/llama-h2   # from an export's weights
    torchrun --nproc_per_node 8 -m danastar train --heads 12 --distributed_backend fsdp

Every flag and key is documented in docs/training.md (`danastar train --help` lists the flags).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import NoReturn

from danastar.config import TrainConfig, epochs_text, load_config
from danastar.errors import UserError, report
from danastar.progress import Stages
from danastar.scaling import DEFAULT_OMEGA, Plan
from danastar.train.data import check_prepared_here
from danastar.train.decision import (
    START_FILE_VARIABLE,
    StartDecision,
    after_preparing,
    decide,
    read_for_worker,
    undecided,
    write_for_workers,
)
from danastar.train.estimate import estimated_time
from danastar.train.memory import memory_problem
from danastar.train.optimizer import extended_run_schedule
from danastar.train.plan import planned_warning
from danastar.train.start import extension_line


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

    worker = under_torchrun()  # one of N processes: its launcher (or rank 0) decides the start
    world_size = int(os.environ.get("WORLD_SIZE", config.parallel.nproc))
    if planning and not getattr(args, "json", False):  # a person waits: seconds on a busy CPU
        Stages("danastar train").start("planning the run: the model built on the meta device, "
                                       "the data and the run directory checked",
                                       only_on_terminal=True)
    # What training would refuse is refused here, the dry run's checks and the real start's
    # alike (`decide`: the data, the run directory's lock, probed, and its resume): once (not
    # by each of N workers), before data is prepared, a process is started or a file is written.
    decision = decide(config, world_size) if not worker else \
        read_for_worker(config, world_size) or undecided(config)
    run_dir = None if worker else decision.run_dir.path
    # this model, finite weights; none where the export is gone and the run resumes
    source = init_from(config, decision.plan, run_dir, check_values=not worker)
    if planning:
        planned = decision.planned
        if config.train.init_from:
            planned["init_from"] = export_record(config, source)
        show_plan(config, planned, decision.plan, source, as_json=getattr(args, "json", False))
    # Data this machine lacks and training would not prepare is refused after the plan (which
    # needs none): a dry run shows the plan, then refuses as the run would.
    check_prepared_here(config.data.dataset)
    if planning:
        return 0
    if not worker:
        # Facts of this machine, which a dry run (planning for any machine) does not check: here
        # they are refused once rather than by each worker, and before data is prepared.
        check_this_machine(config, decision.plan,
                           decision.planned["batch_layout"]["world_size"])
    if config.parallel.nproc > 1 and not worker:
        return launch_workers(config, decision, argv, world_size, launch)
    return run_training(config, decision, initial_weights(source, config))


def launch_workers(config: TrainConfig, decision: StartDecision, argv: list[str],
                   world_size: int, launch) -> int:
    """Prepare the data once, then start the workers with the start decided here, written into
    the run directory (whose stop file the launcher also writes on a stop signal)."""
    if config.data.dataset != "synthetic":
        from danastar.data.prepare import ensure_prepared

        ensure_prepared(config.data.dataset)  # missing data is one message; prepared once
    decision = after_preparing(decision, config, world_size)
    start_file = write_for_workers(decision, config)
    os.environ[START_FILE_VARIABLE] = str(start_file)
    try:
        return launch(config.parallel.nproc, argv, decision.run_dir.path)
    finally:
        os.environ.pop(START_FILE_VARIABLE, None)
        start_file.unlink(missing_ok=True)


def show_plan(config: TrainConfig, planned: dict, plan: Plan, source, as_json: bool) -> None:
    """The dry run's output: the summary a person reads, or the whole plan as JSON (its warnings
    on stderr)."""
    if not as_json:
        # the estimate times the model here: seconds, more where the optimizer's step compiles
        Stages("danastar train").start(
            "timing forward/backward passes and an optimizer step of the model here for the time "
            "estimate (the optimizer's step is compiled first where training compiles it)")
        print(summary(config, planned, run_plan=plan, export=source))
        return
    print(json.dumps(planned, indent=2))
    warning = planned_warning(planned)
    if warning:
        print(warning, file=sys.stderr)


def init_from(config: TrainConfig, plan: Plan, run_dir: Path | None,
              check_values: bool = True):
    """The export `--init_from` names, checked against the planned model (its class, shape and
    every tensor's name and shape, from the files' headers) and, with `check_values`, every
    value finite (each tensor read in turn); None without the flag, and where the export is
    not there now but the run resumes in `run_dir` from a checkpoint, which holds its weights
    (only a fresh start needs the export). `run_dir` None: a worker, whose rank 0 decided."""
    if not config.train.init_from:
        return None
    path = Path(config.train.init_from)
    if not path.expanduser().exists():
        if run_dir is None or resumes(config, run_dir):
            return None
        raise UserError(export_needed(path, fresh_start_reason(config, run_dir)))
    from danastar.config import model_config
    from danastar.export.init_from import check_finite, inspect

    source = inspect(path, model_config(config, plan))
    if check_values:
        check_finite(source)
    return source


def resumes(config: TrainConfig, run_dir: Path) -> bool:
    """Whether `train` will resume in `run_dir` from a checkpoint (its newest, by name)."""
    from danastar.train.identity import newest_step

    return config.checkpoint.auto_resume and newest_step(run_dir) > 0


def fresh_start_reason(config: TrainConfig, run_dir: Path) -> str:
    if not config.checkpoint.auto_resume:
        return "--no_auto_resume starts the run afresh"
    return f"{run_dir} has no checkpoint to resume from"


def export_needed(path: Path, why: str) -> str:
    """The refusal of a fresh start whose export is not there (`why`: why it starts afresh)."""
    return (f"--init_from {path} does not exist, and a fresh start takes its weights from it "
            f"({why}); pass the directory that `danastar export` wrote, where it is now (once a "
            f"run has a checkpoint, its resume needs no export).")


def export_record(config: TrainConfig, source) -> dict:
    """The dry run's `init_from`: the export checked, or its path where it is not there now."""
    if source is None:
        return {"path": config.train.init_from, "present": False}
    return {"path": str(source.path), "present": True, "architecture": source.architecture,
            "step": source.step, "model": source.description}


def initial_weights(source, config: TrainConfig):
    """What `train` calls for a fresh start's weights (never on a resume): the export read whole
    in each process, which loads it before the model is sharded; where the export is not there
    (the run was to resume), a refusal."""
    if source is not None:
        from danastar.export.init_from import read

        return lambda: read(source)
    if not config.train.init_from:
        return None

    def refuse():
        raise UserError(export_needed(Path(config.train.init_from),
                                      "this run has no checkpoint to resume from"))

    return refuse


def run_training(config: TrainConfig, decision: StartDecision | None = None,
                 weights=None) -> int:
    """Train in this process (`weights`: see `initial_weights`). A user error that every rank
    raises is printed by rank 0 alone; Ctrl-C pressed twice (or before training starts) stops at
    once with exit 130, no traceback."""
    from danastar.launch.local import under_torchrun

    if not (under_torchrun() and int(os.environ["WORLD_SIZE"]) > 1):
        return train_here(config, decision, weights)
    try:
        code = train_here(config, decision, weights)
    except UserError as error:  # said here, so that rank 0 too leaves through leave_worker
        code = report(error, "train")
    leave_worker(code)  # after a complete run, a stop, a refusal or Ctrl-C alike


def train_here(config: TrainConfig, decision: StartDecision | None = None, weights=None) -> int:
    from danastar.launch.local import is_main_process
    from danastar.train.signals import INTERRUPTED_EXIT_CODE

    try:
        from danastar.train.loop import train

        # the start decided above: one process plans once
        return train(config, decision, initial_weights=weights)
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


def check_this_machine(config: TrainConfig, plan: Plan, world_size: int) -> None:
    """This machine has the devices the processes will ask for, the trackers asked for, and
    the memory the model needs at least (said before anything is allocated)."""
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
    too_large = memory_problem(config, plan, world_size, device)
    if too_large:
        fewer = " or fewer --nproc" if device.type == "cpu" and world_size > 1 else ""
        raise UserError(f"{too_large}; use fewer --heads (a smaller model){fewer}, or a "
                        f"machine with more memory (--dry_run shows the plan).")


# ----------------------------------------------------------------------------------------------
# The dry run as a person reads it

def weight_decay_row(config, plan: dict, extensions: list[dict] | None) -> str:
    """The plan's weight decay; for an extended run also the decay the run holds from the
    join on (what its extension recorded)."""
    if config.optim.weight_decay is not None:
        decay = f"{plan['weight_decay']:.3g} (given)"
    elif plan["wd_ts"]:
        decay = (f"{plan['weight_decay']:.3g} (ω {plan['omega']:g} over wd_ts "
                 f"{plan['wd_ts']:,} steps)")
    elif plan["weight_decay"]:
        decay = f"{plan['weight_decay']:.3g} (ω {plan['omega']:g})"
    else:
        decay = "none"
    if extensions and decay != "none":
        last = extensions[-1]
        held = ""
        if "weight_decay" in last:  # (an extension recorded before it was kept: not known)
            held = f" at {last['weight_decay']:.3g}" + (f" over wd_ts {last['wd_ts']:,} steps"
                                                        if last.get("wd_ts") else "")
        decay += (f" for a run planned this long; the run's own goes on{held} by "
                  f"--extend_decay {last['decay_rule']}")
    return decay


def summary(config: TrainConfig, planned: dict, run_plan: Plan | None = None,
            export=None) -> str:
    """The dry run in about twenty lines: model and parameters, tokens and epochs, batch, LR and
    schedule, weight decay, compute, an estimated time on this machine, the run directory, and
    the export a fresh start takes its weights from (`export`, see `init_from`)."""
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
    extensions = planned.get("extensions")
    warmup = extensions[0]["warmup_steps"] if extensions else plan["warmup_steps"]  # W1 kept
    rows.append(("LR", f"peak {plan['lr']:.3g} ({source}); schedule {name}"
                       + (f" ({options})" if options else "")
                       + f", {warmup:,} warm-up steps"
                       + (" (the run's, extended below)" if extensions else "")))
    rows.append(("weight decay", weight_decay_row(config, plan, extensions)))
    compute = planned["compute"]
    rows.append(("compute", f"{compute['flops']:.3g} FLOPs ({compute['flops_per_token']:.3g} per "
                            f"token: 6 per weight, plus attention)"))
    rows.append(("time", estimated_time(config, planned, run_plan)))
    if export is not None:
        rows.append(("init from", f"{export.summary()}; a fresh start takes these weights, a "
                                  "resume its checkpoint's"))
        rows.append(("", continuing_advice(config, plan, export.step)))
    elif config.train.init_from:
        rows.append(("init from", f"{config.train.init_from} is not there now; the run resumes "
                                  "from its checkpoint, whose weights need no export"))
    if extensions:
        rows.append(("extension", extension_line(extensions)))
        rows.append(("", extended_lr_line(config, extensions)))
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


def extended_lr_line(config: TrainConfig, extensions: list[dict]) -> str:
    """Where the extended LR schedule goes from the join, as factors of the peak at its turning
    steps (step k trains with the schedule's value at k − 1, as `metrics.jsonl` logs it)."""
    extension = extensions[-1]
    schedule = extended_run_schedule(config, extensions)
    join, end = extension["from_step"], extension["iterations"]
    steps = [join, join + 1]
    if extension.get("rewarm_steps"):
        steps.append(join + 1 + extension["rewarm_steps"])
    steps = [step for step in dict.fromkeys([*steps, end]) if 1 <= step <= end]
    points = ", ".join(f"{schedule(step - 1):.3g} at step {step:,}" for step in steps)
    return f"the LR's factor of the peak: {points}"


def continuing_advice(config: TrainConfig, plan: dict, exported_step: int | None) -> str:
    """What a fresh start from an export restarts, and the settings that continue a trained
    model instead (those not given). Measured on Shakespeare (docs/export.md, "Continuing a
    trained model"): the plan's own peak LR, warm-up and weight decay raised the validation
    loss from 5.12 to 5.75 in 20 steps, these kept it at 5.15."""
    decay = bool(plan["wd_ts"] and plan["weight_decay"])  # the log-time decay: its clock restarts
    restart = (f"peak LR {plan['lr']:.3g} after {plan['warmup_steps']:,} warm-up steps"
               + (f", weight decay ω {plan['omega']:g} over wd_ts {plan['wd_ts']:,} from its "
                  "first, strongest step" if decay else ""))
    advice = []
    if decay and config.optim.weight_decay is None and config.optim.omega == DEFAULT_OMEGA:
        if exported_step:
            # this run's first decay ω/wd_ts made the decay ω/(wd_ts + k) at the export's step
            omega = plan["omega"] * plan["wd_ts"] / (plan["wd_ts"] + exported_step)
            advice.append(f"--omega {omega:.2g} (the decay where the exported run left it)")
        else:
            advice.append("a smaller --omega (the decay where the exported run left it)")
    warmup = plan["iterations"] // 10
    if config.optim.warmup_steps is None and warmup > plan["warmup_steps"]:
        advice.append(f"--warmup_steps {warmup} (a tenth of the steps)")
    if config.optim.lr is None:
        advice.append(f"--lr {plan['lr'] / 4:.3g} (a quarter of the peak)")
    text = (f"only the weights: the optimizer's state and schedule start afresh ({restart}), "
            "which raises a trained model's loss at first (docs/export.md)")
    if advice:
        text += f"; to continue one: {', '.join(advice)}"
    return text


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


