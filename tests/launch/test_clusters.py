"""Cluster profiles: the registry, secret refusal, capacity from recorded `sinfo` outputs,
micro-batch caps."""

import pytest

from danastar.errors import UserError
from danastar.launch.clusters import (
    Capacity,
    fit_micro_batch,
    gpu_count,
    parse_free_gpus,
    parse_node_counts,
    parse_registry,
)


def test_a_registry_reads_profiles_and_the_fallback():
    registry = parse_registry({"fallback": "fail", "clusters": [
        {"name": "b", "priority": 2, "setup": "module load python", "mem": 0},
        {"name": "a", "priority": 1, "gpus_per_node": 4, "gpu_type": "h100",
         "micro_batch_caps": {12: 8}}]})
    assert [p.name for p in registry.by_priority()] == ["a", "b"]
    assert registry.get("b").setup == ["module load python"] and registry.get("b").mem == "0"
    assert registry.fallback == "fail" and registry.get("a").micro_batch_caps == {12: 8}
    with pytest.raises(UserError, match="no cluster named 'c'"):
        registry.get("c")


@pytest.mark.parametrize("profile", [
    {"name": "x", "password": "hunter2"},
    {"name": "x", "wandb_api_key": "abc"},
    {"name": "x", "setup": ["export WANDB_API_KEY=0123456789abcdef"]},
    {"name": "x", "setup": ["huggingface-cli login --token hf_abcdefghijklmnopqrstuvwxyz"]},
    {"name": "x", "login": "user:secret_token=abc@host"},
    {"name": "x", "sbatch_extra": ["--comment=sk-proj-0123456789abcdefghij"]},
    {"name": "x", "setup": ["export ANTHROPIC=sk-ant-api03-0123456789abcdef"]},
])
def test_a_profile_holding_a_secret_is_refused(profile):
    with pytest.raises(UserError, match="looks like it holds a password or token"):
        parse_registry([profile])


@pytest.mark.parametrize("bad, message", [
    ([{"name": "x", "gpus": 4}], "unknown fields"),
    ([{"name": "x"}, {"name": "x"}], "two profiles are named x"),
    ({"clusters": [], "fallback": "maybe"}, "fallback 'maybe' is not known"),
    ([{"partition": "gpu"}], "with a name"),
])
def test_a_malformed_registry_is_refused_with_the_fix(bad, message):
    with pytest.raises(UserError, match=message):
        parse_registry(bad)


@pytest.mark.parametrize("field, message", [
    ("gpus_per_node: -4", "field gpus_per_node must be at least 0, not -4."),
    ("max_restarts: -1", "field max_restarts must be at least 0, not -1."),
    ("priority: high", "field priority takes a whole number, not 'high'."),
    ("enabled: maybe", "field enabled takes true or false, not 'maybe'."),
    ("max_time: forever", "field max_time 'forever' is not a SLURM time limit; write it as "
                          "minutes, minutes:seconds, hours:minutes:seconds, days-hours,"),
    ("max_time: 24:00:00", "field max_time is the number 86400, as YAML reads an unquoted time "
                           "such as 24:00:00 (86400); quote it"),
    ("mem: lots", "field mem 'lots' is not a SLURM memory size; write a whole number of "
                  "megabytes, or one with a unit K, M, G or T"),
    ("partition: gpu long", "field partition 'gpu long' is not one word"),
    ("sbatch_extra: [constraint=h100]", "field sbatch_extra holds 'constraint=h100'; each "
                                        "item is one sbatch option, e.g. --constraint=h100."),
    ("micro_batch_caps: {2: 0}", "field micro_batch_caps takes {heads: sequences per GPU}"),
])
def test_profile_values_are_checked_as_slurm_reads_them(field, message):
    import yaml

    with pytest.raises(UserError) as refused:
        parse_registry(yaml.safe_load(f"clusters:\n  - name: x\n    {field}\n"))
    assert "profile x " + message in str(refused.value)


def test_good_profile_values_are_kept():
    registry = parse_registry([{"name": "x", "max_time": "0-04:00", "mem": 0, "qos": None},
                               {"name": "y", "mem": "64GB", "max_time": "infinite"}])
    assert registry.get("x").max_time == "0-04:00" and registry.get("x").mem == "0"
    assert registry.get("x").qos == "" and registry.get("y").mem == "64GB"


# Recorded outputs of `sinfo -h -p P -o '%R %F'` (A/I/O/T)
IDLE = "gpu 0/4/0/4\n"
MIXED = "gpu 2/1/1/4\n"  # two busy, one idle, one drained
DRAINED = "gpu 0/0/4/4\n"


def test_idle_nodes_come_from_the_I_of_A_I_O_T():
    assert parse_node_counts(IDLE) == (4, 4)
    assert parse_node_counts(MIXED) == (1, 4)  # the drained node is not idle
    assert parse_node_counts(DRAINED) == (0, 4)
    assert parse_node_counts("sinfo: error: unable to contact controller\n") == (0, 0)


# Recorded `sinfo -h -N -O NodeHost,StateCompact,Gres,GresUsed`
GPU_NODES = """\
g1   idle   gpu:h100:4(S:0-1)   gpu:h100:0(IDX:N/A)
g2   mix    gpu:h100:4(S:0-1)   gpu:h100:3(IDX:0-2)
g3   drain  gpu:h100:4(S:0-1)   gpu:h100:0(IDX:N/A)
g4   alloc  gpu:h100:4(S:0-1)   gpu:h100:4(IDX:0-3)
g5   mix-   gpu:4               gpu:2
g1   idle   gpu:h100:4(S:0-1)   gpu:h100:0(IDX:N/A)
"""


def test_free_gpus_count_half_used_nodes_and_never_drained_ones():
    assert gpu_count("gpu:h100:4(S:0-1)") == 4 and gpu_count("gpu:2,shard:8") == 2
    assert gpu_count("(null)") == 0
    free = parse_free_gpus(GPU_NODES)
    assert sorted(free) == [1, 2, 4]  # g1 (listed twice, counted once), g2, g5
    capacity = Capacity("c", True, idle_nodes=1, total_nodes=5, free_gpus_per_node=free)
    assert capacity.can_hold(1, 4) and not capacity.can_hold(2, 4)
    assert capacity.can_hold(3, 1) and not capacity.can_hold(4, 1)
    assert not Capacity("c", False, error="timeout").can_hold(1, 0)  # unavailable, not "0 idle"


def test_micro_batch_caps_keep_the_global_batch_or_refuse():
    assert fit_micro_batch(64, 1, 4, 16, "cap") == (64, 1)
    assert fit_micro_batch(64, 1, 4, 8, "cap") == (32, 2)
    assert fit_micro_batch(64, 2, 4, 4, "cap") == (16, 8)
    with pytest.raises(UserError, match="halving it does not split evenly"):
        fit_micro_batch(12, 1, 4, 2, "cap")


@pytest.mark.parametrize("args, message", [
    # Before: accepted, and every cluster then read as "no answer within -5 s".
    (["--check", "--timeout", "-5"],
     "--timeout -5 must be a number of seconds greater than 0 (default 15)."),
    (["--check", "--timeout", "nan"],
     "--timeout nan must be a number of seconds greater than 0 (default 15)."),
    # Before: ignored without a word.
    (["--timeout", "5"], "--timeout is how long --check waits for each cluster; add --check, or "
                         "remove --timeout."),
], ids=["negative", "nan", "without-check"])
def test_a_timeout_out_of_range_or_without_check_is_one_sentence(args, message, tmp_path,
                                                                 capsys):
    from danastar.cli import main

    registry = tmp_path / "clusters.yaml"
    registry.write_text("clusters:\n  - name: here\n")
    assert main(["clusters", "--clusters", str(registry), *args]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"danastar clusters: {message}"]


def test_a_bad_timeout_in_the_environment_is_one_sentence(monkeypatch):
    from danastar.launch.clusters import environment_timeout

    monkeypatch.setenv("DANASTAR_CLUSTER_TIMEOUT", "soon")
    with pytest.raises(UserError, match=r"^DANASTAR_CLUSTER_TIMEOUT=soon must be a number of "
                                        r"seconds greater than 0 \(default 15\); set it so, or "
                                        r"unset it\.$"):
        environment_timeout()
    monkeypatch.setenv("DANASTAR_CLUSTER_TIMEOUT", "2.5")
    assert environment_timeout() == 2.5
