"""Two SLURM clusters side by side on this machine: `--cluster auto` takes the first in priority
order while it has room, the second once the first is full or drained, and a stopped controller
counts as unavailable within the timeout."""

import socket
import time

import pytest
import yaml

from danastar import cli
from danastar.launch.clusters import choose_cluster, parse_registry, query_capacity

from local_slurm import LocalSlurm

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def two_clusters(munge):
    alpha = LocalSlurm(munge.directory.parent / "alpha", munge, name="alpha",
                       nodes=(socket.gethostname(),))
    beta = LocalSlurm(munge.directory.parent / "beta", munge, name="beta",
                      nodes=(socket.gethostname(),))
    yield alpha, beta
    alpha.stop()
    beta.stop()


def registry_of(alpha, beta, tmp_path):
    text = (f"clusters:\n"
            f"  - {{name: alpha, priority: 1, slurm_conf: {alpha.conf}}}\n"
            f"  - {{name: beta, priority: 2, slurm_conf: {beta.conf}}}\n"
            f"  - {{name: gamma, priority: 0, enabled: false, slurm_conf: {beta.conf}}}\n")
    path = tmp_path / "clusters.yaml"
    path.write_text(text)
    return parse_registry(yaml.safe_load(text), path), path


def chosen(registry) -> str:
    return choose_cluster(registry, nodes=1, gpus_per_node=0, timeout=5)[0].name


def test_auto_picks_the_first_with_room_then_the_next(two_clusters, tmp_path, capsys):
    alpha, beta = two_clusters
    registry, path = registry_of(alpha, beta, tmp_path)
    assert chosen(registry) == "alpha"  # gamma has priority 0 but is disabled: never chosen

    # alpha full: a job holding both of its CPUs
    filler = alpha.run("sbatch", "--parsable", "-n", "2", "-o", "/dev/null", "--wrap",
                       "sleep 300").stdout.strip()
    try:
        deadline = time.monotonic() + 30
        while alpha.job(filler).get("JobState") != "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert query_capacity(registry.get("alpha"), gpus=False).idle_nodes == 0
        assert chosen(registry) == "beta"

        # beta drained too: nothing has room; the fallback queues on the first (not gamma)
        node = socket.gethostname()
        beta.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=test")
        try:
            assert chosen(registry) == "alpha"
            failing = parse_registry({"fallback": "fail", "clusters": [
                {"name": "alpha", "slurm_conf": str(alpha.conf)},
                {"name": "beta", "slurm_conf": str(beta.conf)}]})
            with pytest.raises(Exception, match="no cluster has room"):
                chosen(failing)
        finally:
            beta.run("scontrol", "update", f"nodename={node}", "state=resume")
    finally:
        alpha.run("scancel", filler)

    # The table of `danastar clusters --check`, through the CLI.
    assert cli.main(["clusters", "--clusters", str(path), "--check", "--timeout", "5"]) == 0
    table = capsys.readouterr().out
    assert "alpha" in table and "beta" in table and "skipped (disabled)" in table


def test_a_stopped_controller_is_unavailable_not_idle(two_clusters, tmp_path):
    alpha, beta = two_clusters
    registry, _ = registry_of(alpha, beta, tmp_path)
    alpha.processes["slurmctld"].terminate()
    alpha.processes["slurmctld"].wait()
    try:
        started = time.monotonic()
        capacity = query_capacity(registry.get("alpha"), gpus=False, timeout=3)
        assert not capacity.available and capacity.error
        assert chosen(registry) == "beta"
        assert time.monotonic() - started < 30
    finally:
        alpha.stop()


def test_free_gpus_are_counted_on_half_used_nodes(munge, tmp_path):
    """Fake GPUs through GRES: a node with one of its two GPUs taken is not idle (%F counts it
    allocated) but still has room for a one-GPU job."""
    cluster = LocalSlurm(munge.directory.parent / "gpus", munge, name="gpus",
                         nodes=(socket.gethostname(),), gpus=2)
    try:
        registry = parse_registry([{"name": "gpus", "gpus_per_node": 2,
                                    "slurm_conf": str(cluster.conf)}])
        profile = registry.get("gpus")
        assert query_capacity(profile, gpus=True).free_gpus_per_node == [2]
        holder = cluster.run("sbatch", "--parsable", "--gpus-per-node=1", "-n", "1",
                             "-o", "/dev/null", "--wrap", "sleep 300").stdout.strip()
        deadline = time.monotonic() + 30
        while cluster.job(holder).get("JobState") != "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        capacity = query_capacity(profile, gpus=True)
        assert capacity.idle_nodes == 0 and capacity.free_gpus_per_node == [1]
        assert capacity.can_hold(1, 1) and not capacity.can_hold(1, 2)
        assert choose_cluster(registry, 1, 1, timeout=5)[1].startswith("gpus (auto: first")
        cluster.run("scancel", holder)
    finally:
        cluster.stop()
