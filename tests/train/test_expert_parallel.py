"""Expert parallelism on 2 gloo processes: the MoE model with its experts split over an `ep` mesh
gives the outputs and (reduced) gradients of one process running both ranks' batches, a capacity
drops the pairs a hand count says, and `danastar train --ep_size 2` follows the run without it
and resumes."""

import dataclasses
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from danastar.config import batch_layout, merge
from danastar.errors import UserError
from danastar.models import ModelConfig, build_model
from danastar.models.expert_parallel import apply_expert_parallel as shard_experts
from danastar.train import parallel, wrap

from train_helpers import assert_ok, assert_stopped_with_work_left, compared, metrics, run_train

VOCAB = 64


def tiny_moe(arch: str, **overrides) -> ModelConfig:
    fields = dict(arch=arch, n_layer=2, n_head=2, n_embd=16, head_dim=8, mlp_hidden=24,
                  vocab_size=VOCAB, max_seq_len=16, loss_chunk=8, moe=True, moe_num_experts=5,
                  moe_num_shared_experts=1, moe_num_experts_per_tok=2)
    return ModelConfig.from_dict({**fields, **overrides})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def join(rank: int, world: int, port: int):
    """This process in a gloo group of `world`, and its (dp_mod_ep 1, ep 2) mesh."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp_mod_ep", "ep"))
    return parallel.Distributed("ddp", rank, rank, world, torch.device("cpu"), rank, world, mesh,
                                ep_size=world, flat_dp_mesh=mesh["dp_mod_ep", "ep"]._flatten("dp"))


def two_process_worker(rank: int, world: int, port: int) -> None:
    # One pair of processes for every check: starting them costs more than the checks.
    env = join(rank, world, port)
    # GELU experts under DDP; SwiGLU experts (gate_proj too) under FSDP2
    for arch, backend in (("enoki", "ddp"), ("qwen3", "fsdp")):
        model_matches_one_process(dataclasses.replace(env, backend=backend), tiny_moe(arch))
    capacity_drops(env)
    dist.barrier()
    dist.destroy_process_group()
    # The groups live on in the meshes and sharded modules built here, so the interpreter's exit
    # would destroy them again, which now and then aborts inside gloo's threads (SIGABRT).
    # Every result is saved and every collective done: leave without that second teardown.
    os._exit(0)


@pytest.mark.slow
def test_expert_parallel_on_two_processes():
    mp.spawn(two_process_worker, args=(2, free_port()), nprocs=2)


def model_matches_one_process(env: parallel.Distributed, config: ModelConfig) -> None:
    """The model wrapped as training wraps it (experts split over `ep`, then DDP or FSDP2) gives
    each rank the outputs of one process, and after the training step's gradient sync the
    gradients of one process running both ranks' batches with their losses averaged."""
    rank, world = env.rank, env.world_size
    torch.manual_seed(0)
    reference = build_model(config)  # every expert, in one process
    settings = merge([{"model": {"moe": True},
                       "parallel": {"ep_size": world, "backend": env.backend}}])
    torch.manual_seed(0)
    model = wrap.parallelize(build_model(config), settings, env)
    core = wrap.unwrap(model)
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, VOCAB, (2, 12), generator=generator) for _ in range(world)]

    losses = [reference(batch, batch) for batch in batches]
    (sum(out.loss for out in losses) / world).backward()
    with wrap.gradient_sync(model, sync=True):
        out = model(batches[rank], batches[rank])
        out.loss.backward()
    torch.testing.assert_close(out.loss, losses[rank].loss, rtol=1e-6, atol=1e-6)
    assert out.moe["moe_dropped_fraction"] == 0  # dropless

    expected = dict(reference.named_parameters())
    sharded = 0
    for name, param in core.named_parameters():
        if wrap.is_expert_shard(param):
            sharded += 1
            assert param.to_local().shape[0] == expected[name].shape[0] // world
        grad = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad
        torch.testing.assert_close(grad, expected[name].grad, rtol=1e-5, atol=1e-6,
                                   msg=f"{env.backend} {name}")
    # up, down (and SwiGLU's gate) of each layer's routed experts; the shared expert stays whole
    assert sharded == len(core.expert_gradients.params) == config.n_layer * (
        3 if config.arch != "enoki" else 2)
    with torch.no_grad():
        torch.testing.assert_close(model(batches[rank]), reference(batches[rank]))


def capacity_drops(env: parallel.Distributed) -> None:
    """Drops match a hand count, directly and through the layer's routing."""
    rank, world = env.rank, env.world_size
    config = tiny_moe("enoki", n_layer=1, moe_num_experts=4, moe_num_shared_experts=0)
    torch.manual_seed(0)
    reference = build_model(config).blocks[0].mlp.experts
    torch.manual_seed(0)
    layer = build_model(config).blocks[0].mlp
    shard_experts(layer, env.mesh["ep"], capacity_factor=0.5)

    # Hand case. Rank 0 sends 6 rows (experts 0-1 on rank 0, 2-3 on rank 1), so its buffer per
    # destination is C = ⌊0.5·6/2⌋ + 1 = 2: of the 3 rows to each destination the one last in
    # token order is dropped (rows 0 and 3). Rank 1 sends 2 rows, C = ⌊0.5·2/2⌋ + 1 = 1, both to
    # rank 1: row 0 (later in token order) is dropped.
    counts, order, dropped_rows = [
        ([1, 2, 3, 0], [5, 0, 3, 4, 1, 2], [0, 3]),
        ([0, 0, 1, 1], [1, 0], [0]),
    ][rank]
    counts = torch.tensor(counts)
    x = torch.randn(int(counts.sum()), config.n_embd, generator=torch.Generator().manual_seed(rank))
    out, dropped = layer.dispatcher(x, counts, layer.experts, token_order=torch.tensor(order))
    assert dropped == len(dropped_rows)
    expected = reference(x, counts).detach()
    expected[dropped_rows] = 0
    torch.testing.assert_close(out, expected)

    # Through the layer: the drops follow the routing, counted per destination in token order.
    tokens = torch.randn(10, config.n_embd, generator=torch.Generator().manual_seed(2 + rank))
    layer(tokens)
    indices = layer.route(tokens)[2].flatten()  # token-major pairs
    capacity = int(0.5 * indices.numel() / world) + 1
    destinations = (indices // (4 // world)).tolist()
    by_hand = sum(max(0, destinations.count(d) - capacity) for d in range(world))
    assert layer.dropped == (by_hand, indices.numel())


# -- the command line --------------------------------------------------------------------------

RUN = ["--arch", "enoki", "--moe", "--iterations", "4", "checkpoint.latest_every=2",
       "--nproc", "2"]


@pytest.mark.slow
def test_training_with_ep_size_2_equals_ddp_and_resumes(tmp_path):
    reference, run_dir = tmp_path / "ddp", tmp_path / "ep"
    assert_ok(run_train(RUN, reference))
    assert_stopped_with_work_left(run_train([*RUN, "--ep_size", "2", "--iterations_to_run", "2"],
                                            run_dir))
    assert (run_dir / "checkpoints" / "latest-00000002" / "__1_0.distcp").exists()  # every rank
    assert_ok(run_train([*RUN, "--ep_size", "2"], run_dir))
    got, expected = compared(run_dir), compared(reference)
    assert [(step, key) for step, key, _ in got] == [(step, key) for step, key, _ in expected]
    for (step, key, value), (_, _, wanted) in zip(got, expected):
        assert value == pytest.approx(wanted, rel=1e-5), (step, key)
    assert all(m.get("moe_dropped_fraction", 0) == 0 for m in metrics(run_dir))
    # the per-expert statistics gather the sharded experts (and their τ) whole
    got, expected = ([(m["step"], m["experts"]) for m in metrics(run) if "experts" in m]
                     for run in (run_dir, reference))
    assert [step for step, _ in got] == [step for step, _ in expected] and got
    for (step, entry), (_, wanted) in zip(got, expected):
        assert entry.keys() == wanted.keys() and entry["routed_share"] == wanted["routed_share"]
        for key in entry.keys() - {"steps", "routed_share"}:
            assert torch.tensor(entry[key]).flatten().tolist() == pytest.approx(
                torch.tensor(wanted[key]).flatten().tolist(), rel=1e-5, abs=1e-7), (step, key)


@pytest.mark.parametrize(
    "layer, fragment",
    [
        ({"parallel": {"ep_size": 2}}, "add --moe"),
        ({"model": {"moe": True, "moe_num_experts": 6}, "parallel": {"ep_size": 4}},
         "does not divide the 6 routed experts"),
        ({"model": {"moe": True}, "parallel": {"ep_size": 2, "backend": "hsdp"}},
         "does not compose with HSDP"),
        ({"model": {"moe": True}, "parallel": {"ep_size": 2, "tp_size": 2, "backend": "fsdp"}},
         "tensor parallelism with MoE"),
        ({"model": {"moe": True, "moe_expert_capacity_factor": 1.5}},
         "caps the buffers of expert parallelism, which is off; add --ep_size"),
    ],
)
def test_ep_size_refusals_are_one_sentence(layer, fragment):
    with pytest.raises(UserError, match=fragment):
        merge([layer])


def test_ep_size_must_divide_the_data_parallel_ranks():
    config = merge([{"model": {"moe": True}, "parallel": {"ep_size": 4}}])
    with pytest.raises(UserError, match="does not divide the 2 data-parallel ranks"):
        batch_layout(config, world_size=2)
    assert batch_layout(config, world_size=8).data_parallel_size == 8
