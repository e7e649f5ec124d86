"""Cluster profiles: a YAML registry of the SLURM clusters a researcher submits to.

The registry is `~/.config/danastar/clusters.yaml` (or `$DANASTAR_CLUSTERS`, or `--clusters
FILE`): a list of profiles, or a mapping with a `clusters:` list and an optional `fallback:`.

    fallback: queue          # --cluster auto when none has room: queue on the first, or fail
    clusters:
      - name: tamia
        login: tamia          # an ssh host alias of the user's own ~/.ssh/config; empty: here
        partition: gpubase_bynode_b1
        account: def-someone
        gpu_type: h100
        gpus_per_node: 4
        cpus_per_gpu: 12
        mem: 0
        max_nodes: 8
        max_time: "24:00:00"
        priority: 1            # lower first
        setup: ["module load python/3.12", "source ~/venvs/danastar/bin/activate"]
        sbatch_extra: ["--constraint=h100"]
        results_dir: ~/scratch/runs   # where run directories go (default ./runs)
        scratch: $SLURM_TMPDIR        # node-local disk that checkpoints are staged on
        signal_lead: 300
        max_restarts: 100

No secrets, ever: ssh uses the user's own keys and config, and a profile with a field that looks
like a password or a token is refused. `danastar clusters` lists the profiles, `--check` asks
each for its capacity (idle nodes from `sinfo -o '%R %F'`, free GPUs from GRES: never
`sinfo -t idle -o %D`, which counts drained nodes as idle and misses half-used ones).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from danastar.errors import UserError
from danastar.launch import slurm
from danastar.launch.user_yaml import read_user_yaml

DEFAULT_REGISTRY = Path("~/.config/danastar/clusters.yaml")
SECRET_WORDS = re.compile(r"pass(word|wd|phrase)|secret|token|api[_-]?key|credential|"
                          r"private[_-]?key", re.IGNORECASE)
SECRET_ASSIGNMENT = re.compile(r"(pass(word|wd|phrase)?|secret|token|api[_-]?key)\w*\s*[=:]\s*\S",
                               re.IGNORECASE)
# known token shapes: GitHub, Hugging Face, Slack, Stripe-like `sk_`, OpenAI/Anthropic-like `sk-`,
# AWS access key ids
TOKEN_SHAPE = re.compile(r"\b(?:(ghp|gho|github_pat|hf|sk|xox[abp])_[A-Za-z0-9_]{16,}"
                         r"|sk-[A-Za-z0-9_-]{16,}|AKIA[0-9A-Z]{16})")
QUERY_TIMEOUT_S = 15.0


@dataclass
class ClusterProfile:
    name: str
    login: str = ""  # ssh host alias; empty: the SLURM commands run on this machine
    slurm_conf: str = ""  # SLURM_CONF for the commands (local test clusters)
    partition: str = ""
    account: str = ""
    qos: str = ""
    gpu_type: str = ""
    gpus_per_node: int = 0
    cpus_per_gpu: int = 0
    mem: str = ""
    max_nodes: int = 0  # 0: no limit of ours
    max_time: str = ""
    priority: int = 100  # lower is tried first by --cluster auto
    enabled: bool = True
    data_dir: str = ""
    results_dir: str = ""
    scratch: str = ""
    setup: list[str] = field(default_factory=list)
    sbatch_extra: list[str] = field(default_factory=list)
    signal_lead: int = 300
    max_restarts: int = 100
    # micro-batch caps per model size on this GPU type: {heads: max sequences per GPU}
    micro_batch_caps: dict[int, int] = field(default_factory=dict)

    def environment(self) -> dict[str, str]:
        """The environment for this cluster's SLURM commands."""
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = str(Path(self.slurm_conf).expanduser())
        return env

    def command(self, argv: list[str]) -> list[str]:
        """`argv` as run for this cluster: here, or over the user's own ssh to `login`."""
        if not self.login:
            return argv
        return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", self.login,
                shlex.join(argv)]

    def run(self, argv: list[str], timeout: float = QUERY_TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), env=self.environment(), capture_output=True,
                              text=True, timeout=timeout)


@dataclass
class Registry:
    clusters: list[ClusterProfile]
    fallback: str = "queue"  # queue (on the first enabled profile) | fail
    source: Path | None = None

    def get(self, name: str) -> ClusterProfile:
        for profile in self.clusters:
            if profile.name == name:
                return profile
        known = ", ".join(p.name for p in self.clusters) or "none"
        raise UserError(f"no cluster named {name!r} in {self.source or 'the cluster registry'} "
                        f"(known: {known}); add a profile or pick one of those.")

    def by_priority(self) -> list[ClusterProfile]:
        return sorted(self.clusters, key=lambda p: p.priority)


def registry_path(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get("DANASTAR_CLUSTERS") or DEFAULT_REGISTRY).expanduser()


def load_registry(explicit: str | None = None, required: bool = True) -> Registry:
    """The registry at `--clusters`, `$DANASTAR_CLUSTERS` or ~/.config/danastar/clusters.yaml."""
    path = registry_path(explicit)
    if not path.is_file():
        if required:
            raise UserError(f"no cluster registry at {path}; write one (see docs/clusters.md) or "
                            f"pass --clusters FILE.")
        return Registry([], source=path)
    return parse_registry(read_user_yaml(path, "cluster registry") or {}, path)


def parse_registry(loaded: Any, source: Path | None = None) -> Registry:
    where = f"cluster registry {source}" if source else "the cluster registry"
    fallback = "queue"
    if isinstance(loaded, dict):
        fallback = str(loaded.get("fallback", "queue"))
        unknown = set(loaded) - {"clusters", "fallback"}
        if unknown:
            raise UserError(f"{where} has unknown keys {sorted(unknown)}; use clusters: and "
                            f"fallback:.")
        loaded = loaded.get("clusters") or []
    if fallback not in ("queue", "fail"):
        raise UserError(f"{where}: fallback {fallback!r} is not known; use queue or fail.")
    if not isinstance(loaded, list):
        raise UserError(f"{where} must hold a list of cluster profiles (each with a name:).")
    profiles: list[ClusterProfile] = []
    for entry in loaded:
        profiles.append(parse_profile(entry, where, taken={p.name for p in profiles}))
    return Registry(profiles, fallback, source)


def parse_profile(entry: Any, where: str, taken: set[str]) -> ClusterProfile:
    """One profile of the registry (`where` names the registry; `taken`, the names before it),
    checked field by field."""
    if not isinstance(entry, dict) or not entry.get("name"):
        raise UserError(f"{where}: every profile is a mapping with a name:, not {entry!r}.")
    name = str(entry["name"])
    refuse_secrets(entry, name, where)
    fields = {f.name for f in dataclasses.fields(ClusterProfile)}
    unknown = sorted(set(entry) - fields)
    if unknown:
        raise UserError(f"{where}: profile {name} has unknown fields {unknown}; valid fields: "
                        f"{', '.join(sorted(fields))}.")
    if name in taken:
        raise UserError(f"{where}: two profiles are named {name}; rename one.")
    values = {key: value for key, value in entry.items() if value is not None}
    for key in ("setup", "sbatch_extra"):
        if isinstance(values.get(key), str):
            values[key] = [values[key]]
    check_profile(values, f"{where}: profile {name}")
    for key in ("mem", "max_time", "login", "partition", "account", "qos"):
        if key in values:
            values[key] = str(values[key])
    try:
        return ClusterProfile(**values)
    except TypeError as error:
        raise UserError(f"{where}: profile {name} is malformed ({error}).") from None


# Whole-number fields of a profile and their least value (None: any)
PROFILE_COUNTS = {"gpus_per_node": 0, "cpus_per_gpu": 0, "max_nodes": 0, "signal_lead": 0,
                  "max_restarts": 0, "priority": None}


def check_profile(values: dict, where: str) -> None:
    """Each field of a profile by its type, and the SLURM values (max_time, mem, partition,
    account, qos, sbatch_extra) as SLURM reads them; ``where`` names the profile."""
    for key, least in PROFILE_COUNTS.items():
        value = values.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            raise UserError(f"{where} field {key} takes a whole number, not {value!r}.")
        if least is not None and value < least:
            raise UserError(f"{where} field {key} must be at least {least}, not {value}.")
    if not isinstance(values.get("enabled", True), bool):
        raise UserError(f"{where} field enabled takes true or false, not "
                        f"{values['enabled']!r}.")
    for key in ("setup", "sbatch_extra"):
        lines = values.get(key, [])
        if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
            raise UserError(f"{where} field {key} takes a list of lines of text, not {lines!r}.")
    caps = values.get("micro_batch_caps", {})
    if not isinstance(caps, dict) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0
            for pair in caps.items() for n in pair):
        raise UserError(f"{where} field micro_batch_caps takes {{heads: sequences per GPU}} "
                        f"with whole numbers above 0, not {caps!r}.")
    check_slurm_values(values, where)


def check_slurm_values(values: dict, where: str) -> None:
    """A profile's sbatch_extra, max_time, mem, partition, account and qos, as SLURM reads them."""
    for line in values.get("sbatch_extra", []):
        if not line.startswith("-") or "\n" in line:
            raise UserError(f"{where} field sbatch_extra holds {line!r}; each item is one sbatch "
                            "option, e.g. --constraint=h100.")
    max_time = values.get("max_time", "")
    if isinstance(max_time, int) and not isinstance(max_time, bool):
        raise UserError(f"{where} field max_time is the number {max_time}, as YAML reads an "
                        "unquoted time such as 24:00:00 (86400); quote it (max_time: "
                        "\"24:00:00\", or \"90\" for 90 minutes).")
    slurm.time_limit_seconds(str(max_time), f"{where} field max_time")
    if "mem" in values:
        slurm.check_memory(str(values["mem"]), f"{where} field mem")
    for key in ("partition", "account", "qos"):
        slurm.check_word(str(values.get(key, "")), f"{where} field {key}")


def refuse_secrets(entry: dict, name: str, where: str) -> None:
    """A password or token never belongs in a profile (ssh uses the user's own keys): a field
    named like one, a value assigning one (`export WANDB_API_KEY=...`), or a value shaped like a
    known token is refused."""
    for key, value in entry.items():
        items = value if isinstance(value, list) else [value]
        texts = [str(item) for item in items if isinstance(item, str)]
        if (SECRET_WORDS.search(str(key))
                or any(SECRET_ASSIGNMENT.search(text) or TOKEN_SHAPE.search(text)
                       for text in texts)):
            raise UserError(f"{where}: profile {name} field {key!r} looks like it holds a password "
                            f"or token; remove it (ssh uses your own keys and config, and nothing "
                            f"secret belongs in a profile).")


# ----------------------------------------------------------------------------------------------
# Capacity

@dataclass
class Capacity:
    """What a cluster can start now. `available` False: it did not answer (not "0 idle")."""

    cluster: str
    available: bool
    idle_nodes: int = 0
    total_nodes: int = 0
    free_gpus_per_node: list[int] = field(default_factory=list)  # usable nodes only
    error: str = ""

    @property
    def free_gpus(self) -> int:
        return sum(self.free_gpus_per_node)

    def can_hold(self, nodes: int, gpus_per_node: int) -> bool:
        if not self.available:
            return False
        if gpus_per_node > 0 and self.free_gpus_per_node:
            return sum(free >= gpus_per_node for free in self.free_gpus_per_node) >= nodes
        return self.idle_nodes >= nodes


def parse_node_counts(text: str) -> tuple[int, int]:
    """(idle, total) nodes from `sinfo -h -o '%R %F'` lines ("partition A/I/O/T"): I is idle
    and usable; drained and down nodes are in O, half-used ones in A."""
    idle = total = 0
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2 or fields[-1].count("/") != 3:
            continue
        allocated, idle_nodes, other, all_nodes = (int(n) for n in fields[-1].split("/"))
        idle, total = idle + idle_nodes, total + all_nodes
    return idle, total


UNUSABLE_STATES = ("drain", "drng", "down", "fail", "maint", "resv", "plnd", "inval", "futr",
                   "boot", "npc", "pow")


def gpu_count(gres: str) -> int:
    """GPUs in a GRES string such as `gpu:h100:4(S:0-1)` or `gpu:2,shard:8` (0 when none)."""
    count = 0
    for item in gres.split(","):
        item = re.sub(r"\(.*?\)", "", item).strip()
        parts = item.split(":")
        if parts and parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            count += int(parts[-1])
    return count


def parse_free_gpus(text: str) -> list[int]:
    """Free GPUs of each usable node from `sinfo -h -N -O NodeHost,StateCompact,Gres,GresUsed`
    (a node listed in several partitions counts once; drained or down nodes not at all)."""
    free: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        host, state, gres, used = fields[0], fields[1].lower(), fields[2], fields[3]
        if any(word in state for word in UNUSABLE_STATES) or state.startswith("alloc"):
            continue
        free[host] = max(0, gpu_count(gres) - gpu_count(used))
    return [count for count in free.values() if count > 0]


def query_capacity(profile: ClusterProfile, gpus: bool, timeout: float = QUERY_TIMEOUT_S
                   ) -> Capacity:
    """Ask the cluster (under a timeout) what it can start now."""
    partition = ["-p", profile.partition] if profile.partition else []
    try:
        counts = profile.run(["sinfo", "-h", *partition, "-o", "%R %F"], timeout=timeout)
        if counts.returncode != 0:
            message = (counts.stderr or counts.stdout).strip().splitlines()
            return Capacity(profile.name, False, error=message[-1] if message else "sinfo failed")
        idle, total = parse_node_counts(counts.stdout)
        free = []
        if gpus:
            nodes = profile.run(["sinfo", "-h", "-N", *partition, "-O",
                                 "NodeHost:40,StateCompact:20,Gres:80,GresUsed:80"],
                                timeout=timeout)
            if nodes.returncode == 0:
                free = parse_free_gpus(nodes.stdout)
        return Capacity(profile.name, True, idle, total, free)
    except subprocess.TimeoutExpired:
        return Capacity(profile.name, False, error=f"no answer within {timeout:g} s")
    except OSError as error:
        return Capacity(profile.name, False, error=str(error))


def environment_timeout() -> float:
    """$DANASTAR_CLUSTER_TIMEOUT (seconds to wait for each cluster's answer), else the default."""
    text = os.environ.get("DANASTAR_CLUSTER_TIMEOUT", "").strip()
    if not text:
        return QUERY_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"DANASTAR_CLUSTER_TIMEOUT={text} must be a number of seconds greater "
                        f"than 0 (default {QUERY_TIMEOUT_S:g}); set it so, or unset it.")
    return value


def choose_cluster(registry: Registry, nodes: int, gpus_per_node: int | None,
                   timeout: float | None = None) -> tuple[ClusterProfile, str]:
    """`--cluster auto`: the first enabled profile (priority order) with room for the request;
    else the registry's fallback (queue on the first enabled profile, or fail). A disabled
    profile is never chosen."""
    timeout = environment_timeout() if timeout is None else timeout
    enabled = [p for p in registry.by_priority() if p.enabled]
    if not enabled:
        raise UserError(f"no enabled cluster in {registry.source}; enable one or add a profile.")
    seen = []
    for profile in enabled:
        gpus = profile.gpus_per_node if gpus_per_node is None else gpus_per_node
        if profile.max_nodes and nodes > profile.max_nodes:
            seen.append(f"{profile.name}: at most {profile.max_nodes} nodes")
            continue
        capacity = query_capacity(profile, gpus > 0, timeout)
        if capacity.can_hold(nodes, gpus):
            return profile, f"{profile.name} (auto: first in priority order with room)"
        seen.append(f"{profile.name}: {describe(capacity)}")
    if registry.fallback == "fail":
        raise UserError(f"no cluster has room for {nodes} node(s) now ({'; '.join(seen)}); "
                        f"try later, ask for less, or set fallback: queue.")
    return enabled[0], f"{enabled[0].name} (auto: none has room, queued on the first; " \
        f"{'; '.join(seen)})"


def describe(capacity: Capacity) -> str:
    if not capacity.available:
        return f"unavailable ({capacity.error})"
    text = f"{capacity.idle_nodes}/{capacity.total_nodes} nodes idle"
    if capacity.free_gpus_per_node:
        text += f", {capacity.free_gpus} GPUs free"
    return text


def fit_micro_batch(batch_size: int, acc_steps: int, world: int, cap: int, why: str
                    ) -> tuple[int, int]:
    """Halve the per-micro-step batch and double the accumulation until each GPU's micro-batch
    fits `cap`; the global batch (batch_size × acc_steps) never changes."""
    while batch_size % world == 0 and batch_size // world > cap:
        if batch_size % 2 or (batch_size // 2) % world:
            raise UserError(
                f"--batch_size {batch_size} over {world} GPUs is {batch_size // world} sequences "
                f"per GPU, more than {why}, and halving it does not split evenly; choose a "
                f"--batch_size that is a multiple of {2 * world}.")
        batch_size, acc_steps = batch_size // 2, acc_steps * 2
    return batch_size, acc_steps
