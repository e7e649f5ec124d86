"""The start decision of `danastar train`, made once before anything trains: the plan (with its
batch layout), the run directory and what its choice rests on, checked as training would check
them (data it cannot open, a directory another process holds, a resume with other settings).

`decide` makes it in the command. Under `--nproc N` the launching process writes it into the run
directory (`START_FILE`) and names the file to its workers (`START_FILE_VARIABLE`), which read it
(`read_for_worker`) instead of deciding again. `train` takes it and re-checks only what preparing
the data can change: the vocabulary (then it plans again) and the data the automatic directory
was chosen on (then it chooses again; see `RunDirChoice.holds_for`). A worker started by another
launcher (srun, mpirun, torchrun by hand) plans alone and leaves the directory to rank 0.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from danastar.config import TrainConfig, batch_layout, make_run_plan, run_directory
from danastar.data.planned import planned_vocab_size
from danastar.durable import write_atomic
from danastar.errors import UserError
from danastar.rundir.files import START_FILE
from danastar.scaling import Plan
from danastar.train.identity import RunDirChoice, planned_run_dir
from danastar.train.plan import checked_start, planned_run

# Names the launching process's decision file to its workers (torchrun passes its environment on).
START_FILE_VARIABLE = "DANASTAR_START_FILE"


@dataclass(frozen=True)
class StartDecision:
    """A start decided: `plan`, `run_dir` (a `RunDirChoice`) and `planned`, the dry run's record
    (None in a worker, which shows no plan)."""

    plan: Plan
    run_dir: RunDirChoice
    planned: Optional[dict[str, Any]] = None


def decide(config: TrainConfig, world_size: int) -> StartDecision:
    """The start of `config` on `world_size` processes, decided and checked; writes nothing."""
    chosen = planned_run_dir(config, world_size)
    plan, planned = checked_start(config, chosen.path, chosen.note)
    return StartDecision(plan, chosen, planned)


def undecided(config: TrainConfig) -> StartDecision:
    """The plan of a worker without its launcher's decision: the run directory is rank 0's
    to choose when training starts (--run_dir, or the automatic one chosen then)."""
    plan, planned = planned_run(config, run_dir=run_directory(config))
    return StartDecision(plan, RunDirChoice(run_directory(config),
                                            undecided=not config.logging.run_dir), planned)


def after_preparing(decision: StartDecision, config: TrainConfig,
                    world_size: int) -> StartDecision:
    """`decision` once the data is prepared: the automatic directory chosen where it could not
    be before (its runs are compared on the data)."""
    if not decision.run_dir.undecided:
        return decision
    return StartDecision(decision.plan, planned_run_dir(config, world_size), decision.planned)


def write_for_workers(decision: StartDecision, config: TrainConfig) -> Path:
    """Write `decision` into its run directory for the workers about to start; returns the
    file (the launching process removes it when they end). The plan is given by what it was
    made of, the vocabulary read from the data now prepared: each worker makes it again, once."""
    chosen = decision.run_dir
    chosen.path.mkdir(parents=True, exist_ok=True)
    record = {"settings": settings_digest(config),
              "vocab_size": planned_vocab_size(config.data.dataset)[0],
              "run_dir": str(chosen.path), "note": chosen.note, "data": chosen.data,
              "undecided": chosen.undecided}
    path = chosen.path / START_FILE
    write_atomic(path, json.dumps(record, indent=1) + "\n")
    return path


def read_for_worker(config: TrainConfig, world_size: int) -> Optional[StartDecision]:
    """The decision the launching process wrote for this worker, or None where none was."""
    name = os.environ.get(START_FILE_VARIABLE)
    if not name:
        return None
    record = json.loads(Path(name).read_text())
    if record["settings"] != settings_digest(config):
        raise UserError(f"this worker's settings differ from those its launching process "
                        f"decided the start with ({name}); start every process with the same "
                        f"arguments.")
    plan = make_run_plan(config, record["vocab_size"],
                         batch_layout(config, world_size).data_parallel_size)
    return StartDecision(plan, RunDirChoice(Path(record["run_dir"]), record["note"],
                                            record["data"], record["undecided"]))


def settings_digest(config: TrainConfig) -> str:
    """A hash of the resolved configuration, by which a worker knows the decision is its own."""
    settings = json.dumps(config.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(settings.encode()).hexdigest()[:16]
