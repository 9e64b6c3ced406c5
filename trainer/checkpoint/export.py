"""The consolidated model of a checkpoint, made from its sharded state, off the training path.

Two callers, neither of which needs torchrun or a process group:

- an asynchronous save whose export is due: rank 0's background thread reads the DCP
  checkpoint it has just written and writes ``hf/`` from it, so the training ranks neither
  gather the model nor wait in a barrier while rank 0 writes;
- ``ilab-journal export DIR [--step N]`` (``python -m trainer.checkpoint.export``): any saved checkpoint
  later, e.g. of a run with ``--export-every`` or one that was interrupted. It holds a lease on
  the checkpoint while it works, so a running trainer's rotation leaves it alone.

Only the ``model.*`` entries are read, into fp32 CPU tensors shaped from the checkpoint's
metadata, with the same data-only readers that resume uses.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from journal.checkpoints import leases
from journal.checkpoints.leases import LeaseError
from journal.checkpoints.rotation import checkpoint_run_id, is_complete, latest_checkpoint
from journal.rundir.files import fsync_dir
from journal.rundir.paths import checkpoints_dir, logs_dir, step_dir_name
from journal.store import tail
from trainer.checkpoint.files import CheckpointError, SafeLoadPlanner, SafeReader
from trainer.checkpoint.fit import MODEL_PREFIX  # the model's entries in full_state
from trainer.model.spec import ConsolidatedWriter

log = logging.getLogger(__name__)

EXPORT_DIR_NAME = "hf"

# dcp.load warns that it "assumes the intent is to load in a single process" even when told
# so (no_dist=True, below): on every export that line reached the user's console.
warnings.filterwarnings(
    "ignore",
    message="torch.distributed is disabled, unavailable or uninitialized",
    category=UserWarning,
)
LEASE_TTL_S = 3600.0  # renewed by nobody: a long conversion must not outlive it by much


class ExportError(RuntimeError):
    """A checkpoint cannot be exported (one line for the user)."""


def read_model_state(full_state: Path) -> dict[str, torch.Tensor]:
    """The whole model of a DCP checkpoint directory as CPU tensors, by parameter name
    (what ``get_model_state_dict(full_state_dict=True)`` gives for the same model)."""
    reader = SafeReader(full_state)
    meta = reader.read_metadata()
    state = {
        key.removeprefix(MODEL_PREFIX): torch.empty(md.size, dtype=md.properties.dtype)
        for key, md in meta.state_dict_metadata.items()
        if key.startswith(MODEL_PREFIX) and isinstance(md, TensorStorageMetadata)
    }
    dcp.load(
        {"model": state}, storage_reader=reader, planner=SafeLoadPlanner(full_state), no_dist=True
    )
    return state


def export_from_shards(checkpoint: Path, write: ConsolidatedWriter) -> Path:
    """Write ``checkpoint/hf`` from ``checkpoint/full_state`` (under a temporary name, renamed
    when complete); returns it."""
    out = checkpoint / EXPORT_DIR_NAME
    tmp = checkpoint / f".tmp-{EXPORT_DIR_NAME}"
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp, read_model_state(checkpoint / "full_state"))
    os.rename(tmp, out)
    fsync_dir(checkpoint)
    return out


def find_checkpoint(ckpt_dir: Path, step: int | None) -> Path:
    """The checkpoint of ``step``, or the newest complete one, of the journal's run (its
    newest worker config is the one :func:`run_writer` exports with)."""
    run = tail(ckpt_dir).run_id
    if step is None:
        found = latest_checkpoint(ckpt_dir, run)
        if found is None:
            raise ExportError(f"{ckpt_dir}: no checkpoint to export in {checkpoints_dir(ckpt_dir)}")
        return found
    path = checkpoints_dir(ckpt_dir) / step_dir_name(step)
    if not is_complete(path):
        raise ExportError(f"{path}: no complete checkpoint of step {step}")
    owner = checkpoint_run_id(path)
    if run is not None and owner != run:
        raise ExportError(
            f"{path}: a checkpoint of run {owner or '(none named)'}, not of this journal's "
            f"run {run}"
        )
    return path


def run_writer(ckpt_dir: Path) -> ConsolidatedWriter:
    """The consolidated writer of the run's newest launch (its worker config in logs/)."""
    from trainer.config import WorkerConfig
    from trainer.model.build import consolidated_writer

    configs = sorted(logs_dir(ckpt_dir).glob("worker-config-*.json"), key=os.path.getmtime)
    if not configs:
        raise ExportError(
            f"{ckpt_dir}: no worker config in {logs_dir(ckpt_dir)} (not an ilab-train run?)"
        )
    return consolidated_writer(WorkerConfig.model_validate_json(configs[-1].read_bytes()).args)


def export_checkpoint(
    ckpt_dir: Path, step: int | None = None, *, force: bool = False
) -> tuple[Path, bool]:
    """``ilab-journal export``: the consolidated model of a saved checkpoint, in its ``hf/``,
    and whether it was written now. A checkpoint that has one already is left as it is
    unless ``force``."""
    checkpoint = find_checkpoint(ckpt_dir, step)
    out = checkpoint / EXPORT_DIR_NAME
    if out.exists() and not force:
        return out, False
    try:
        lease = leases.acquire(ckpt_dir, checkpoint, ttl=LEASE_TTL_S, holder="ilab-journal export")
    except LeaseError as exc:
        raise ExportError(str(exc)) from None
    try:
        if out.exists():
            shutil.rmtree(out)
        return export_from_shards(checkpoint, run_writer(ckpt_dir)), True
    finally:
        leases.drop(ckpt_dir, lease)


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer.checkpoint.export DIR [--step N] [--force]``; ``ilab-journal export`` runs it."""
    p = argparse.ArgumentParser(prog="ilab-journal export")
    p.add_argument("dir", type=Path)
    p.add_argument("--step", type=int, default=None)
    p.add_argument("--force", action="store_true")
    ns = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        out, written = export_checkpoint(ns.dir, ns.step, force=ns.force)
    except (ExportError, CheckpointError, OSError) as exc:
        print(f"ilab-journal export: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, OSError) else 2
    print(f"{out}{'' if written else ' (already exported)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
