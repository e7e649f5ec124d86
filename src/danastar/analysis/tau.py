"""The maths of the τ figure (`danastar plot tau`), from the files `--collect_tau_stats` writes
(format in `danastar.train.tau_stats`): each tensor's CDF rebuilt from its order statistics, the
regularised τ̃, and the averaging of the CDFs of one parameter type.

* CDF: the k-th smallest τ (at index I_k of the sorted values) sits at (I_k + 1)/n, the k-th
  largest (at n − 1 − I_k) at (n − I_k)/n; both ends together trace the whole curve.
* τ̃ = max(min(τ, ½) / (1 − min(τ, ½)), 1/(1 + t)) at step t: the odds of τ, capped at τ = ½ and
  floored at the smallest value τ can resolve after t steps, so that a log axis never meets 0.
* Types: embedding, attention, MLP, output (and norm, left out of the summary), by the parameter
  names of Enoki and Qwen3. The CDF of a type is the mean of its tensors' CDFs (each tensor
  weighs the same, whatever its size), evaluated at the union of their τ̃ points.
* A mixture of experts adds the type "experts": the routed experts' stacked parameters
  (`blocks.0.mlp.experts.up_proj`) and their per-expert slices (`...up_proj[3]`); shared experts
  see every token and stay MLP. Its CDF is the mean over the slices, so that each expert weighs
  the same (over the whole tensors where a file has no slices).
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from danastar.errors import UserError

TYPES = ("embedding", "attention", "MLP", "output")  # the 2×2 summary, in reading order
EXPERTS = "experts"  # the extra panel of a mixture of experts
_SLICE = re.compile(r"^(.*)\[(\d+)\]$")  # `<name>[<e>]`: expert e's slice of a stacked tensor
_STEP_FILE = re.compile(r"^step-(\d+)\.npz$")


@dataclass(frozen=True)
class Collection:
    """One `step-*.npz`: per parameter name, its order statistics."""

    step: int
    tensors: dict[str, dict[str, np.ndarray]]


def cdf_points(smallest, largest, indices, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(τ, F) ascending in τ: the k-th smallest at (I_k + 1)/n, the k-th largest at (n − I_k)/n.
    Where both ends reach the same order statistic (the middle, or every index of a small tensor)
    the point appears once."""
    indices = np.asarray(indices, dtype=np.int64)
    positions = np.concatenate([indices, n - 1 - indices])  # 0-based rank in the sorted values
    values = np.concatenate([np.asarray(smallest, float), np.asarray(largest, float)])
    positions, first = np.unique(positions, return_index=True)
    return values[first], (positions + 1) / n


def regularised(tau, step: int) -> np.ndarray:
    """τ̃ = max(min(τ, ½)/(1 − min(τ, ½)), 1/(1 + t))."""
    capped = np.minimum(np.asarray(tau, float), 0.5)
    return np.maximum(capped / (1 - capped), 1 / (1 + step))


def parameter_type(name: str) -> str:
    """embedding, attention, MLP, output or norm, from an Enoki or Qwen3 parameter name
    (`embed.weight`, `blocks.0.attn.qkv_proj.weight`, `blocks.0.self_attn.q_proj.weight`,
    `blocks.0.mlp.up_proj.weight`, `lm_head.weight`, `blocks.0.attn_norm.weight`, ...); experts
    for a routed expert tensor or slice (`blocks.0.mlp.experts.up_proj[3]`)."""
    parts = _SLICE.sub(r"\1", name).split(".")
    if "experts" in parts[:-1]:  # the routed experts (shared ones are `shared_experts`)
        return EXPERTS
    if any("norm" in part for part in parts[:-1]):  # q_norm / k_norm sit inside attention
        return "norm"
    if parts[0] in ("embed", "wte", "embed_tokens") or "embed" in parts[-2:-1]:
        return "embedding"
    if parts[0] == "lm_head":
        return "output"
    if any(part in ("attn", "self_attn", "attention") for part in parts):
        return "attention"
    if any(part in ("mlp", "feed_forward", "ffn") for part in parts):
        return "MLP"
    return "other"


def is_expert_slice(name: str) -> bool:
    return _SLICE.match(name) is not None


def panel_tensors(names) -> dict[str, list[str]]:
    """The tensors each panel averages, by type: for experts the per-expert slices (the whole
    stacked tensors where there are no slices), for every other type its tensors."""
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        groups.setdefault(parameter_type(name), []).append(name)
    if EXPERTS in groups:
        slices = [name for name in groups[EXPERTS] if is_expert_slice(name)]
        groups[EXPERTS] = slices or groups[EXPERTS]
    return groups


def tensor_cdf(arrays: dict[str, np.ndarray], step: int) -> tuple[np.ndarray, np.ndarray]:
    """(τ̃, F) of one tensor: its CDF points with τ regularised at `step`. τ̃ ties (the floor,
    the cap) keep the highest F, as a CDF is the fraction at or below a value."""
    n = int(np.prod(arrays["shape"]))
    tau, cdf = cdf_points(arrays["smallest"], arrays["largest"], arrays["indices"], n)
    x = regularised(tau, step)
    x, last = np.unique(x[::-1], return_index=True)  # F ascends with x: the last of a tie is max
    return x, cdf[::-1][last]


def mean_cdf(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The mean of several CDFs at the union of their points: each one linear in log τ̃ between
    its points, 0 below its smallest and 1 above its largest."""
    grid = np.unique(np.concatenate([x for x, _ in curves]))
    log_grid = np.log(grid)
    total = sum(np.interp(log_grid, np.log(x), f, left=0.0, right=1.0) for x, f in curves)
    return grid, total / len(curves)


def type_cdfs(collection: Collection) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per parameter type present, the mean CDF of its tensors at this collection's step."""
    return {kind: mean_cdf([tensor_cdf(collection.tensors[name], collection.step)
                            for name in names])
            for kind, names in panel_tensors(collection.tensors).items()}


def read_collections(run_dir: Path) -> list[Collection]:
    """Every `tau_stats/step-*.npz` of a run, by step."""
    directory = Path(run_dir) / "tau_stats"
    files = sorted((int(m.group(1)), path) for path in directory.glob("step-*.npz")
                   if (m := _STEP_FILE.match(path.name)))
    if not files:
        raise UserError(f"{run_dir} has no τ statistics (tau_stats/step-*.npz); train it with "
                        "--collect_tau_stats (a Dana-Star optimizer) past evaluation 10.")
    collections = []
    for step, path in files:
        tensors: dict[str, dict[str, np.ndarray]] = {}
        try:
            with np.load(path, allow_pickle=False) as loaded:
                for key in loaded.files:
                    name, _, field = key.rpartition("::")
                    tensors.setdefault(name, {})[field] = loaded[key]
        except (OSError, ValueError, zipfile.BadZipFile) as error:
            # numpy's own message suggests unpickling: not something to tell a reader of files
            raise UserError(f"{path} is not a readable τ statistics file (.npz without "
                            "pickle); delete it or collect it again.") from error
        collections.append(Collection(step, tensors))
    return collections


def check_param(collections: list[Collection], name: str) -> None:
    names = sorted({n for c in collections for n in c.tensors})
    if name not in names:
        raise UserError(f"no parameter {name!r} in the τ statistics; --param takes one of: "
                        f"{', '.join(names)}.")
