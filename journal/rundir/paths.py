"""Where things live inside a checkpoint directory, and resolving user-given paths.

The one place for file and directory names: every other module asks here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

JOURNAL_NAME = "journal.jsonl"
CONTROL_DIR_NAME = "control"
PROCESSED_DIR_NAME = "processed"  # inside control/: commands already handled
CHECKPOINTS_DIR_NAME = "checkpoints"
LOGS_DIR_NAME = "logs"
WATCH_DIR_NAME = "watch"  # watcher cursors, results and delivery logs
LEASES_DIR_NAME = "leases"  # one file per checkpoint lease
ALERTS_DIR_NAME = "alerts"  # evidence per alert; the ledger: claims/, guards/
REPORTS_DIR_NAME = "reports"  # reports waiting for the journal's writer
LOCK_NAME = "journal.lock"  # held by whoever writes the journal
INDEX_NAME = "journal.index.json"  # a cache of what status needs (see journal/views/index.py)
RESERVE_NAME = "journal.reserve"  # disk kept back for the last records of a full disk
RUN_LOCK_NAME = "run.lock"  # held by the launcher of the run in progress


#: ilab-train's ``step-NNNNNN`` (under checkpoints/), HF Trainer's ``checkpoint-N`` (in the
#: run dir itself, when the journal sits in its output_dir).
_STEP_DIR = re.compile(r"^(?:step|checkpoint)-(\d+)$")
HF_CHECKPOINT_PREFIX = "checkpoint-"
#: Inside an ilab-train checkpoint: ``full_state/trainer_state.json`` names the run that saved
#: it; DCP writes ``full_state/.metadata`` last, so a checkpoint without it is incomplete.
FULL_STATE_DIR_NAME = "full_state"
TRAINER_STATE_NAME = "trainer_state.json"
DCP_METADATA_NAME = ".metadata"
#: Lightning's single-file checkpoints (``epoch=0-step=4.ckpt``), anywhere in the run dir.
CHECKPOINT_FILE_SUFFIX = ".ckpt"


def step_dir_name(step: int) -> str:
    """``step-000040``: zero-padded so names sort in step order."""
    return f"step-{step:06d}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint directory named ``step-NNNNNN`` (or HF's ``checkpoint-N``),
    or None for other names."""
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


def is_checkpoint_file(name: str) -> bool:
    """Whether a file of this name is a single-file checkpoint (Lightning's ``.ckpt``)."""
    return name.endswith(CHECKPOINT_FILE_SUFFIX) and len(name) > len(CHECKPOINT_FILE_SUFFIX)


def checkpoint_key(path: str) -> str:
    """A checkpoint's identity inside one run (best-checkpoint tracking, the watcher's
    removal notes): its ``step-NNNNNN`` name, which stays the same however the run dir is
    spelled; the normalized path for checkpoints named otherwise."""
    name = Path(path).name
    return name if checkpoint_step(name) is not None else os.path.normpath(path)


def canonical_checkpoint(ckpt_dir: str | os.PathLike[str] | None, path: str) -> str:
    """A checkpoint's path in one spelling, whatever the process that journaled it was given
    (relative to its own working directory, ``./``, a trailing slash, a symlink): a
    ``step-NNNNNN`` (``checkpoint-N``) is where the run dir ``ckpt_dir`` keeps it, absolute
    and with links resolved; any other path is normalized (absolute ones resolved too)."""
    name = Path(path).name
    if ckpt_dir is not None and checkpoint_step(name) is not None:
        return str(checkpoint_root(os.path.realpath(ckpt_dir), name) / name)
    return os.path.realpath(path) if os.path.isabs(path) else os.path.normpath(path)


def in_run_dir(ckpt_dir: str | os.PathLike[str], path: str) -> bool:
    """Whether a journaled checkpoint path can be one of the run dir's: a ``step-NNNNNN``
    (``checkpoint-N``) is, by its name (see :func:`canonical_checkpoint`); any other when it
    lies inside the run dir or its ``checkpoints/`` (which may link to other storage), links
    resolved. A path elsewhere (``/etc``) never is, whatever a record says."""
    if checkpoint_step(Path(path).name) is not None:
        return True
    real = os.path.realpath(path)
    roots = (ckpt_dir, checkpoints_dir(ckpt_dir))
    return any(real.startswith(os.path.join(os.path.realpath(r), "")) for r in roots)


def checkpoint_root(ckpt_dir: str | os.PathLike[str], name: str) -> Path:
    """The directory that holds a checkpoint of this name: ``checkpoints/`` for ilab-train's,
    the run dir itself for HF Trainer's ``checkpoint-N``."""
    if name.startswith(HF_CHECKPOINT_PREFIX):
        return Path(ckpt_dir)
    return checkpoints_dir(ckpt_dir)


class JournalNotFound(Exception):
    """A user-given path does not lead to a readable journal (one clear line, no traceback)."""


def journal_path(ckpt_dir: str | os.PathLike[str]) -> Path:
    """The journal file of a checkpoint directory."""
    return Path(ckpt_dir) / JOURNAL_NAME


def control_dir(ckpt_dir: str | os.PathLike[str]) -> Path:
    """The control directory of a checkpoint directory."""
    return Path(ckpt_dir) / CONTROL_DIR_NAME


def checkpoints_dir(ckpt_dir: str | os.PathLike[str]) -> Path:
    """Where ``step-NNNNNN`` checkpoints live."""
    return Path(ckpt_dir) / CHECKPOINTS_DIR_NAME


def logs_dir(ckpt_dir: str | os.PathLike[str]) -> Path:
    """Launcher and per-rank logs."""
    return Path(ckpt_dir) / LOGS_DIR_NAME


def rank_log_path(ckpt_dir: str | os.PathLike[str], rank: int) -> Path:
    """What one rank logs (every attempt's, appended): what a failure alert quotes."""
    return logs_dir(ckpt_dir) / f"rank-{rank}.log"


def watch_dir(ckpt_dir: str | os.PathLike[str]) -> Path:
    """Default state directory of watchers (cursors, results, delivery logs)."""
    return Path(ckpt_dir) / WATCH_DIR_NAME


def callbacks_progress_path(ckpt_dir: str | os.PathLike[str]) -> Path:
    """The step up to which the launcher's paced callbacks have handled the journal (rank 0
    waits on it before a step's all-reduce: trainer/steering/callback_pacing.py)."""
    return watch_dir(ckpt_dir) / "embedded.progress"


def leases_dir(ckpt_dir: str | os.PathLike[str]) -> Path:
    """Lease files that keep checkpoints from rotation."""
    return Path(ckpt_dir) / LEASES_DIR_NAME


def reports_dir(ckpt_dir: str | os.PathLike[str]) -> Path:
    """Reports handed to the journal's current writer (the inbox)."""
    return Path(ckpt_dir) / REPORTS_DIR_NAME


def lock_path(ckpt_dir: str | os.PathLike[str]) -> Path:
    """The lock file whose holder is the journal's one writer."""
    return Path(ckpt_dir) / LOCK_NAME


def run_lock_path(ckpt_dir: str | os.PathLike[str]) -> Path:
    """The lock file whose holder is the launcher of the run in progress."""
    return Path(ckpt_dir) / RUN_LOCK_NAME


def ckpt_dir_of(path: str | os.PathLike[str]) -> Path:
    """A checkpoint dir given as itself or as its journal file (see :func:`resolve_journal`)."""
    return resolve_journal(path, must_exist=False).parent


def resolve_journal(path: str | os.PathLike[str], *, must_exist: bool = True) -> Path:
    """Accept a checkpoint dir or a journal file path; return the journal file path.

    Every command and API that takes a user's path asks here. Raises
    :class:`JournalNotFound` with a message fit for a user when it is missing, unreadable or
    obviously not a journal. With ``must_exist=False`` (a writer, or a follower of a run
    that has not started) nothing is checked: a directory, or a missing path that does not
    end in ``.jsonl``, is a run dir; anything else is the journal itself.
    """
    p = Path(path)
    if not must_exist:
        is_file = (p.suffix == ".jsonl" or p.exists()) and not p.is_dir()
        return p if is_file else p / JOURNAL_NAME
    if p.is_dir():
        p = p / JOURNAL_NAME
        if not p.exists():
            raise JournalNotFound(f"{path}: no {JOURNAL_NAME} in this directory (not started yet?)")
    elif not p.exists():
        raise JournalNotFound(f"{path}: no such file or directory")
    if not p.is_file():
        raise JournalNotFound(f"{p}: not a regular file")
    if not os.access(p, os.R_OK):
        raise JournalNotFound(f"{p}: permission denied")
    return p
