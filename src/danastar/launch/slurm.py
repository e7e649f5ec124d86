"""SLURM job scripts that survive time limits and preemption: render, submit, and the helper the
script calls at the end of each segment.

The script (`<run_dir>/slurm/submit.sbatch`, plain and commented so that a user can read, edit
and `sbatch` it again) asks SLURM for `--requeue --open-mode=append --signal=B:USR1@<lead>`,
starts training in the background and waits for it in a loop (bash runs a trap only between
commands, or when a `wait` is interrupted). Its USR1 trap creates the run's stop file instead of
signalling the workers; they checkpoint after their step and exit 75. The exit code decides what
follows: 0 the run is complete; 75 a checkpoint was saved and work remains, so the script requeues
its own job (`scontrol requeue $SLURM_JOB_ID`: the same job id, `SLURM_RESTART_COUNT` counts the
segments) or, with `--chain dependency`, lets the successor it submitted at its start continue;
anything else is a failure and stops the chain. SIGTERM (`scancel`, `scontrol requeue`,
preemption) reaches the workers from SLURM itself; the script then leaves the decision to SLURM.
"""

from __future__ import annotations

import argparse
import re
import shlex
import string
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from danastar.errors import UserError
from danastar.rundir.exits import COMPLETE_EXIT_CODE, PREEMPTED_EXIT_CODE
from danastar.rundir.files import STOP_FILE
from danastar.rundir.status import read_status, write_status

SCRIPT_NAME = "submit.sbatch"
LAUNCHERS = ("srun", "torchrun")
CHAINS = ("requeue", "dependency")


@dataclass
class Job:
    """Everything a job script says. One run, or an array of runs (one per task)."""

    name: str
    runs: list[tuple[Path, list[str]]]  # (run directory, `danastar train` arguments) per task
    script_path: Path
    log_dir: Path
    workdir: Path
    python: str = sys.executable  # "python" when the profile's setup lines provide one
    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 0
    mem: str = ""
    time: str = ""
    partition: str = ""
    account: str = ""
    qos: str = ""
    signal_lead: int = 300
    max_restarts: int = 100
    chain: str = "requeue"
    launcher: str = "srun"
    setup: list[str] = field(default_factory=list)
    sbatch_extra: list[str] = field(default_factory=list)
    cluster: str = ""

    @property
    def is_array(self) -> bool:
        return len(self.runs) > 1


def sbatch_lines(job: Job) -> list[str]:
    log_name = "%x-%A_%a.out" if job.is_array else "%x-%j.out"
    lines = [
        f"#SBATCH --job-name={job.name}",
        f"#SBATCH --output={job.log_dir / log_name}",
        "#SBATCH --open-mode=append      # a requeued segment appends to the same log",
        "#SBATCH --requeue",
        f"#SBATCH --signal=B:USR1@{job.signal_lead}   # to this script, {job.signal_lead} s before "
        "the time limit",
        f"#SBATCH --nodes={job.nodes}",
        f"#SBATCH --ntasks-per-node={job.tasks_per_node}",
    ]
    if job.is_array:
        lines.append(f"#SBATCH --array=0-{len(job.runs) - 1}")
    if job.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
    for flag, value in (("cpus-per-task", job.cpus_per_task), ("mem", job.mem),
                        ("time", job.time), ("partition", job.partition),
                        ("account", job.account), ("qos", job.qos)):
        if value not in ("", 0, None):
            lines.append(f"#SBATCH --{flag}={value}")
    lines += [f"#SBATCH {extra}" for extra in job.sbatch_extra]
    return lines


def launch_command(job: Job) -> str:
    """The command that starts every worker of a segment."""
    train = '"$PYTHON" -m danastar train "${TRAIN_ARGS[@]}" --run_dir "$RUN_DIR"'
    if job.launcher == "srun":
        # One task per GPU (or per --tasks_per_node); each finds its rank from SLURM's variables.
        return f"srun --kill-on-bad-exit=1 {train}"
    # One task per node running torchrun; c10d rendezvous on the head node, keyed by the job id
    # (its port too, so that two jobs sharing a head node do not collide).
    return (
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        f'srun --ntasks-per-node=1 --kill-on-bad-exit=1 "$PYTHON" -m torch.distributed.run '
        f'--nnodes="$SLURM_NNODES" --nproc_per_node={job.tasks_per_node} '
        '--rdzv_backend=c10d --rdzv_endpoint="$HEAD_NODE:$((20000 + SLURM_JOB_ID % 20000))" '
        '--rdzv_id="$SLURM_JOB_ID" '
        '-m danastar train "${TRAIN_ARGS[@]}" --run_dir "$RUN_DIR"'
    )


def run_selection(job: Job) -> list[str]:
    """Shell lines setting RUN_DIR and TRAIN_ARGS (per array task for an array)."""
    def assign(run_dir: Path, argv: list[str], indent: str) -> list[str]:
        return [f"{indent}RUN_DIR={shlex.quote(str(run_dir))}",
                f"{indent}TRAIN_ARGS=({shlex.join(argv)})"]

    if not job.is_array:
        return assign(*job.runs[0], "")
    lines = ['case "${SLURM_ARRAY_TASK_ID:?this script is a job array: submit it with sbatch}" in']
    for index, (run_dir, argv) in enumerate(job.runs):
        lines += [f"  {index})", *assign(run_dir, argv, "    "), "    ;;"]
    lines += ['  *) echo "danastar: no run for array task $SLURM_ARRAY_TASK_ID" >&2; exit 1 ;;',
              "esac"]
    return lines


class ScriptTemplate(string.Template):
    """The job script's holes are `{{name}}` (`$` and `@` are bash's own); any other `{{` is an
    error, so that a misspelt hole cannot reach a script."""

    pattern = r"""\{\{(?:(?P<named>[a-z_]+)\}\}|(?P<braced>(?!))|(?P<escaped>(?!))|(?P<invalid>))"""


# The script's fixed text, with a hole for each part that depends on the job.
JOB_TEMPLATE = resources.files("danastar.launch") / "templates" / "job.sbatch"


def render_script(job: Job) -> str:
    """The job script: SBATCH header, setup, the segment, and what its exit code means."""
    if job.chain not in CHAINS:
        raise UserError(f"--chain {job.chain!r} is not known; use requeue or dependency.")
    if job.launcher not in LAUNCHERS:
        raise UserError(f"--launcher {job.launcher!r} is not known; use srun or torchrun.")
    created = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    what = (f"a job array of {len(job.runs)} runs" if job.is_array
            else f"the run in {job.runs[0][0]}")
    successor = ""
    if job.chain == "dependency":
        array = ' --array="$SLURM_ARRAY_TASK_ID"' if job.is_array else ""
        successor = f"""
# --chain dependency: submit the successor now, so that the run continues even if this segment
# is killed at its time limit; it starts after this job ends, whatever its state.
SUCCESSOR=$(sbatch --parsable --dependency=afterany:"$SLURM_JOB_ID" \\
    --export=ALL,DANASTAR_SEGMENT=$((SEGMENT + 1)){array} {shlex.quote(str(job.script_path))})
echo "danastar: successor job $SUCCESSOR submitted"
"""
    if job.chain == "requeue":
        continue_chain = """    echo "danastar: requeueing job $SLURM_JOB_ID for the next segment"
    scontrol requeue "$SLURM_JOB_ID" \\
      || echo "danastar: scontrol requeue failed (fine if SLURM requeued the job already)\""""
    else:
        continue_chain = ('    echo "danastar: successor job $SUCCESSOR continues the run"\n'
                          "    CODE=0  # this segment did its part: COMPLETED, not FAILED")
    then = ("requeues itself under the same job id" if job.chain == "requeue"
            else "ends and its pre-submitted successor continues")
    cancel_successor = '  scancel "$SUCCESSOR"\n' if job.chain == "dependency" else ""
    setup = "\n".join(job.setup) if job.setup else "# (no setup lines in the cluster profile)"
    return ScriptTemplate(JOB_TEMPLATE.read_text()).substitute(
        what=what + (f" on cluster {job.cluster}" if job.cluster else ""),
        created=created,
        script_path=job.script_path,
        then=then,
        sbatch_lines="\n".join(sbatch_lines(job)),
        workdir=shlex.quote(str(job.workdir)),
        max_restarts=job.max_restarts,
        run_selection="\n".join(run_selection(job)),
        setup=setup,
        python=shlex.quote(job.python),
        successor=successor,
        stop_file=STOP_FILE,
        launch_command=launch_command(job),
        preempted=PREEMPTED_EXIT_CODE,
        continue_chain=continue_chain,
        cancel_successor=cancel_successor,
    )


# sbatch --time, as SLURM's own parser reads it (src/common/parse_time.c, time_str2secs)
TIME_FORMATS = ("minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes "
                "or days-hours:minutes:seconds (e.g. 90, 4:00:00 or 1-12:00), or 0 or infinite "
                "for no limit")
_DAYS_TIME = re.compile(r"([0-9]+)-(?:([0-9]+)(?::([0-9]+)(?::([0-9]+))?)?)?")
_CLOCK_TIME = re.compile(r"([0-9]+)(?::([0-9]+)(?::([0-9]+))?)?")
NO_TIME_LIMIT = ("-1", "infinite", "unlimited")
# sbatch --mem: a whole number of megabytes, or with a unit K, M, G, T (a B may follow)
MEMORY = re.compile(r"[0-9]+(?:[KMGT]B?)?", re.IGNORECASE)


def time_limit_seconds(text: str, what: str = "--time") -> int | None:
    """Seconds of a SLURM time limit as sbatch reads it: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`,
    `D-H:M:S` (and `D-`, which sbatch takes for whole days); None for no limit (empty: not
    given; `0`, `-1`, `infinite`, `unlimited`). UserError naming ``what`` for anything else
    (`24h`, `1:2:3:4`)."""
    text = str(text).strip()
    if not text or text.lower() in NO_TIME_LIMIT:
        return None
    days = _DAYS_TIME.fullmatch(text)
    clock = _CLOCK_TIME.fullmatch(text)
    if days:
        day, hours, minutes, seconds = (int(group or 0) for group in days.groups())
    elif clock:
        numbers = [int(group) for group in clock.groups() if group is not None]
        day, (hours, minutes, seconds) = 0, (numbers if len(numbers) == 3
                                             else [0, *numbers, 0][:3])
    else:
        raise UserError(f"{what} {text!r} is not a SLURM time limit; write it as {TIME_FORMATS}.")
    return (((day * 24 + hours) * 60 + minutes) * 60 + seconds) or None


def check_memory(text: str, what: str = "--mem") -> None:
    """A memory size as sbatch --mem reads it; UserError naming ``what`` otherwise."""
    if not MEMORY.fullmatch(str(text).strip()):
        raise UserError(f"{what} {text!r} is not a SLURM memory size; write a whole number of "
                        "megabytes, or one with a unit K, M, G or T (e.g. 64G; 0 asks for all "
                        "of a node's memory).")


def check_word(text: str, what: str) -> None:
    """A value written into an #SBATCH line (partition, account, qos): one word."""
    if any(char.isspace() for char in text):
        raise UserError(f"{what} {text!r} is not one word; give the name SLURM knows it by.")


def check_request(args) -> None:
    """The job's own flags (`danastar submit`'s, not train's) as SLURM reads them, before
    anything is planned or written."""
    minimums = (("nodes", 1, ""), ("gpus_per_node", 0, " (0 for a job without GPUs)"),
                ("tasks_per_node", 1, ""), ("cpus_per_task", 1, " (leave it out for the "
                                                                "default)"),
                ("max_restarts", 0, ""), ("signal_lead", 0, " seconds"))
    for name, minimum, unit in minimums:
        value = getattr(args, name, None)
        if value is not None and value < minimum:
            raise UserError(f"--{name} {value} must be at least {minimum}{unit}.")
    if getattr(args, "time", None):
        time_limit_seconds(args.time, "--time")
    if getattr(args, "mem", None):
        check_memory(args.mem, "--mem")
    for name in ("partition", "account", "qos"):
        if getattr(args, name, None) is not None:
            check_word(getattr(args, name), f"--{name}")


def check_signal_lead(time_limit: str, signal_lead: int) -> None:
    """The checkpoint signal must come before the time limit with time to train first."""
    seconds = time_limit_seconds(time_limit) if time_limit else None
    if signal_lead < 0:
        raise UserError(f"--signal_lead {signal_lead} must be a number of seconds >= 0.")
    if seconds is not None and signal_lead >= seconds:
        raise UserError(f"--signal_lead {signal_lead} s is not shorter than --time {time_limit} "
                        f"({seconds} s): every segment would stop as it starts; lengthen --time or "
                        f"shorten --signal_lead.")


# ----------------------------------------------------------------------------------------------
# Submitting

def submit(script_path: Path, run=None, env=None) -> str:
    """`sbatch --parsable SCRIPT` (through the cluster's `run` when given); returns the job id."""
    argv = ["sbatch", "--parsable", str(script_path)]
    try:
        if run is not None:
            result = run(argv)
        else:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    except FileNotFoundError:
        raise UserError("sbatch is not installed here; run danastar submit on a SLURM login node "
                        "or give the cluster profile a login: host.") from None
    except subprocess.TimeoutExpired:
        raise UserError("sbatch did not answer within 60 s; check the cluster (sinfo) and try "
                        "again.") from None
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip().splitlines()
        raise UserError(f"sbatch refused the job ({message[-1] if message else 'no message'}); "
                        "fix the flags or the cluster profile and submit again (--dry_run "
                        "prints the script without submitting it).")
    return result.stdout.strip().split(";")[0]


# ----------------------------------------------------------------------------------------------
# The job script's helper: `python -m danastar.launch.slurm state|end --run_dir DIR`

def segment_exit_code(run_dir: Path, exit_code: int, since: str, reason: str = "") -> int:
    """The segment's real exit code, recorded in status.json.

    torchrun reports a worker's 75 as its own failure (1); when the run's status says this
    segment saved a checkpoint with work left, the code is 75. A crash (not 0, 2 or 75) or a user
    error marks the run failed.
    """
    status = read_status(run_dir)
    recent = status.get("updated", "") >= since
    expected = (COMPLETE_EXIT_CODE, PREEMPTED_EXIT_CODE)
    if exit_code not in expected and recent and status.get("state") in (
            "preempted", "segment done"):
        exit_code = PREEMPTED_EXIT_CODE
    if exit_code not in expected:
        fields = {"exit_code": exit_code}
        if reason:
            fields["reason"] = reason
        write_status(run_dir, "failed", **fields)
    return exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m danastar.launch.slurm",
                                     description="the job script's helper")
    parser.add_argument("action", choices=("state", "end"))
    parser.add_argument("--run_dir", required=True, type=Path)
    parser.add_argument("--exit_code", type=int, default=0)
    parser.add_argument("--since", default="")
    parser.add_argument("--reason", default="")
    args = parser.parse_args(argv)
    if args.action == "state":
        print(read_status(args.run_dir).get("state", "new"))
    else:
        args.run_dir.mkdir(parents=True, exist_ok=True)
        print(segment_exit_code(args.run_dir, args.exit_code, args.since, args.reason))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
