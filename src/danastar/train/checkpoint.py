"""Checkpoints: atomic, checksummed, resumable; one file for single/DDP, DCP for FSDP.

A checkpoint is a directory `<kind>-<step>` (kind `latest` or `permanent`) under the run's
`checkpoints/` holding

* `state.pt` (single process and DDP): model, optimizer and the run state in one file, or
* the `torch.distributed.checkpoint` shards of every rank plus `run_state.pt` (FSDP2),

and `meta.json` with the step, the layout and a SHA-256 of every file. It is written into a
hidden temporary directory, fsynced, and renamed into place, so a directory with a readable
`meta.json` whose checksums match is complete; anything else is skipped at resume with a
message. Older `latest` checkpoints are removed only after a newer one is in place, and
`keep_latest` of them are kept so that a corrupt one can be skipped. With `$SLURM_TMPDIR` (a
fast node-local disk) a checkpoint is written there first and copied to the run directory in the
background, then moved into place atomically: a single file by rank 0; DCP shards by every rank,
each from its own node's disk (the files it wrote; rank 0 adds `.metadata` and the run state)
into the hidden directory, which rank 0 checksums and renames once every rank's copy is done.

The run state saved with the weights is whatever the loop passes as `run_state`: the step, the
RNG states of every rank, the data position, counters. Batches are a pure function of the step,
so the step is the data position.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch
import torch.distributed as dist

from danastar.durable import fsync_file, out_of_space, publish_dir, sha256
from danastar.errors import UserError
from danastar.rundir.files import checkpoint_dirs

if TYPE_CHECKING:
    from danastar.config import CheckpointSection

CORRUPT_PREFIX = "corrupt-"  # a checkpoint that failed verification, set aside for inspection
STATE_FILE = "state.pt"  # single/DDP: everything in one file
RUN_STATE_FILE = "run_state.pt"  # DCP: the non-tensor run state beside the shards
META_FILE = "meta.json"
MIN_FREE_BYTES = 1 << 20  # what a run's records need to start, when no checkpoint says more


@dataclass(frozen=True)
class Found:
    """A complete, verified checkpoint on disk."""

    path: Path
    step: int
    layout: str  # "single" or "dcp"


# ----------------------------------------------------------------------------------------------
# RNG states: saved per rank so that every rank continues its own stream exactly.


def distributed_checkpoint():
    """torch.distributed.checkpoint and its state-dict helpers, for sharded (FSDP2) checkpoints
    only: imported when one is saved or loaded, since importing it (DTensor, sympy) costs a
    process 1 to 1.5 s at start, which every single-process run and command would pay."""
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415 (see above)
    from torch.distributed.checkpoint.state_dict import (  # noqa: PLC0415
        get_state_dict,
        set_state_dict,
    )

    return dcp, get_state_dict, set_state_dict


def rng_state() -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather_rng_states() -> list[dict[str, Any]]:
    """Every rank's RNG state, in rank order (a one-element list without torch.distributed)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [rng_state()]
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, rng_state())
    return states


def save_file(obj: Any, path: Path) -> None:
    """torch.save through a Python file: a full disk then raises OSError(ENOSPC), where torch's
    own writer (given a path) raises a RuntimeError that does not say why."""
    with open(path, "wb") as handle:
        torch.save(obj, handle)


# ----------------------------------------------------------------------------------------------
# The checkpoint's manifest: a checksum of every file (writes are durable.publish_dir's).


def write_meta(directory: Path, step: int, layout: str) -> None:
    files = {
        str(p.relative_to(directory)): sha256(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
    meta = {
        "step": step,
        "layout": layout,
        "files": files,
        "saved_at": time.time(),
        "torch": torch.__version__,
    }
    (directory / META_FILE).write_text(json.dumps(meta, indent=1))


def verify(directory: Path) -> tuple[Optional[dict[str, Any]], str]:
    """(meta, "") for a complete checkpoint, or (None, why it cannot be used)."""
    try:
        meta = json.loads((directory / META_FILE).read_text())
    except (OSError, ValueError):
        return None, f"{META_FILE} is missing or unreadable"
    for name, expected in meta.get("files", {}).items():
        path = directory / name
        if not path.is_file():
            return None, f"{name} is missing"
        if sha256(path) != expected:
            return None, f"{name} does not match its checksum"
    if not meta.get("files"):
        return None, "it lists no files"
    return meta, ""


# ----------------------------------------------------------------------------------------------


class Checkpointer:
    """Saves and finds the checkpoints of one run directory.

    `sharded=True` (FSDP2) uses `torch.distributed.checkpoint`, where every rank writes its shards;
    otherwise rank 0 writes one file. Every rank must call `save` and `load` (collectives inside).
    """

    def __init__(
        self,
        directory: Path,
        *,
        sharded: bool,
        keep_latest: int = 2,
        log=print,
        staging_root: Optional[Path] = None,
    ):
        self.directory = Path(directory)
        self.sharded = sharded
        self.keep_latest = keep_latest
        self.log = log
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        if staging_root is None and os.environ.get("SLURM_TMPDIR"):
            staging_root = Path(os.environ["SLURM_TMPDIR"]) / "danastar-checkpoints"
        self.staging_root = staging_root
        self._copy_thread: Optional[threading.Thread] = None
        self._copy_error: Optional[BaseException] = None
        # A staged sharded checkpoint is complete only when every rank has copied its shards, so its
        # background copy ends in a collective. It runs on a gloo group of its own (created here,
        # by every rank, as collectives must be), never interleaving with the training thread's.
        self._copy_group = None
        if sharded and staging_root is not None and self.distributed:
            self._copy_group = dist.new_group(backend="gloo")

    # -- saving --------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        run_state: dict[str, Any],
        kind: str = "latest",
    ) -> None:
        """Write checkpoint `<kind>-<step>`; `run_state` must already hold every rank's RNG
        states."""
        name = f"{kind}-{step:08d}"
        if self.sharded:
            self._save_sharded(name, step, model, optimizer, run_state)
        elif self.rank == 0:
            self._save_single(name, step, model, optimizer, run_state)
        self._barrier()

    def _save_single(self, name, step, model, optimizer, run_state) -> None:
        self.wait()  # one background copy at a time, in order
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "run_state": run_state,
        }
        root = self._staging_dir() if self.staging_root else self.directory
        temporary = root / f".tmp-{name}"
        with self._no_space_is_a_user_error(root, temporary, name):
            self._fresh_dir(temporary)
            save_file(state, temporary / STATE_FILE)
            write_meta(temporary, step, "single")
            publish_dir(temporary, root / name)
        if self.staging_root is None:
            self._prune()
            return
        # Staged on the node-local disk: copy to the run directory in the background.
        self._start_copy(self._copy_staged, root / name)

    def _start_copy(self, target, *args) -> None:
        self._copy_thread = threading.Thread(target=target, args=args, daemon=True)
        self._copy_thread.start()

    def _staging_dir(self) -> Path:
        """This run's folder on the node-local disk (named after the run directory's path)."""
        return self.staging_root / self.directory.resolve().as_posix().strip("/").replace("/", "_")

    def _copy_staged(self, staged: Path) -> None:
        try:
            temporary = self.directory / f".tmp-{staged.name}"
            if temporary.exists():
                shutil.rmtree(temporary)
            shutil.copytree(staged, temporary)
            publish_dir(temporary, self.directory / staged.name)
            shutil.rmtree(staged, ignore_errors=True)
            self._prune()
        except BaseException as error:  # reported by wait() in the training thread
            self._copy_error = error

    def wait(self) -> None:
        """Block until a background copy has finished (call before exit)."""
        if self._copy_thread is not None:
            self._copy_thread.join()
            self._copy_thread = None
        if self._copy_error is not None:
            error, self._copy_error = self._copy_error, None
            raise RuntimeError(f"copying a staged checkpoint to {self.directory} failed") from error

    def _save_sharded(self, name, step, model, optimizer, run_state) -> None:
        self.wait()  # one background copy at a time, in order (every rank calls save)
        temporary = self.directory / f".tmp-{name}"
        if self.rank == 0:
            self._fresh_dir(temporary)
        # Staged: each rank writes into a folder of its own on its node's disk, so that the files
        # in it are exactly the ones this rank must copy (ranks on one node share the disk).
        staged = (
            self._staging_dir() / f".tmp-{name}" / f"rank-{self.rank:05d}"
            if self.staging_root
            else None
        )
        if staged is not None:
            self._fresh_dir(staged)
        self._barrier()
        dcp, get_state_dict, _ = distributed_checkpoint()
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save(
            {"model": model_state, "optimizer": optimizer_state},
            storage_writer=dcp.FileSystemWriter(staged if staged is not None else temporary),
        )
        if staged is not None:
            if self.rank == 0:
                torch.save(run_state, staged / RUN_STATE_FILE)
            self._start_copy(
                self._copy_staged_shards, staged, temporary, self.directory / name, step
            )
            return
        self._barrier()
        if self.rank == 0:
            with self._no_space_is_a_user_error(self.directory, temporary, name):
                save_file(run_state, temporary / RUN_STATE_FILE)
                write_meta(temporary, step, "dcp")
                publish_dir(temporary, self.directory / name)
            self._prune()

    def _copy_staged_shards(self, staged: Path, temporary: Path, final: Path, step: int) -> None:
        """Background: copy this rank's staged files into `temporary`; rank 0 publishes it once
        all did."""
        error: Optional[BaseException] = None
        try:
            for path in sorted(staged.rglob("*")):
                if path.is_file():
                    target = temporary / path.relative_to(staged)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, target)
                    fsync_file(target)  # durable (and visible to rank 0) before the vote
        except BaseException as copy_error:
            error = copy_error
        try:
            # Every rank reaches this (also after a failed copy), so that all learn whether any
            # failed.
            mine = None if error is None else f"rank {self.rank}: {error!r}"
            failures = [mine]
            if self._copy_group is not None:
                failures = [None] * dist.get_world_size()
                dist.all_gather_object(failures, mine, group=self._copy_group)
            failed = [failure for failure in failures if failure is not None]
            if failed:
                raise RuntimeError("; ".join(failed)) from error
            if self.rank == 0:  # every shard is in place: checksum, fsync and rename as unstaged
                write_meta(temporary, step, "dcp")
                publish_dir(temporary, final)
                self._prune()
            shutil.rmtree(staged, ignore_errors=True)
            with contextlib.suppress(OSError):
                # the last rank of the node to finish removes the step's folder
                staged.parent.rmdir()
        except BaseException as finish_error:  # reported by wait() in the training thread
            self._copy_error = finish_error

    @contextlib.contextmanager
    def _no_space_is_a_user_error(self, root: Path, temporary: Path, name: str):
        """A full disk while writing `temporary`: remove the partial copy and say so in one
        sentence. Nothing older is touched (pruning runs only after a complete publish), so the
        last good checkpoint stays the one a resume uses."""
        try:
            yield
        except (OSError, RuntimeError) as error:
            if not out_of_space(error):
                raise
            shutil.rmtree(temporary, ignore_errors=True)
            newest = self.checkpoints()
            kept = (f"the last good checkpoint {newest[-1].name} is kept" if newest
                    else "there is no earlier checkpoint")
            raise UserError(
                f"no space left in {root} while saving checkpoint {name}; the partial copy was "
                f"removed and {kept}; free some space and run the same command again to resume."
            ) from None

    def check_space(self) -> None:
        """Refuse to start on a disk that cannot take the next checkpoint (found at the first
        save, it would cost every step trained until then): it needs about as much room as the
        newest checkpoint here takes, or a little for the run's records when there is none."""
        existing = self.checkpoints()
        needed = (sum(path.stat().st_size for path in existing[-1].rglob("*") if path.is_file())
                  if existing else MIN_FREE_BYTES)
        where = next(path for path in (self.directory, *self.directory.parents)
                     if path.is_dir())
        free = shutil.disk_usage(where).free
        if free >= needed:
            return
        size = (f", and the next checkpoint needs about {needed / 2**20:.1f} MiB (the size of "
                f"{existing[-1].name})" if existing else "")
        raise UserError(f"no space left in {where}: {free / 2**20:.1f} MiB free{size}; free some "
                        f"space and run the same command again (nothing was written).")

    def _fresh_dir(self, path: Path) -> None:
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)

    def _prune(self) -> None:
        """Remove `latest` checkpoints beyond the newest `keep_latest`, and stale temporaries."""
        latest = sorted(p for p in self.checkpoints() if p.name.startswith("latest-"))
        for old in latest[: -self.keep_latest]:
            shutil.rmtree(old, ignore_errors=True)

    # -- finding and loading -------------------------------------------------------------------

    def checkpoints(self) -> list[Path]:
        """Checkpoint directories by name, oldest step first (no verification)."""
        return checkpoint_dirs(self.directory)

    def find_latest(self) -> Optional[Found]:
        """The newest complete checkpoint, setting aside (with a message) any newer one that
        fails verification; None when there is none at all. Every rank gets rank 0's answer.

        When checkpoints exist but none is usable, it refuses (UserError naming each one) rather
        than let the run start again at step 0 over the history of the old one."""
        chosen: Optional[Found] = None
        problem: Optional[str] = None
        if self.rank == 0:
            try:
                chosen = self.find_latest_here()
            except UserError as error:
                problem = str(error)
        if self.distributed:
            box = [(chosen, problem)]
            dist.broadcast_object_list(box, src=0)
            chosen, problem = box[0]
        if problem is not None:
            raise UserError.on_every_rank(problem, self.rank == 0)
        return chosen

    def find_latest_here(self) -> Optional[Found]:
        """`find_latest` in this process alone (no collective): for rank 0's decisions."""
        unusable = []
        for path in reversed(self.checkpoints()):
            meta, problem = verify(path)
            if meta is not None:
                # Set aside (not deleted) so that pruning never keeps them in place of a good one.
                for corrupt, why in unusable:
                    aside = self._set_aside(corrupt)
                    self.log(
                        f"checkpoint {corrupt} is incomplete or corrupt ({why}); moved it to "
                        f"{aside.name} and trying the previous one."
                    )
                return Found(path, int(meta["step"]), meta["layout"])
            unusable.append((path, problem))
        unusable += [(path, "set aside earlier as corrupt") for path in self.set_aside()]
        if unusable:
            listed = "; ".join(f"{path} ({why})" for path, why in unusable)
            raise UserError(
                f"no usable checkpoint in {self.directory}, so this run cannot resume: "
                f"{listed}; restore a good copy, or pass --no_auto_resume to move the old run "
                f"aside and start afresh (or use another --run_dir)."
            )
        return None

    def set_aside(self) -> list[Path]:
        """Checkpoints set aside as corrupt by earlier resumes."""
        if not self.directory.is_dir():
            return []
        return sorted(
            p for p in self.directory.iterdir() if p.is_dir() and p.name.startswith(CORRUPT_PREFIX)
        )

    def _set_aside(self, path: Path) -> Path:
        """Rename a corrupt checkpoint to `corrupt-<name>`, or `corrupt-<name>-<n>` when that is
        taken (the same step can turn out corrupt twice; that must not block resuming)."""
        aside = path.with_name(f"{CORRUPT_PREFIX}{path.name}")
        number = 1
        while aside.exists():
            number += 1
            aside = path.with_name(f"{CORRUPT_PREFIX}{path.name}-{number}")
        os.replace(path, aside)
        return aside

    def saved_run_state(self, found: Found) -> dict[str, Any]:
        """The run state saved with checkpoint `found`, without loading it into anything."""
        if found.layout == "single":
            state = torch.load(found.path / STATE_FILE, map_location="cpu", weights_only=False)
            return state["run_state"]
        return torch.load(found.path / RUN_STATE_FILE, map_location="cpu", weights_only=False)

    def load(
        self, found: Found, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        """Load weights and optimizer state into `model`/`optimizer`; returns the saved run
        state."""
        expected = "dcp" if self.sharded else "single"
        if found.layout != expected:
            raise UserError.on_every_rank(  # every rank finds it; one says it
                f"checkpoint {found.path} was written by a "
                f"{'sharded (FSDP or --ep_size)' if found.layout == 'dcp' else 'single-file'} "
                f"run; resume it with the same --distributed_backend and --ep_size, or pass "
                f"--no_auto_resume.", self.rank == 0)
        if found.layout == "single":
            state = torch.load(found.path / STATE_FILE, map_location="cpu", weights_only=False)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            return state["run_state"]
        dcp, get_state_dict, set_state_dict = distributed_checkpoint()
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=str(found.path))
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )
        return torch.load(found.path / RUN_STATE_FILE, map_location="cpu", weights_only=False)

    def _barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def checkpoint_kind(step: int, iterations: int, settings: CheckpointSection,
                    stopping: bool) -> str | None:
    """Which checkpoint to write after `step`: "permanent" every `permanent_every` steps, else
    "latest" every `latest_every` steps, at the end, and before stopping early; None otherwise."""
    every, permanent = settings.latest_every, settings.permanent_every
    if permanent > 0 and step % permanent == 0:
        return "permanent"
    if step == iterations or (every > 0 and step % every == 0) or stopping:
        return "latest"
    return None
