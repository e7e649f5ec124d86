"""One run of a job that `danastar submit` or `danastar sweep` launches: its arguments checked
as `danastar train` will check them (config, batch layout, plan, and the resume of the run its
directory holds), the cluster profile's micro-batch cap and a sweep point's LR multiplier applied,
and the plan it was checked against recorded in `<run_dir>/slurm/`."""

from __future__ import annotations

import json
from pathlib import Path

from danastar.config import TrainConfig, batch_layout, load_config, save_yaml
from danastar.launch import clusters as cluster_registry
from danastar.launch.sweep_spec import format_value
from danastar.rundir.files import CONFIG_FILE, PLAN_FILE, SUBMISSION_DIR
from danastar.train.identity import planned_run_dir
from danastar.train.plan import check_resume, dry_run


def finish_run(train_argv: list[str], run_dir: Path, world: int, profile,
               lr_multiplier: float | None, write: bool = True) -> list[str]:
    """Validate one run's arguments as training will (config, batch layout, plan), apply the
    profile's micro-batch cap and an LR multiplier, record the plan; returns the final
    arguments (what the script shows and the config records)."""
    train_argv, extra, plan, config = validated_run(train_argv, world, profile, lr_multiplier,
                                                    run_dir)
    if write:
        record_plan(run_dir, plan, config)
    return [*train_argv, *extra]


def checked_run(train_argv: list[str], run_dir: Path | None, world: int, profile,
                lr_multiplier: float | None, base: Path | None = None
                ) -> tuple[Path, list[str], dict, TrainConfig]:
    """(run directory, final arguments, plan, config) of one run of the job, validated as
    `finish_run` does, and refused as `danastar train` would refuse to resume the run that
    `run_dir` holds (the same sentence); writes nothing. `run_dir` None: the automatic
    directory next to `base`, as `danastar train` chooses it."""
    train_argv, extra, plan, config = validated_run(train_argv, world, profile, lr_multiplier,
                                                    run_dir)
    if run_dir is None:
        chosen = planned_run_dir(config, world, base)
        run_dir = chosen.path
        plan.update(run_dir=str(run_dir), run_dir_note=chosen.note)
    check_resume(config, run_dir, world)
    return run_dir, [*train_argv, *extra], plan, config


def validated_run(train_argv: list[str], world: int, profile, lr_multiplier: float | None,
                  run_dir: Path | None = None):
    """(arguments without --run_dir, arguments the job adds, plan, config) of one run, to go
    to `run_dir` (None: not chosen yet)."""
    train_argv = without_run_dir(train_argv)  # the script gives every run its own, absolute
    config, _ = load_config(train_argv)
    extra = []
    caps = profile.micro_batch_caps if profile else {}
    cap = caps.get(config.model.heads) if caps else None
    if cap:
        batch, acc = cluster_registry.fit_micro_batch(
            config.train.batch_size, config.train.acc_steps, world, cap,
            f"{profile.name}'s {profile.gpu_type or 'GPU'} cap of {cap} sequences per GPU")
        if (batch, acc) != (config.train.batch_size, config.train.acc_steps):
            extra = ["--batch_size", str(batch), "--acc_steps", str(acc)]
            config, _ = load_config([*train_argv, *extra])
    batch_layout(config, world)  # refuse a layout the world cannot split, before submitting
    plan = dry_run(config, world_size=world, run_dir=run_dir)
    if lr_multiplier is not None:
        lr = plan["plan"]["lr"] * lr_multiplier
        extra += [f"optim.lr={format_value(float(lr))}"]
        config, _ = load_config([*train_argv, *extra])
        plan = dry_run(config, world_size=world, run_dir=run_dir)
    return train_argv, extra, plan, config


def record_plan(run_dir: Path, plan: dict, config) -> None:
    """The plan and configuration a job was checked against, in `<run_dir>/slurm/`."""
    (run_dir / SUBMISSION_DIR).mkdir(parents=True, exist_ok=True)
    (run_dir / SUBMISSION_DIR / PLAN_FILE).write_text(json.dumps(plan, indent=1, default=str))
    save_yaml(config, run_dir / SUBMISSION_DIR / CONFIG_FILE)


def without_run_dir(argv: list[str]) -> list[str]:
    result, arguments = [], iter(argv)
    for argument in arguments:
        if argument == "--run_dir":
            next(arguments, None)
        elif not argument.startswith(("--run_dir=", "logging.run_dir=")):
            result.append(argument)
    return result
