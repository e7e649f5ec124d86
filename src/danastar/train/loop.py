"""The training loop, top to bottom: build, evaluate, step, log, checkpoint, evaluate, sample.

`train(config)` is what `danastar train` runs in every process. It reads like nanoGPT's
train.py: set up the processes and the data, build the model, wrap it for distribution, build
the optimizer from the scaling plan, resume if a checkpoint exists, then loop over optimizer
steps. Each step accumulates gradients over `acc_steps` micro-batches (syncing gradients only on
the last), clips the global gradient norm, applies the LR schedule, and steps. Batches are a pure
function of the step, so resuming from a checkpoint reproduces the uninterrupted run exactly.

Exit codes: 0 done (or `--iterations_to_run` reached, checkpoint saved), 2 a user error (such
as a diverged run), `PREEMPTED_EXIT_CODE` (75) after SIGTERM/SIGUSR1 and a saved checkpoint.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import torch

from danastar.config import (
    TrainConfig,
    batch_layout,
    default_run_dir,
    make_run_plan,
    model_config,
    save_yaml,
)
from danastar.errors import UserError
from danastar.models import build_model
from danastar.optim import apply_schedule, build_optimizer, get_schedule
from danastar.train import parallel
from danastar.train.checkpoint import Checkpointer, gather_rng_states, set_rng_state
from danastar.train.data import TrainingData
from danastar.train.logging import RunLogger, environment, peak_flops
from danastar.train.signals import PREEMPTED_EXIT_CODE, PreemptionFlag


def train(config: TrainConfig) -> int:
    """Run (or resume) the configured training in this process; returns the exit code."""
    env = parallel.setup_distributed(config)
    with contextlib.ExitStack() as cleanup:  # closes what `run` opens, also when it raises
        cleanup.callback(parallel.teardown)
        return run(config, env, cleanup)


def run(config: TrainConfig, env: parallel.Distributed, cleanup: contextlib.ExitStack) -> int:
    # -- data and plan -------------------------------------------------------------------------
    layout = batch_layout(config, env.world_size)
    data = TrainingData.open(config, env, layout)
    cleanup.callback(data.close)
    plan = make_run_plan(config, data.vocab_size, layout.data_parallel_size)
    iterations, seq_len, acc_steps = plan.iterations, layout.sequence_length, layout.acc_steps
    run_dir = Path(config.logging.run_dir) if config.logging.run_dir else default_run_dir(config)
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    parallel.barrier()

    # -- model, distribution, optimizer --------------------------------------------------------
    torch.manual_seed(config.train.seed)  # the same initial weights on every rank
    with torch.device(env.device):
        model = build_model(model_config(config, plan))
    flops_per_token = model.flops_per_token(seq_len)
    model = parallel.parallelize(model, config, env)
    core = parallel.unwrap(model)  # the model itself, for parameter groups, sampling and checkpoints
    optimizer, schedule = make_optimizer(plan, config, core.param_groups(plan.weight_decay))

    # -- resume --------------------------------------------------------------------------------
    checkpointer = Checkpointer(run_dir / "checkpoints", sharded=env.sharded,
                                keep_latest=config.checkpoint.keep_latest)
    step, skipped_total = 0, 0
    found = checkpointer.find_latest() if config.checkpoint.auto_resume else None
    if found is not None:
        run_state = checkpointer.load(found, core, optimizer)
        step, skipped_total = run_state["step"], run_state["skipped_steps"]
        data.loader.load_state_dict(run_state["data_position"])  # batches are a function of the step
        same_topology = len(run_state["rng"]) == env.world_size  # else the RNG streams cannot be matched
        if same_topology:
            set_rng_state(run_state["rng"][env.rank])
    log = RunLogger(run_dir, config, rank=env.rank, total_steps=iterations, start_step=step,
                    resumed=found is not None)
    cleanup.callback(log.close)
    if env.is_main:
        save_yaml(config, run_dir / "config.yaml")
        (run_dir / "environment.json").write_text(json_text(environment(env.world_size)))
        (run_dir / "plan.json").write_text(json_text({"plan": plan.to_dict(), "batch_layout": layout.to_dict()}))
    log.info(f"run directory {run_dir}; {plan.arch} with {plan.exact_total_params / 1e6:.2f}M parameters, "
             f"{plan.opt} at peak LR {plan.lr:.3g}, {iterations} steps of {layout.tokens_per_step} tokens, "
             f"{env.world_size} process(es), backend {env.backend}, device {env.device}")
    if found is not None:
        log.info(f"resumed from {found.path} at step {step}" + ("" if same_topology else
                 f" (saved by {len(run_state['rng'])} processes: RNG states not restored, losses will differ slightly)"))
    if step >= iterations:
        log.info(f"this run already finished at step {step}; pass --no_auto_resume or another --run_dir to train again.")
        return 0

    autocast = autocast_context(config, env.device)
    peak = peak_flops(env.device, config.train.peak_flops)
    preemption = PreemptionFlag().install()
    cleanup.callback(preemption.uninstall)
    cleanup.callback(checkpointer.wait)  # a checkpoint still being copied from $SLURM_TMPDIR

    def save(kind: str = "latest") -> None:
        checkpointer.save(step, core, optimizer, {"step": step, "skipped_steps": skipped_total,
                                                  "data_position": data.loader.state_dict(), "rng": gather_rng_states(),
                                                  "plan": plan.to_dict()}, kind)

    def evaluate_and_log(final: bool = False) -> float:
        batches = config.train.final_eval_batches if final else config.train.eval_batches
        val_loss = evaluate(model, data.validation_batches(batches), autocast)
        metrics = {"step": step, "val_loss": val_loss, "val_perplexity": math.exp(min(val_loss, 50.0)),
                   "tokens": step * layout.tokens_per_step}
        if step == 0:
            metrics["loss/init"] = val_loss
        if final:
            metrics["final"] = True
        log.log(metrics)
        log.info(f"step {step}: {'final ' if final else ''}validation loss {val_loss:.4f}")
        return val_loss

    # -- the loop ------------------------------------------------------------------------------
    if step == 0:
        evaluate_and_log()
    start_step, consecutive_skips, exit_code = step, 0, 0
    model.train()
    while step < iterations:
        started = time.perf_counter()
        lr_factor = schedule(step)
        apply_schedule(optimizer, lr_factor)

        loss_sum = torch.zeros((), device=env.device)
        ce_sum = torch.zeros((), device=env.device)
        for micro_step in range(acc_steps):
            inputs, targets = data.train_batch(step, micro_step)
            with parallel.gradient_sync(model, sync=micro_step == acc_steps - 1):
                with autocast:
                    loss, cross_entropy, _ = model(inputs, targets)
                (loss / acc_steps).backward()
            loss_sum += loss.detach()
            ce_sum += cross_entropy.detach()

        grad_norm = clip_grad_norm(model, config.optim.grad_clip)
        # One all-reduce carries the losses and whether any rank was asked to stop.
        stats = torch.stack([loss_sum / acc_steps, ce_sum / acc_steps,
                             torch.tensor(float(preemption.is_set), device=env.device)]).float()
        parallel.all_reduce_sum(stats)
        train_loss, train_ce, stop_requested = (stats[:2] / env.world_size).tolist() + [stats[2].item() > 0]
        if math.isfinite(train_loss) and math.isfinite(grad_norm):
            optimizer.step()
            consecutive_skips = 0
        else:
            skipped_total += 1
            consecutive_skips += 1
            log.info(f"step {step}: non-finite loss {train_loss} or gradient norm {grad_norm}; step skipped "
                     f"({consecutive_skips} in a row)")
            if consecutive_skips >= config.train.max_nonfinite_steps:
                raise UserError(f"training diverged: {consecutive_skips} non-finite steps in a row at step "
                                f"{step + 1}; lower the learning rate (--lr) or clip harder (a smaller --grad_clip).")
        optimizer.zero_grad(set_to_none=True)
        step += 1
        step_time = time.perf_counter() - started

        if step % config.train.log_interval == 0 or step == iterations:
            tokens_per_s = layout.tokens_per_step / step_time
            metrics = {"step": step, "train_loss": train_ce, "loss": train_loss, "lr": optimizer.param_groups[0]["lr"],
                       "lr_factor": lr_factor, "grad_norm": grad_norm, "tokens": step * layout.tokens_per_step,
                       "tokens_per_s": tokens_per_s, "step_time": step_time,
                       "mfu": flops_per_token * tokens_per_s / (peak * env.world_size) if peak else None,
                       "skipped_steps": skipped_total}
            if hasattr(optimizer, "diagnostics"):
                metrics.update({f"optim/{k}": v for k, v in optimizer.diagnostics().items()})
            log.log(metrics)
            log.progress(step, metrics)
        if step == iterations:
            evaluate_and_log(final=True)
        elif step % config.train.eval_interval == 0:
            evaluate_and_log()

        to_run = config.train.iterations_to_run
        stop_for_chain = bool(to_run) and step - start_step >= to_run and step < iterations
        every, permanent = config.checkpoint.latest_every, config.checkpoint.permanent_every
        if permanent > 0 and step % permanent == 0:
            save("permanent")
        elif step == iterations or (every > 0 and step % every == 0) or stop_requested or stop_for_chain:
            save()
        if stop_requested:
            signal_name = preemption.received.name if preemption.received else "a stop signal on another rank"
            log.info(f"{signal_name}: checkpoint saved at step {step}; exiting with code {PREEMPTED_EXIT_CODE} "
                     f"so that the job can be requeued and resumed.")
            exit_code = PREEMPTED_EXIT_CODE
            break
        if stop_for_chain:
            log.info(f"stopping after {to_run} steps (--iterations_to_run); the next run resumes at step {step}.")
            break

    if step == iterations and config.train.sample_tokens > 0:
        log.end_progress()
        log.info("sample:\n" + generate_sample(model, core, data, config, autocast))
    return exit_code


# ----------------------------------------------------------------------------------------------

def make_optimizer(plan, config: TrainConfig, param_groups: list[dict]):
    """The planned optimizer over `param_groups` and its LR schedule.

    Both check their hyperparameters (ValueError); a bad value is the user's to fix.
    """
    try:
        optimizer = build_optimizer(plan.opt, param_groups, lr=plan.lr, **plan.optimizer_hparams)
        schedule = get_schedule(config.optim.scheduler, plan.warmup_steps, plan.iterations)
    except ValueError as error:
        raise UserError(f"{plan.opt} with schedule {config.optim.scheduler} cannot run this plan "
                        f"({str(error).rstrip('.')}); change the optimizer settings or --iterations.") from None
    return optimizer, schedule


def autocast_context(config: TrainConfig, device: torch.device):
    """bf16 autocast on CUDA by default; off on CPU unless asked for (it is slow there)."""
    wanted = config.train.autocast
    if wanted == "bf16" or (wanted == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Clip the global L2 norm of all gradients; returns the norm before clipping.

    DTensor-safe: under TP + FSDP2 the gradients live on two meshes (the 2-D one of the sharded
    projections, the 1-D data-parallel one of the rest), which one `torch.stack` cannot mix, so the
    norm is taken per mesh and the per-mesh norms are combined.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    by_mesh: dict = {}
    for grad in grads:
        by_mesh.setdefault(getattr(grad, "device_mesh", None), []).append(grad)
    norms = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(group, norm_type=2.0)
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    total = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
    if max_norm > 0:
        # As torch.nn.utils.clip_grad_norm_: scale by min(1, max_norm / (norm + 1e-6)), in fp32.
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0).item()
        for grad in grads:
            grad.mul_(scale)
    return total.item()


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches, autocast) -> float:
    """Mean validation cross-entropy. Every rank runs the same number of forwards (FSDP needs all
    ranks in each one) on its rows of each fixed batch; the sums are all-reduced."""
    model.eval()
    totals = None
    for inputs, targets in batches:
        with autocast:
            _, cross_entropy, _ = model(inputs, targets)
        batch_total = torch.stack([cross_entropy.float() * inputs.shape[0],
                                   torch.tensor(float(inputs.shape[0]), device=inputs.device)])
        totals = batch_total if totals is None else totals + batch_total
    parallel.all_reduce_sum(totals)
    model.train()
    return (totals[0] / totals[1]).item()


@torch.no_grad()
def generate_sample(model, core, data: TrainingData, config: TrainConfig, autocast) -> str:
    """A short continuation of the prompt (every rank samples the same; sharded models need all)."""
    prompt = data.encode(config.train.sample_prompt) or [data.eot_id]
    new_tokens = min(config.train.sample_tokens, core.config.max_seq_len - len(prompt))
    idx = torch.tensor([prompt], dtype=torch.long, device=data.device)
    model.eval()
    with torch.random.fork_rng(devices=[data.device] if data.device.type == "cuda" else []):
        torch.manual_seed(config.train.seed)
        with autocast:
            out = core.generate(idx, new_tokens, temperature=0.8, top_k=50)
    return data.decode(out[0].tolist())


def json_text(value) -> str:
    import json

    return json.dumps(value, indent=1, default=str)
