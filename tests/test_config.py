import pytest

from danastar.config import TrainConfig, all_keys, batch_layout, load_config, merge
from danastar.errors import UserError


def write(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return str(path)


def test_no_arguments_is_the_cpu_preset():
    config, _ = load_config([])
    assert (config.model.arch, config.optim.name, config.data.dataset) == (
        "enoki",
        "adana",
        "shakespeare",
    )
    assert config.train.sequence_length < 2048  # the preset, not the paper's launcher defaults


def test_heads_alone_sizes_the_cpu_preset_and_with_a_dataset_plans_the_papers_run():
    smaller, _ = load_config(["--heads", "2"])
    assert (smaller.model.heads, smaller.train.iterations, smaller.train.sequence_length,
            smaller.data.dataset) == (2, 300, 128, "shakespeare")
    for argv in (["--heads", "12", "--dataset", "fineweb"],
                 ["model.heads=12", "data.dataset=shakespeare"]):
        paper, _ = load_config(argv)
        assert (paper.train.iterations, paper.train.sequence_length) == (None, 2048), argv
    preset, _ = load_config(["--dataset", "synthetic"])
    assert preset.train.iterations == 300


def test_merge_order_defaults_yaml_flags_dotted(tmp_path):
    path = write(
        tmp_path, "train:\n  seed: 5\n  batch_size: 8\n  eval_interval: 7\noptim:\n  name: adamw\n"
    )
    config, _ = load_config(["--config", path, "--seed", "6", "--batch_size", "4", "train.seed=9"])
    assert config.optim.name == "adamw"  # YAML over defaults
    assert config.train.eval_interval == 7  # YAML over defaults
    assert config.train.batch_size == 4  # flag over YAML
    assert config.train.seed == 9  # dotted override over flag
    assert config.train.sequence_length == TrainConfig().train.sequence_length  # untouched default


def test_original_release_flags_map_to_their_keys():
    config, args = load_config(
        [
            "--arch",
            "qwen3",
            "--opt",
            "dana-star-mk4",
            "--heads",
            "6",
            "--lr",
            "1e-3",
            "--iterations",
            "10",
            "--acc_steps",
            "3",
            "--sequence_length",
            "64",
            "--kappa",
            "0.75",
            "--delta",
            "6",
            "--omega",
            "2",
            "--clipsnr",
            "1.5",
            "--nproc",
            "4",
            "--distributed_backend",
            "fsdp",
            "--no_wandb",
            "--warmup_steps",
            "2",
            "--scheduler",
            "wsd",
            "--grad_clip",
            "1.0",
            "--no_auto_resume",
            "--iterations_to_run",
            "5",
            "--eval_interval",
            "3",
            "--log_interval",
            "2",
            "--dataset",
            "fineweb",
            "--run_dir",
            "x",
            "--dry_run",
        ]
    )
    assert (config.model.arch, config.model.heads, config.optim.name) == (
        "qwen3",
        6,
        "dana-star-mk4",
    )
    assert (config.optim.lr, config.optim.kappa, config.optim.delta, config.optim.omega) == (
        1e-3,
        0.75,
        6.0,
        2.0,
    )
    assert (config.optim.clipsnr, config.optim.warmup_steps, config.optim.scheduler) == (
        1.5,
        2,
        "wsd",
    )
    assert config.optim.grad_clip == 1.0
    assert (config.train.iterations, config.train.acc_steps, config.train.sequence_length) == (
        10,
        3,
        64,
    )
    assert (
        config.train.iterations_to_run,
        config.train.eval_interval,
        config.train.log_interval,
    ) == (5, 3, 2)
    assert (config.parallel.nproc, config.parallel.backend) == (4, "fsdp")
    assert config.logging.wandb is False and config.checkpoint.auto_resume is False
    assert (config.data.dataset, config.logging.run_dir, args.dry_run) == ("fineweb", "x", True)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["train.iteratons=3"], "did you mean 'train.iterations'"),
        (["optim.kapa=0.8"], "did you mean 'optim.kappa'"),
        (["modle.arch=enoki"], "did you mean 'model'"),
        (["--arch", "enok"], "did you mean 'enoki'"),
        (["train.batch_size=many"], "train.batch_size takes a whole number"),
        (["train.seed"], "section.key=value"),
        (["--distributed_backend", "fsdpp"], "did you mean 'fsdp'"),
        (["--config", "no_such_preset"], "does not exist"),
    ],
)
def test_mistakes_are_one_sentence_user_errors(argv, fragment):
    with pytest.raises(UserError, match=fragment.replace("(", r"\(")):
        load_config(argv)


def test_unknown_key_in_yaml_is_reported(tmp_path):
    with pytest.raises(UserError, match="did you mean 'train.eval_interval'"):
        load_config(["--config", write(tmp_path, "train:\n  eval_intervall: 3\n")])


def test_every_key_can_be_overridden_by_dotted_path():
    keys = all_keys()
    assert "checkpoint.latest_every" in keys and "parallel.tp_size" in keys
    config = merge(
        [{"checkpoint": {"latest_every": -1}, "parallel": {"tp_size": 2, "backend": "fsdp"}}]
    )
    assert config.checkpoint.latest_every == -1 and config.parallel.tp_size == 2


def test_batch_layout_splits_the_global_batch():
    config = merge([{"train": {"batch_size": 8, "acc_steps": 3, "sequence_length": 16}}])
    layout = batch_layout(config, world_size=4)
    assert (layout.global_batch, layout.micro_batch_per_rank, layout.data_parallel_size) == (
        24,
        2,
        4,
    )
    assert layout.tokens_per_step == 24 * 16
    tp = merge([{"train": {"batch_size": 8}, "parallel": {"tp_size": 2, "backend": "fsdp"}}])
    assert batch_layout(tp, world_size=4).micro_batch_per_rank == 4  # 2 data-parallel ranks


@pytest.mark.parametrize(
    "layer, world, fragment",
    [
        ({"train": {"batch_size": 6}}, 4, "does not split over 4 data-parallel ranks"),
        ({"parallel": {"tp_size": 3, "backend": "fsdp"}}, 4, "tp_size 3 does not divide"),
        (
            {"parallel": {"hsdp_replicas": 3, "backend": "hsdp"}},
            4,
            "hsdp_replicas 3 does not divide",
        ),
    ],
)
def test_impossible_batch_layouts_fail_clearly(layer, world, fragment):
    with pytest.raises(UserError, match=fragment):
        batch_layout(merge([layer]), world)


@pytest.mark.parametrize(
    "layer, fragment",
    [
        ({"train": {"acc_steps": 0}}, r"train.acc_steps \(--acc_steps\) must be at least 1"),
        ({"parallel": {"tp_size": 2}}, "composes with FSDP2"),
        ({"checkpoint": {"latest_every": 0}}, "-1 to disable"),
    ],
)
def test_impossible_values_fail_clearly(layer, fragment):
    with pytest.raises(UserError, match=fragment):
        merge([layer])


def test_heads_without_config_plans_from_the_launcher_defaults():
    config, _ = load_config(["--heads", "12", "--dataset", "fineweb"])
    defaults = TrainConfig()
    assert config.train.iterations is None  # the Chinchilla budget of the scaling plan
    assert (config.train.batch_size, config.train.sequence_length) == (32, 2048)
    assert (config.optim.grad_clip, config.optim.scheduler, config.train.eval_interval) == (
        0.5,
        "cos_inf",
        115,
    )
    assert config.optim == defaults.optim


def test_unknown_schedule_is_caught_before_training():
    with pytest.raises(UserError, match="optim.scheduler 'cosine' is not known; did you mean 'cos"):
        load_config(["--scheduler", "cosine"])


def test_each_config_is_merged_over_defaults_no_earlier_one_changed():
    """The defaults are built once (a sweep reads three configs per run): merging never writes
    into them."""
    first, _ = load_config(["--heads", "2", "--opt", "adamw", "train.iterations=7",
                            "optim.lr=1e-3"])
    second, _ = load_config([])
    assert (first.model.heads, first.optim.name, first.train.iterations) == (2, "adamw", 7)
    assert (second.model.heads, second.optim.name, second.train.iterations) == (3, "adana", 300)
    assert second.optim.lr is None


def test_extend_alone_takes_the_measured_best_rule_wherever_it_stands():
    assert load_config(["--extend"])[0].optim.extend == "rewarm"
    assert load_config(["train.seed=3", "--extend"])[0].optim.extend == "rewarm"
    assert load_config(["--extend", "--seed", "3"])[0].optim.extend == "rewarm"
    config = load_config(["--extend", "train.seed=3"])[0]  # the override stays an override
    assert (config.optim.extend, config.train.seed) == ("rewarm", 3)
    assert load_config(["--extend", "stretch"])[0].optim.extend == "stretch"
    with pytest.raises(UserError, match="optim.extend 'strech' is not known; did you mean "
                                        "'stretch'"):
        load_config(["--extend", "strech"])
