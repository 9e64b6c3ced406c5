"""Where things live inside a checkpoint directory, and resolving user-given paths."""

from __future__ import annotations

import os
from pathlib import Path

JOURNAL_NAME = "journal.jsonl"
CONTROL_DIR_NAME = "control"


class JournalNotFound(Exception):
    """A user-given path does not lead to a readable journal (one clear line, no traceback)."""


def journal_path(ckpt_dir: str | os.PathLike[str]) -> Path:
    """The journal file of a checkpoint directory."""
    return Path(ckpt_dir) / JOURNAL_NAME


def control_dir(ckpt_dir: str | os.PathLike[str]) -> Path:
    """The control directory of a checkpoint directory."""
    return Path(ckpt_dir) / CONTROL_DIR_NAME


def resolve_journal(path: str | os.PathLike[str], *, must_exist: bool = True) -> Path:
    """Accept a checkpoint dir or a journal file path; return the journal file path.

    Raises :class:`JournalNotFound` with a message fit for a user when it is missing,
    unreadable or obviously not a journal.
    """
    p = Path(path)
    if p.is_dir():
        p = p / JOURNAL_NAME
        if not must_exist:
            return p
        if not p.exists():
            raise JournalNotFound(f"{path}: no {JOURNAL_NAME} in this directory (not started yet?)")
    elif not p.exists():
        if not must_exist and p.parent.is_dir():
            return p
        raise JournalNotFound(f"{path}: no such file or directory")
    if not p.is_file():
        raise JournalNotFound(f"{p}: not a regular file")
    if not os.access(p, os.R_OK):
        raise JournalNotFound(f"{p}: permission denied")
    return p
