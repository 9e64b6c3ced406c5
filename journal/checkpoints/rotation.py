"""Checkpoint rotation: keep the newest ``keep_last_n``, the best one, and every leased one;
journal each deletion. The trainer's rank 0 rotates after each save; once no trainer writes
the journal, whoever releases a lease (the watcher) or ``ilab-journal prune`` applies the
run's own policy, under the journal lock.

Checkpoints belong to a run: rotation, resume, ``prune`` and ``export`` act only on those whose
``full_state/trainer_state.json`` names the run they act for (:func:`checkpoint_run_id`, the
one place that decides it), so two runs in one dir never delete or resume each other's.

A deletion renames the checkpoint aside first and looks at the leases once more: a lease
taken between the first look and the rename wins, and the checkpoint is put back. A watcher
that finds a checkpoint missing while a ``.removing-`` twin exists waits for the outcome.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from journal.checkpoints import leases
from journal.rundir.paths import (
    DCP_METADATA_NAME,
    FULL_STATE_DIR_NAME,
    TRAINER_STATE_NAME,
    checkpoint_step,
    checkpoints_dir,
)

log = logging.getLogger(__name__)

REMOVING_PREFIX = ".removing-"
Emit = Callable[[str, dict[str, Any]], Any]


def checkpoint_run_id(path: Path) -> str | None:
    """The run that saved an ilab-train checkpoint: the ``run_id`` its
    ``full_state/trainer_state.json`` names. None when it names none (saved without a
    journal) or cannot be read (a copy cut short, another trainer's layout)."""
    try:
        with open(path / FULL_STATE_DIR_NAME / TRAINER_STATE_NAME, "rb") as f:
            state = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None
    run_id = state.get("run_id") if isinstance(state, dict) else None
    return run_id if isinstance(run_id, str) else None


def is_complete(path: Path) -> bool:
    """Whether an ilab-train checkpoint can be loaded: DCP writes ``full_state/.metadata``
    last. A ``step-*`` dir without it comes from a crash in a save or a copy cut short."""
    return (path / FULL_STATE_DIR_NAME / DCP_METADATA_NAME).is_file()


def list_checkpoints(
    ckpt_dir: Path, root: Path | None = None, *, run_id: str | None = None
) -> list[Path]:
    """Checkpoint directories, oldest first (``.tmp-`` and ``.removing-`` ones are not), in
    ``root`` (default: the run's ``checkpoints/``; an HF Trainer's output dir for a bridge).
    With ``run_id``: only those that run saved (:func:`checkpoint_run_id`)."""
    root = checkpoints_dir(ckpt_dir) if root is None else root
    if not root.is_dir():
        return []
    found = [
        (step, p)
        for p in root.iterdir()
        if (step := checkpoint_step(p.name)) is not None and p.is_dir()
    ]
    return [p for _, p in sorted(found) if run_id is None or checkpoint_run_id(p) == run_id]


def latest_checkpoint(
    ckpt_dir: Path, run_id: str | None, before: Path | None = None
) -> Path | None:
    """The checkpoint a resume (or an export) of run ``run_id`` uses: its newest complete
    one; with ``run_id`` None (no journal says which run) the newest complete one of any run.
    Another run's checkpoint is never picked. A newer one of the run that is incomplete is
    skipped, with a warning naming it (left in place for the user to look at). ``before``:
    only one older than that checkpoint (which could not be loaded)."""
    last = checkpoint_step(before.name) if before is not None else None
    for path in reversed(list_checkpoints(ckpt_dir)):
        if last is not None and (checkpoint_step(path.name) or 0) >= last:
            continue
        owner = checkpoint_run_id(path)
        if run_id is not None and owner != run_id and (owner is not None or is_complete(path)):
            continue  # another run's (a complete one naming no run is not this run's either)
        if is_complete(path):
            return path
        log.warning(
            "skipping %s: incomplete (no %s/%s: a save cut short, or a partial copy); "
            "using the previous complete checkpoint",
            path,
            FULL_STATE_DIR_NAME,
            DCP_METADATA_NAME,
        )
    return None


def rotate(
    ckpt_dir: Path,
    keep_last_n: int | None,
    *,
    keep: set[str],
    emit: Emit,
    root: Path | None = None,
    run_id: str | None = None,
) -> list[Path]:
    """Delete the checkpoints no policy keeps; returns what was deleted.

    Args:
        keep_last_n: newest checkpoints always kept (None keeps everything).
        keep: more names to keep (the best checkpoint).
        emit: journals a ``checkpoint_removed`` record.
        root: where the checkpoints are (default: ``checkpoints/``).
        run_id: the run rotated: other runs' checkpoints are neither counted nor deleted
            (None: every checkpoint in ``root``, for trainers that record no run in them).
    """
    finish_interrupted_removals(ckpt_dir, emit, root)
    candidates = beyond_retention(ckpt_dir, keep_last_n, keep=keep, root=root, run_id=run_id)
    if not candidates or not keep_last_n:
        return []

    def refused(rec: dict[str, Any]) -> None:  # a bad lease file: journaled, moved aside
        emit("control", rec)

    held = leases.leased(ckpt_dir, {p.name for p in candidates}, on_reject=refused)
    removed = []
    for path in candidates:
        if path.name in held:
            log.info("keeping %s: leased", path.name)
            continue
        if remove_unless_leased(
            ckpt_dir, path, path.name, emit=emit, reason=_why(keep_last_n), on_reject=refused
        ):
            removed.append(path)
            log.info("removed old checkpoint %s (keep_last_n=%d)", path, keep_last_n)
    return removed


def beyond_retention(
    ckpt_dir: Path,
    keep_last_n: int | None,
    *,
    keep: set[str],
    root: Path | None = None,
    run_id: str | None = None,
) -> list[Path]:
    """The run's checkpoints no policy but a lease keeps, oldest first: all but the newest
    ``keep_last_n`` (None keeps everything), less ``keep`` (the best)."""
    if not keep_last_n:
        return []
    found = {p.name: p for p in list_checkpoints(ckpt_dir, root, run_id=run_id)}
    return [found[name] for name in surplus(list(found), keep_last_n, keep)]


def surplus(names: list[str], keep_last_n: int | None, keep: set[str]) -> list[str]:
    """The retention rule itself, pure (``ilab-journal backtest`` replays it): of the
    checkpoint ``names``, oldest first, all but the newest ``keep_last_n`` (None or 0 keeps
    everything), less those in ``keep`` (the best)."""
    if not keep_last_n:
        return []
    return [name for name in names[:-keep_last_n] if name not in keep]


def prunable(
    ckpt_dir: Path, keep_last_n: int | None, *, keep: set[str], run_id: str | None
) -> tuple[list[Path], int]:
    """What ``ilab-journal prune`` would remove now, read only (for ``status``): the
    checkpoints beyond retention that no unexpired lease holds, and how many expired leases
    lie on them (their holders, e.g. a watcher killed with ``kill -9``, are gone)."""
    candidates = beyond_retention(ckpt_dir, keep_last_n, keep=keep, run_id=run_id)
    ends = leases.expiries(ckpt_dir, {p.name for p in candidates})
    now = time.time()
    unheld = [p for p in candidates if all(end <= now for end in ends.get(p.name, []))]
    return unheld, sum(len(ends.get(p.name, [])) for p in unheld)


def remove_unless_leased(
    ckpt_dir: Path,
    path: Path,
    name: str,
    *,
    emit: Emit,
    reason: str,
    on_reject: leases.OnReject | None = None,
) -> bool:
    """Delete one checkpoint (a directory, or a single file) that no lease held at the last
    look, journaling ``checkpoint_removed``; returns whether it was deleted. It is renamed
    aside first and the leases of ``name`` (see :func:`journal.checkpoints.leases.checkpoint_name`) are
    looked at once more: a lease taken between the two looks wins and it is put back."""
    aside = path.with_name(REMOVING_PREFIX + path.name)
    os.rename(path, aside)
    if leases.leased(ckpt_dir, {name}, on_reject=on_reject):  # leased since: it stays
        os.rename(aside, path)
        return False
    emit("checkpoint_removed", {"checkpoint_path": str(path), "reason": reason})
    _delete(aside)
    return True


def _delete(aside: Path) -> None:
    """Delete a checkpoint renamed aside: a directory with what it holds, else the file (or a
    link, never what it points to)."""
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)


def _why(keep_last_n: int) -> str:
    return f"rotation: keep_last_n={keep_last_n}, not the best, not leased"


def finish_interrupted_removals(ckpt_dir: Path, emit: Emit, root: Path | None = None) -> None:
    """A crash between renaming aside and deleting leaves ``.removing-*`` (a checkpoint
    directory, or a single file such as Lightning's ``.ckpt``) in ``root`` (default: the
    run's ``checkpoints/``): finish the job, journaling each as removed."""
    root = checkpoints_dir(ckpt_dir) if root is None else root
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith(REMOVING_PREFIX):
            original = root / name.removeprefix(REMOVING_PREFIX)
            reason = "rotation (finishing an interrupted removal)"
            emit("checkpoint_removed", {"checkpoint_path": str(original), "reason": reason})
            _delete(root / name)
