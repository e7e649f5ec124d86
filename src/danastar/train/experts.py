"""Per-expert statistics of a mixture of experts: how often each routed expert was trained, how
large its weights grew, and (Dana-Star) what its τ says about it.

An expert's weights get gradient only in the steps where some token of the global batch was
routed to it, which is what Dana-Star's τ estimates coordinate by coordinate. `ExpertTally`
counts, per MoE layer and routed expert, over the optimizer steps that updated the weights
(skipped non-finite steps are not counted, as the optimizer did not step):

* `routed_steps[l][e]`: steps in which expert e of MoE layer l had load > 0 (the load is averaged
  over micro-batches and ranks, so it is > 0 exactly when some token anywhere went to it);
* `load_sum[l][e]`: the sum of its load (its fraction of the step's routed (token, expert) pairs).

The tally is part of the checkpoint's run state, so that a resumed run continues it exactly.

At each evaluation `statistics` turns it into the `experts` entry of metrics.jsonl: per MoE layer
(in model order), lists over the R routed experts of

* `routed_share` ρ_e = routed_steps / steps, `load_share` f_e = load_sum / steps (Σ_e f_e = 1;
  both 0 before the first step);
* `weight_norm`: the Frobenius norm of expert e's slices of all its stacked tensors together
  (up, gate, down);
* `tau_mean`, `tau_median` (optimizers with a τ state only): over every coordinate of those
  slices (the median of an even count is the mean of the two middle values);

and `steps`, the number of steps counted. Shared experts see every token and are left out.
"""

from __future__ import annotations

import torch

from danastar.models.moe import MoE


class ExpertTally:
    """Routing counts per MoE layer and routed expert over the steps the optimizer took."""

    def __init__(self, state: dict | None = None) -> None:
        state = state or {}
        self.steps: int = int(state.get("steps", 0))
        self.routed_steps: list[list[int]] = [list(map(int, row))
                                              for row in state.get("routed_steps", [])]
        self.load_sum: list[list[float]] = [list(map(float, row))
                                            for row in state.get("load_sum", [])]

    def add(self, load: list[list[float]] | None) -> None:
        """Count one optimizer step from its per-layer load (`StepResult.moe["moe_load"]`)."""
        if not load:
            return
        if not self.routed_steps:
            self.routed_steps = [[0] * len(row) for row in load]
            self.load_sum = [[0.0] * len(row) for row in load]
        for routed, sums, row in zip(self.routed_steps, self.load_sum, load, strict=True):
            for e, value in enumerate(row):
                routed[e] += value > 0
                sums[e] += value
        self.steps += 1

    def state_dict(self) -> dict:
        return {"steps": self.steps, "routed_steps": [list(row) for row in self.routed_steps],
                "load_sum": [list(row) for row in self.load_sum]}

    def shares(self, layers: int, experts: int) -> tuple[list[list[float]], list[list[float]]]:
        """(ρ, f) per layer and expert; zeros before the first step."""
        if not self.steps or not self.routed_steps:
            zeros = [[0.0] * experts for _ in range(layers)]
            return zeros, [list(row) for row in zeros]
        return ([[count / self.steps for count in row] for row in self.routed_steps],
                [[value / self.steps for value in row] for row in self.load_sum])


def moe_layers(model: torch.nn.Module) -> list[MoE]:
    """The model's MoE layers in the order the routing statistics list them."""
    return [module for module in model.modules() if isinstance(module, MoE)]


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    # sharded experts (FSDP2, expert parallelism) are DTensors: every rank gathers the whole
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _median(values: torch.Tensor) -> float:
    ordered = values.sort().values
    n = ordered.numel()
    return float((ordered[(n - 1) // 2] + ordered[n // 2]) / 2)


@torch.no_grad()
def statistics(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               tally: ExpertTally) -> dict | None:
    """The `experts` entry of an evaluation (None for a dense model). Every rank must call it:
    sharded weights and τ are gathered whole."""
    layers = moe_layers(model)
    if not layers:
        return None
    experts = layers[0].num_routed
    routed, load = tally.shares(len(layers), experts)
    norms, tau_means, tau_medians = [], [], []
    for layer in layers:
        params = list(layer.experts.parameters())
        squares = sum(_whole(p).float().square().sum(dim=(1, 2)) for p in params)
        norms.append(squares.sqrt().tolist())
        taus = [optimizer.state.get(p, {}).get("tau") for p in params]
        if any(tau is None for tau in taus):
            continue
        flat = torch.cat([_whole(tau).float().reshape(experts, -1) for tau in taus], dim=1)
        tau_means.append(flat.mean(dim=1).tolist())
        tau_medians.append([_median(row) for row in flat])
    entry = {"steps": tally.steps, "routed_share": routed, "load_share": load,
             "weight_norm": norms}
    if tau_means and len(tau_means) == len(layers):
        entry["tau_mean"], entry["tau_median"] = tau_means, tau_medians
    return entry

