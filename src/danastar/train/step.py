"""One optimizer step: gradients accumulated over `acc_steps` micro-batches (synced only on the
last), the global gradient norm clipped, and the optimizer stepped unless the loss or the norm is
not finite; one all-reduce brings the step's losses, routing statistics and stop requests to
every rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from danastar.optim.dtensors import local
from danastar.train import parallel
from danastar.train.data import TrainingData
from danastar.train.routing import RoutingSums
from danastar.train.wrap import gradient_sync


@dataclass(frozen=True)
class StepResult:
    """One optimizer step, averaged over its micro-batches and over the ranks."""

    objective: float  # cross-entropy + z-loss (+ weighted router losses): what the gradient
    # descends (logged as `loss`)
    cross_entropy: float  # the cross-entropy alone (logged as `train_loss`, like `val_loss`)
    grad_norm: float  # the global gradient norm before clipping
    stop_requested: bool  # some rank received SIGTERM/SIGUSR1
    moe: dict = field(default_factory=dict)  # a mixture of experts' routing (`RoutingSums`)

    @property
    def finite(self) -> bool:
        return math.isfinite(self.objective) and math.isfinite(self.grad_norm)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: TrainingData,
               step: int, *, acc_steps: int, grad_clip: float, autocast,
               env: parallel.Distributed,
               stop_requested_here: bool | Callable[[], bool] = False) -> StepResult:
    """Accumulate gradients over `acc_steps` micro-batches (syncing them only on the last), clip
    the global norm, and step the optimizer unless the loss or the norm is not finite."""
    objective_sum = torch.zeros((), device=env.device)
    cross_entropy_sum = torch.zeros((), device=env.device)
    routing = RoutingSums(env.device)
    for micro_step in range(acc_steps):
        inputs, targets = data.train_batch(step, micro_step)
        with gradient_sync(model, sync=micro_step == acc_steps - 1):
            with autocast:
                out = model(inputs, targets)
            (out.loss / acc_steps).backward()
        objective_sum += out.loss.detach()
        cross_entropy_sum += out.ce.detach()
        routing.add(out)

    grad_norm = clip_grad_norm(model, grad_clip)
    # One all-reduce carries the losses, a mixture of experts' routing statistics and whether any
    # rank was asked to stop, and one copy to the host (the step's only wait for the device)
    # brings them with the gradient norm.
    stats = torch.cat([torch.stack([objective_sum / acc_steps, cross_entropy_sum / acc_steps,
                                    torch.full((), float(stop_requested(stop_requested_here)),
                                               device=env.device)]).float(),
                       routing.flat() / acc_steps])
    parallel.all_reduce_sum(stats)
    norm = grad_norm.float().reshape(1)
    values = torch.cat([stats[:2] / env.world_size, stats[2:3], norm,
                        stats[3:] / env.world_size]).tolist()
    objective_mean, cross_entropy_mean, stop_flag, grad_norm = values[:4]
    result = StepResult(objective_mean, cross_entropy_mean, grad_norm, stop_flag > 0,
                        routing.metrics(values[4:]))
    if result.finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return result


def stop_requested(flag: bool | Callable[[], bool]) -> bool:
    """A stop flag, read as late as possible (after the backward pass) when it is a callable, so
    that a signal during this step stops the run after this step rather than the next."""
    return flag() if callable(flag) else flag


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the global L2 norm of all gradients; returns the norm before clipping (a 0-dim
    tensor on the device: nothing here waits for the device).

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
        # The scale is the same on every rank, so each rank scales its own shards in place.
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        torch._foreach_mul_([local(grad) for grad in grads], scale)
    return total
