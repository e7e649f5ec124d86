"""A mixture of experts' routing statistics of one optimizer step, averaged over its
micro-batches and over the ranks, as metrics.jsonl entries.

What a mixture of experts reports per forward (`LossOutput.moe`) and the loop averages: the router
losses (unweighted), the dropped share of (token, expert) pairs and the per-layer load (fraction
of routed assignments per expert). Every micro-batch on every rank has the same number of tokens,
so the averaged load is the global batch's.
"""

from __future__ import annotations

import torch

ROUTER_LOSSES = ("moe_aux_loss", "moe_z_loss", "moe_entropy_loss")
ROUTING_AVERAGED = (*ROUTER_LOSSES, "moe_dropped_fraction", "moe_load")


class RoutingSums:
    """The routing statistics of one optimizer step, summed over its micro-batches (nothing
    for a dense model)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, out) -> None:
        moe = getattr(out, "moe", None) or {}
        for key in ROUTING_AVERAGED:
            if key in moe:  # a count may come from the host: all go where the losses are
                value = torch.as_tensor(moe[key]).detach().float().to(self.device)
                self.sums[key] = value if key not in self.sums else self.sums[key] + value

    def flat(self) -> torch.Tensor:
        if not self.sums:
            return torch.zeros(0, device=self.device)
        return torch.cat([value.reshape(-1) for value in self.sums.values()])

    def metrics(self, values: list[float]) -> dict:
        """The averaged `values` (as `flat` laid them out) as metrics.jsonl entries: the router
        losses, `moe_dropped_fraction`, `moe_load` (per MoE layer, the fraction of routed
        assignments per expert) and `moe_max_load` (the largest of them times the R routed
        experts: 1 when balanced, R/k when every token goes to the same k experts)."""
        metrics, at = {}, 0
        for key, value in self.sums.items():
            size = value.numel()
            metrics[key] = values[at] if value.dim() == 0 else \
                torch.tensor(values[at:at + size]).reshape(value.shape).tolist()
            at += size
        load = metrics.get("moe_load")
        if load:
            metrics["moe_max_load"] = max(max(row) for row in load) * len(load[0])
        return metrics
