"""Evaluation: the mean validation loss over fixed batches, and a sample from the trained model."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from danastar.train import parallel
from danastar.train.data import TrainingData
from danastar.train.routing import ROUTER_LOSSES

if TYPE_CHECKING:
    from danastar.config import TrainConfig


def evaluate(model: torch.nn.Module, batches, autocast) -> float:
    """Mean validation cross-entropy (see `evaluation`)."""
    return evaluation(model, batches, autocast)[0]


@torch.no_grad()
def evaluation(model: torch.nn.Module, batches, autocast) -> tuple[float, dict[str, float]]:
    """Mean validation cross-entropy, and a mixture of experts' mean router losses (computed,
    never added to the loss, in evaluation). Every rank runs the same number of forwards (FSDP
    needs all ranks in each one) on its rows of each fixed batch; the sums are all-reduced."""
    model.eval()
    totals, keys = None, []
    for inputs, targets in batches:
        with autocast:
            out = model(inputs, targets)
        moe = getattr(out, "moe", None) or {}
        keys = [key for key in ROUTER_LOSSES if key in moe]
        rows = float(inputs.shape[0])
        batch_total = torch.stack([out.ce.float() * rows, torch.tensor(rows, device=inputs.device),
                                   *(moe[key].float().to(inputs.device) * rows for key in keys)])
        totals = batch_total if totals is None else totals + batch_total
    parallel.all_reduce_sum(totals)
    model.train()
    means = (totals / totals[1]).tolist()
    return means[0], dict(zip(keys, means[2:]))


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
