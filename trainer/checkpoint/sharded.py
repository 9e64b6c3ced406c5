"""Checkpoints: sharded full state via DCP plus a consolidated model, made visible atomically.

Layout of ``<ckpt_dir>/checkpoints/step-000040/``::

    full_state/   DCP shards of model + optimizer, scheduler.json, rng_rank<r>.pt, trainer_state.json
    hf/           model.safetensors + config.json (load without torchrun: trainer.model.builtin.load_consolidated)

Everything is written under ``.tmp-step-000040`` and renamed by rank 0 after a barrier, so a
``step-*`` directory that exists is complete on every rank. Loading runs no code from the
files: JSON, tensors and plain data only (:mod:`trainer.checkpoint.files`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from journal.checkpoints.rotation import checkpoint_run_id, latest_checkpoint
from journal.rundir.files import fsync_dir
from journal.rundir.paths import checkpoints_dir, step_dir_name
from journal.rundir.safety import make_dir
from trainer.checkpoint.files import (
    SafeReader,
    read_rng_state,
    read_scheduler_state,
    write_scheduler_state,
)
from trainer.checkpoint.fit import CheckpointMismatch, FittingLoadPlanner
from trainer.model.spec import ConsolidatedWriter

log = logging.getLogger(__name__)


@dataclass
class TrainerState:
    """Loop position restored on resume (the data position is (epoch, step_in_epoch))."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    samples_seen: int = 0
    run_id: str | None = None


def save_checkpoint(
    ckpt_dir: Path,
    state: TrainerState,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    *,
    write_consolidated: ConsolidatedWriter | None,
) -> tuple[Path, list[str]]:
    """Collective: every rank calls it. Returns (final path, kinds written). Rotation of
    older checkpoints is separate (:mod:`trainer.rotation`, rank 0, after the save record)."""
    tmp, final = prepare_tmp(ckpt_dir, state.step)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / "full_state"))
    write_small_files(tmp, state, scheduler)
    kinds = ["full_state"]
    if write_consolidated is not None:
        write_consolidated_model(tmp, model, write_consolidated)
        kinds.append("hf")
    dist.barrier()  # every rank's shards and RNG files are on disk
    if dist.get_rank() == 0:
        put_in_place(tmp, final, state.run_id)
    return final, kinds


def put_in_place(tmp: Path, final: Path, run_id: str | None) -> None:
    """Rank 0: make a complete save visible as ``final``. A checkpoint already there of this
    run (a re-save of the same step after a resume) is replaced, renamed aside first so a
    crash leaves one complete checkpoint, never a half-deleted one; one of another run is
    kept, renamed ``step-NNNNNN.run-<its run>`` (which no rotation or resume looks at)."""
    replaced = None
    if final.exists():
        owner = checkpoint_run_id(final)
        if owner is not None and owner != run_id:
            kept = final.with_name(f"{final.name}.run-{owner}")
            os.rename(final, kept)
            log.warning("%s is run %s's checkpoint: moved aside to %s", final, owner, kept.name)
        else:  # a .tmp-step-* name: a crash before the deletion leaves it to remove at start
            replaced = final.with_name(f".tmp-{final.name}.replaced")
            os.rename(final, replaced)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)


def remove_partial_saves(ckpt_dir: Path) -> list[Path]:
    """Remove the ``.tmp-step-*`` directories a killed attempt left (a crash or kill -9
    while a write was in flight); returns them. Not collective: rank 0 calls it at start,
    holding the run lock, so no writer of them can still be alive."""
    removed = sorted(checkpoints_dir(ckpt_dir).glob(".tmp-step-*"))
    for stale in removed:
        shutil.rmtree(stale, ignore_errors=True)
    return removed


def prepare_tmp(ckpt_dir: Path, step: int) -> tuple[Path, Path]:
    """Collective: rank 0 removes stale ``.tmp-step-*`` directories (left by a crash, a
    full disk or a kill during a background write) and makes this save's; returns
    (tmp, final)."""
    root = checkpoints_dir(ckpt_dir)
    name = step_dir_name(step)
    tmp, final = root / f".tmp-{name}", root / name
    if dist.get_rank() == 0:
        make_dir(root)  # writable by us alone, whatever the umask: resume loads from it
        remove_partial_saves(ckpt_dir)
        (tmp / "full_state").mkdir(parents=True)
    dist.barrier()
    return tmp, final


def write_small_files(tmp: Path, state: TrainerState, scheduler: Any) -> None:
    """This rank's RNG state; on rank 0 the scheduler and the trainer state too."""
    torch.save(_rng_state(), tmp / "full_state" / f"rng_rank{dist.get_rank()}.pt")
    if dist.get_rank() == 0:
        write_scheduler_state(tmp / "full_state", scheduler.state_dict())
        (tmp / "full_state" / "trainer_state.json").write_text(json.dumps(asdict(state)))


def write_consolidated_model(
    tmp: Path, model: torch.nn.Module, write_consolidated: ConsolidatedWriter
) -> None:
    """Collective: gather the full model to CPU; rank 0 writes it under ``tmp/hf``."""
    full = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if dist.get_rank() == 0:
        write_consolidated(tmp / "hf", full)


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> TrainerState:
    """Collective: restore model, optimizer, scheduler and this rank's RNG from ``path``.
    Raises :class:`~trainer.checkpoint.files.CheckpointError` for a file that holds more than
    tensors and data, :class:`~trainer.checkpoint.fit.CheckpointMismatch` for a checkpoint of
    a model of another shape."""
    full = path / "full_state"
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    reader, planner = SafeReader(full), FittingLoadPlanner(full, str(path))
    try:
        dcp.load(state, storage_reader=reader, planner=planner)
    except (Exception, dcp.CheckpointException):  # the latter is a BaseException
        refused = reader.refused or planner.refused  # DCP wraps it in its own exception
        if refused is not None:
            raise refused from None
        raise
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    scheduler.load_state_dict(read_scheduler_state(full))
    rng_file = full / f"rng_rank{dist.get_rank()}.pt"
    if rng_file.exists():  # absent when resuming on a different world size
        _set_rng_state(read_rng_state(rng_file))
    return TrainerState(**json.loads((full / "trainer_state.json").read_text()))


def load_newest_loadable(
    ckpt_dir: Path, path: Path, model: torch.nn.Module, optimizer: Any, scheduler: Any
) -> tuple[TrainerState, Path]:
    """Collective: :func:`load_checkpoint` of ``path`` or, when it fails on any rank (a
    corrupt file), of the newest complete checkpoint of its run before it (said in one
    line), and so on; the state and the checkpoint it came from. Raises the first error
    when none loads, and a :class:`~trainer.checkpoint.fit.CheckpointMismatch` at once (a
    model of another shape: the run's other checkpoints have that shape too)."""
    first: BaseException | None = None
    flag = torch.zeros(1, device=next(model.parameters()).device)
    while True:
        error: BaseException | None = None
        try:
            state = load_checkpoint(path, model, optimizer, scheduler)
        except CheckpointMismatch:
            raise
        except (Exception, dcp.CheckpointException) as exc:
            error = exc
        flag.fill_(error is not None)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank goes on from the same one
        if not flag.item():
            return state, path
        error = error or RuntimeError(f"{path} could not be loaded on another rank")
        first = first or error
        older = latest_checkpoint(ckpt_dir, checkpoint_run_id(path), before=path)
        if older is None:
            raise first
        if dist.get_rank() == 0:
            # DCP's CheckpointException names the ranks only: what failed is in its failures
            why = next(iter(getattr(error, "failures", {}).values()), (error,))[0]
            line = f"{type(why).__name__}: {str(why).strip().partition(chr(10))[0][:300]}"
            end = f"resuming from {older}, the newest complete checkpoint before it"
            log.warning("cannot load %s (%s); %s", path, line, end)
        path = older


def _rng_state() -> dict[str, Any]:
    st: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state()
    return st


def _set_rng_state(st: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(st["cpu"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state(st["cuda"])
