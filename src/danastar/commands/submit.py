"""`danastar submit`: train on a SLURM cluster as a job that survives time limits and preemption.

    danastar submit --heads 12 --distributed_backend fsdp --cluster tamia --nodes 4 \\
        --gpus_per_node 4 --time 24:00:00
    danastar submit --heads 6 --cluster auto --gpus_per_node 4 --dry_run
    danastar submit --array sweeps/lr.yaml --cluster tamia --gpus_per_node 1 --time 3:00:00

Every `danastar train` flag is accepted and passed on. The run directory gets the job script
`slurm/submit.sbatch` (readable; edit it and `sbatch` it again at will), the plan it was checked
against, and `logs/`. See docs/clusters.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from danastar.config import default_run_dir, epochs_text, load_config
from danastar.durable import check_output
from danastar.errors import UserError
from danastar.launch import clusters as cluster_registry
from danastar.launch import slurm
from danastar.launch.jobs import checked_run, record_plan
from danastar.launch.sweep_spec import load_sweep
from danastar.train.plan import planned_warning


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="danastar submit",
        description="Submit training as a SLURM job that requeues itself until the run is "
        "complete. Every `danastar train` flag is accepted as well.",
        epilog="See docs/clusters.md for cluster profiles, exit codes and how to follow a run.",
        allow_abbrev=False,  # the rest are train flags: never read one as an abbreviation here
    )
    add = parser.add_argument
    add("--cluster", help="a profile name from the cluster registry, or auto (the first in "
        "priority order with room); without it: this machine's SLURM, no profile")
    add("--clusters", help="the cluster registry (default $DANASTAR_CLUSTERS or "
        "~/.config/danastar/clusters.yaml)")
    add("--nodes", type=int, default=1, help="nodes (default 1)")
    add("--gpus_per_node", type=int, default=None,
        help="GPUs per node, one training process each (default: the profile's; 0 for CPU)")
    add("--tasks_per_node", type=int, default=None,
        help="processes per node when no GPUs are asked for (default 1)")
    add("--cpus_per_task", type=int, default=None, help="CPUs per process")
    add("--mem", help="memory per node, as sbatch --mem takes it")
    add("--time", help="time limit of each segment, e.g. 24:00:00 (default: the profile's)")
    add("--partition")
    add("--account")
    add("--qos")
    add("--signal_lead", type=int, default=None,
        help="seconds before the time limit at which the run checkpoints (default 300)")
    add("--max_restarts", type=int, default=None, help="segments allowed (default 100)")
    add("--chain", choices=slurm.CHAINS, default="requeue",
        help="continue with scontrol requeue (same job id; default) or a pre-submitted "
        "successor job (also survives a hard time-limit kill)")
    add("--launcher", choices=slurm.LAUNCHERS, default="srun",
        help="srun: one task per GPU, ranks from SLURM (default); torchrun: one task per node")
    add("--array", metavar="SWEEP.yaml", help="a sweep file: one job array, task i trains run i")
    add("--runs_root", default=None, help="where run directories go when no --run_dir is given "
        "(default: the profile's results_dir, else runs)")
    add("--dry_run", action="store_true", help="print the script and the cluster choice; submit "
        "nothing")
    return parser


def main(argv: list[str]) -> int:
    args, train_argv = build_parser().parse_known_args(argv)
    if any(a == "--nproc" or a.startswith(("--nproc=", "parallel.nproc=")) for a in train_argv):
        raise UserError("danastar submit starts one process per GPU through SLURM; use "
                        "--gpus_per_node (or --tasks_per_node) instead of --nproc.")
    if any(a in ("--no_auto_resume", "checkpoint.auto_resume=false",
                 "checkpoint.auto_resume=False") for a in train_argv):
        # The job runs the same command in every segment: each requeue would move the run
        # before it aside and start again from step 0.
        raise UserError("--no_auto_resume would make every requeued segment of the job start "
                        "again from step 0; to start afresh, give another --run_dir (or move the "
                        "old run directory away) and submit without it.")
    slurm.check_request(args)  # the job's own values as SLURM reads them, before any work
    if args.runs_root:
        check_output(Path(args.runs_root).expanduser(), "--runs_root", folder=True)
    profile, choice = choose_profile(args)
    job, checked = plan_job(args, train_argv, profile)
    plans = [plan for _run_dir, _argv, plan, _config in checked]
    slurm.check_signal_lead(job.time, job.signal_lead)
    script = slurm.render_script(job)
    said = plan_lines(plans)
    if args.dry_run:
        print(f"# cluster: {choice}")
        for line in said:
            print(f"# {line}")
        print(script)
        return 0
    for line in said[1:]:  # the warning, before the job is queued
        print(line, file=sys.stderr)
    written = write_job(job, checked, script)
    try:
        job_id = slurm.submit(job.script_path, run=profile.run if profile else None)
    except UserError:
        # Not queued: a run directory holding only these files would read as a run.
        written.undo()
        raise
    log_name = f"{job.name}-{job_id}_<task>.out" if job.is_array else f"{job.name}-{job_id}.out"
    record = {"job_id": job_id, "cluster": profile.name if profile else "",
              "script": str(job.script_path), "runs": [str(d) for d, _ in job.runs]}
    with open(job.script_path.parent / "submissions.jsonl", "a") as handle:
        handle.write(json.dumps(record) + "\n")
    print(f"submitted job {job_id}{f' to {profile.name}' if profile else ''}")
    print(f"script: {job.script_path}")
    print(f"log:    {job.log_dir / log_name}")
    if not job.is_array:
        print(f"status: {job.runs[0][0] / 'status.json'}")
    print(said[0])
    return 0


def choose_profile(args) -> tuple[cluster_registry.ClusterProfile | None, str]:
    """The cluster profile to use and a line saying why."""
    if not args.cluster:
        return None, "this machine's SLURM (no profile)"
    registry = cluster_registry.load_registry(args.clusters)
    if args.cluster != "auto":
        profile = registry.get(args.cluster)
        if not profile.enabled:
            raise UserError(f"cluster {profile.name} is disabled in {registry.source}; enable it "
                            f"or choose another.")
        return profile, f"{profile.name} (asked for)"
    nodes = args.nodes
    gpus = args.gpus_per_node
    return cluster_registry.choose_cluster(registry, nodes, gpus)


def plan_job(args, train_argv: list[str], profile) -> tuple[slurm.Job, list[tuple]]:
    """Check every run of the job as `danastar train` would, and describe the job; with each
    run's (run directory, arguments, plan, config), the plan being what `danastar train
    --dry_run --json` prints. Writes nothing."""
    gpus = args.gpus_per_node if args.gpus_per_node is not None else (
        profile.gpus_per_node if profile else 0)
    tasks = gpus or args.tasks_per_node or 1
    world = args.nodes * tasks
    if args.nodes < 1 or tasks < 1:
        raise UserError("--nodes and --tasks_per_node must be at least 1.")
    if gpus and args.tasks_per_node not in (None, gpus):
        source = "--gpus_per_node" if args.gpus_per_node is not None else \
            f"cluster {profile.name}'s gpus_per_node"
        raise UserError(f"--tasks_per_node {args.tasks_per_node} is for a job without GPUs; "
                        f"with GPUs ({source} {gpus}) each node runs one process per GPU, so "
                        f"remove --tasks_per_node (or ask for --gpus_per_node 0).")
    if profile and profile.max_nodes and args.nodes > profile.max_nodes:
        raise UserError(f"cluster {profile.name} allows at most {profile.max_nodes} nodes; ask "
                        f"for fewer --nodes or another cluster.")

    if args.array:
        sweep = load_sweep(args.array)
        root = runs_root(args, profile) / sweep.name
        checked = [checked_run([*train_argv, *point.train_argv()], root / point.name, world,
                               profile, point.lr_multiplier) for point in sweep.points()]
        name, home = sweep.name, root
    else:
        config, _ = load_config(train_argv)
        # --run_dir as given, else the automatic directory there (as `danastar train` chooses
        # it: its own beside the default name when that holds another run)
        run_dir = Path(config.logging.run_dir).expanduser().resolve() if config.logging.run_dir \
            else None
        checked = [checked_run(train_argv, run_dir, world, profile, None,
                               base=runs_root(args, profile) / default_run_dir(config).name)]
        name, home = checked[0][0].name, checked[0][0]
    # Every run is checked (its resume too) before any run directory is written.
    runs = [(run_dir, point_argv) for run_dir, point_argv, _plan, _config in checked]

    def setting(flag_value, profile_field, default):
        if flag_value not in (None, ""):
            return flag_value
        return getattr(profile, profile_field) if profile and getattr(profile, profile_field) \
            else default

    cpus = args.cpus_per_task or (profile.cpus_per_gpu if profile and gpus else 0)
    job = slurm.Job(
        name=name[:120], runs=runs, script_path=home / "slurm" / slurm.SCRIPT_NAME,
        log_dir=home / "logs", workdir=Path.cwd(),
        python="python" if profile and profile.setup else sys.executable,
        nodes=args.nodes, tasks_per_node=tasks, gpus_per_node=gpus, cpus_per_task=cpus,
        mem=setting(args.mem, "mem", ""), time=setting(args.time, "max_time", ""),
        partition=setting(args.partition, "partition", ""),
        account=setting(args.account, "account", ""), qos=setting(args.qos, "qos", ""),
        signal_lead=setting(args.signal_lead, "signal_lead", 300),
        max_restarts=setting(args.max_restarts, "max_restarts", 100),
        chain=args.chain, launcher=args.launcher,
        setup=setup_lines(profile),
        sbatch_extra=list(profile.sbatch_extra) if profile else [],
        cluster=profile.name if profile else "",
    )
    return job, checked


class Written:
    """What a submission writes, so that it can be taken back when sbatch does not queue the job:
    each file put back as it was (or removed), each folder it created removed."""

    def __init__(self) -> None:
        self.files: dict[Path, bytes | None] = {}
        self.folders: list[Path] = []

    def folder(self, path: Path) -> None:
        created = [p for p in (path, *path.parents) if not p.exists()]
        path.mkdir(parents=True, exist_ok=True)
        self.folders += reversed(created)  # outermost first

    def keep(self, path: Path) -> None:
        """Remember ``path`` as it is, before it is written."""
        self.folder(path.parent)
        if path not in self.files:
            self.files[path] = path.read_bytes() if path.is_file() else None

    def undo(self) -> None:
        for path, before in self.files.items():
            if before is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(before)
        for folder in reversed(self.folders):
            try:
                folder.rmdir()
            except OSError:  # something else put a file there meanwhile: leave it
                pass


def write_job(job: slurm.Job, checked: list[tuple], script: str) -> Written:
    """The files of the job: each run's plan and config in `<run_dir>/slurm/`, the log folder
    and the script."""
    written = Written()
    try:
        for run_dir, _argv, plan, config in checked:
            for name in ("plan.json", "config.yaml"):
                written.keep(run_dir / "slurm" / name)
            record_plan(run_dir, plan, config)
        written.folder(job.log_dir)
        written.keep(job.script_path)
        job.script_path.write_text(script)
        job.script_path.chmod(0o755)
    except BaseException:
        written.undo()
        raise
    return written


def plan_lines(plans: list[dict]) -> list[str]:
    """What the job trains, in one line with the epochs over its corpus, and the warning of a
    run that reads its corpus more than a few times (the one that reads it most)."""
    first = plans[0]
    if len(plans) == 1:
        plan = first["plan"]
        line = (f"plan: {plan['arch']} with {plan['exact_total_params'] / 1e6:.3g}M parameters, "
                f"{plan['opt']}, {plan['iterations']:,} steps of {plan['tokens_per_step']:,} "
                f"tokens: "
                f"{epochs_text(plan['tokens'], first['corpus']['train_tokens'], first['dataset'])}")
    else:
        epochs = [planned["corpus"]["epochs"] for planned in plans]
        datasets = {planned["dataset"] for planned in plans}
        data = first["dataset"] if len(datasets) == 1 else "their corpora"
        known = [value for value in epochs if value is not None]
        line = (f"plan: {len(plans)} runs of {min(known):.3g} to {max(known):.3g} epochs of {data}"
                if len(known) == len(epochs) else f"plan: {len(plans)} runs; epochs not known "
                f"until {data} is prepared")
    warned = [(planned["corpus"]["epochs"], warning) for planned in plans
              if (warning := planned_warning(planned))]
    if not warned:
        return [line]
    warning = max(warned)[1]
    if len(plans) > 1:
        warning = warning.replace("warning: this run", f"warning: {len(warned)} of {len(plans)} "
                                  f"runs read their corpus more than a few times; the longest", 1)
    return [line, warning]


def runs_root(args, profile) -> Path:
    """Where run directories go: --runs_root, else the profile's results_dir, else ./runs."""
    root = args.runs_root or (profile.results_dir if profile and profile.results_dir else "runs")
    return Path(root).expanduser().resolve()


def setup_lines(profile) -> list[str]:
    """The profile's setup lines, and its scratch as the node-local staging disk for
    checkpoints (what $SLURM_TMPDIR is where the cluster provides it)."""
    if profile is None:
        return []
    lines = list(profile.setup)
    if profile.scratch and profile.scratch.strip() not in ("$SLURM_TMPDIR", "${SLURM_TMPDIR}"):
        lines.append(f"export SLURM_TMPDIR={profile.scratch}  # the profile's scratch")
    return lines
