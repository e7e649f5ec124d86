"""Cross-entropy plus z-loss over the output head, in chunks of positions.

The full (B, T, V) logits never exist: each chunk of rows gets its logits, its loss terms and,
when gradients are needed, its gradients with respect to the hidden states and the head weight
right away, so only one chunk of logits is alive at a time and backward is a multiplication.

    loss = mean_i [ lse_i − logit_i[target_i] ]  +  z · mean_i lse_i²     (i over targets != −1)
    ∂loss/∂logits_i = (softmax_i · (1 + 2·z·lse_i) − onehot(target_i)) / n_valid
"""

from __future__ import annotations

from typing import NamedTuple

import torch

IGNORE_INDEX = -1


class LossOutput(NamedTuple):
    """The training loss and its parts (``ce``, ``z`` and ``moe`` are detached, for logging).

    ``moe`` is empty for dense models; for mixtures of experts it holds the router losses and
    expert load of the forward (see ``danastar.models.moe.collect``), and in training mode
    ``loss`` also contains the weighted router losses."""

    loss: torch.Tensor
    ce: torch.Tensor
    z: torch.Tensor
    moe: dict[str, torch.Tensor] = {}  # never mutated: a fresh dict is built for each forward


def chunk_terms(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, z_loss: float,
                n_valid: torch.Tensor, need_grad: bool):
    """One chunk's cross-entropy sum, z-loss sum and (``need_grad``) ∂loss/∂logits.

    ``logits`` come from the head matmul in the compute dtype; the loss is taken in float32 and
    the gradient returned in the compute dtype. Every step here is elementwise or a row
    reduction, so a compiled copy (`compiled_chunk_terms`) fuses them into a couple of passes
    over the chunk's logits instead of one pass per operation.
    """
    compute_dtype = logits.dtype
    logits = logits.float()  # the loss itself is always float32
    lse = torch.logsumexp(logits, dim=-1)
    ce_sum = ((lse - logits.gather(1, target).squeeze(1)) * mask).sum()
    z_sum = (lse.square() * mask).sum()
    if not need_grad:
        return ce_sum, z_sum, None
    grad_logits = logits.sub_(lse[:, None]).exp_()  # softmax, in place
    grad_logits.mul_((1 + 2 * z_loss * lse)[:, None])
    grad_logits.scatter_add_(1, target, -torch.ones_like(target, dtype=torch.float32))
    grad_logits.mul_((mask / n_valid)[:, None])
    return ce_sum, z_sum, grad_logits.to(compute_dtype)


_compiled_chunk_terms = None


def compiled_chunk_terms():
    """`chunk_terms` compiled once per process (a chunk's rows vary only in the last chunk)."""
    global _compiled_chunk_terms
    if _compiled_chunk_terms is None:
        _compiled_chunk_terms = torch.compile(chunk_terms)
    return _compiled_chunk_terms


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                z_loss: float, chunk_rows: int, compute_dtype: torch.dtype, compiled: bool,
                grad_enabled: bool):
        # `needs_input_grad` says only whether an input requires grad, also under no_grad (an
        # evaluation), where computing the gradients would double the work for nothing
        need_grad = grad_enabled and (ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        head = weight.to(compute_dtype)
        valid = targets != IGNORE_INDEX
        n_valid = valid.sum().clamp(min=1).float()
        ce_sum = hidden.new_zeros((), dtype=torch.float32)
        z_sum = hidden.new_zeros((), dtype=torch.float32)
        grad_hidden = torch.empty_like(hidden) if need_grad else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_grad else None

        terms = compiled_chunk_terms() if compiled else chunk_terms
        for start in range(0, hidden.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            x = hidden[rows].to(compute_dtype)
            target = targets[rows].clamp(min=0)[:, None]  # ignored rows are masked below
            mask = valid[rows].float()
            chunk_ce, chunk_z, grad_logits = terms(x @ head.T, target, mask, z_loss, n_valid,
                                                   need_grad)
            ce_sum += chunk_ce
            z_sum += chunk_z
            if need_grad:
                grad_hidden[rows] = grad_logits @ head
                grad_weight += (grad_logits.T @ x).float()

        ce = ce_sum / n_valid
        z = z_loss * z_sum / n_valid
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(ce, z)
        return ce + z, ce, z

    @staticmethod
    def backward(ctx, grad_loss, grad_ce, grad_z):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (grad_hidden * grad_loss.to(grad_hidden.dtype),
                (grad_weight * grad_loss).to(ctx.weight_dtype), None, None, None, None, None,
                None)


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          z_loss: float = 1e-4, chunk: int = 256,
                          compiled: bool = False) -> LossOutput:
    """Loss of the head ``weight`` (V, d) on ``hidden`` (B, T, d) against ``targets`` (B, T).

    The B·T positions are processed B·``chunk`` rows at a time (the memory of ``chunk``
    positions of every sequence). Targets equal to −1 are
    ignored. Under autocast the head matmuls run in the autocast dtype and the loss in float32.
    ``compiled`` runs each chunk's elementwise work through `torch.compile` (same values up to
    rounding; on a GPU several times faster than one kernel per operation).
    """
    device_type = hidden.device.type
    compute_dtype = (torch.get_autocast_dtype(device_type)
                     if torch.is_autocast_enabled(device_type) else weight.dtype)
    with torch.autocast(device_type, enabled=False):
        loss, ce, z = _ChunkedLinearCrossEntropy.apply(
            hidden.flatten(0, 1), weight, targets.flatten(), z_loss,
            chunk * hidden.shape[0], compute_dtype, compiled, torch.is_grad_enabled())
    return LossOutput(loss, ce, z, {})
