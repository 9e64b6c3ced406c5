"""The run-directory store: the one way into and out of a run dir's journal.

**Reading.** Every reader that goes on from where it was (``tail -f``, ``serve``, ``check
--wait``, the watcher, the launcher) asks the store with a typed
:class:`~journal.read.cursor.Cursor`: :func:`read` once from a cursor, or :func:`follow`
from a cursor across rotation (``mv``, logrotate's ``copytruncate``) and recreation (a
journal deleted under its writer). The index behind ``status`` and the scans sit below the
store (the writer keeps the index) and use the same readers (journal/read/).

**Writing.** Two kinds of writers append to a run's journal, and both go through here:

- the **attempt's writer**: rank 0 of a training attempt (or a bridge's trainer) holds the
  journal lock for the whole attempt and appends every lifecycle record
  (:func:`attempt_writer`);
- **guests**: processes that append a few records to an attempt that is over, or that is
  between records of its own: reports and scheduler jobs handed in after training
  (:mod:`journal.channels.reports`), a finished run's rotation (``prune``, the watcher),
  the watcher's verdict on a command returned at ``train_end``, and the launcher's
  ``train_end`` for workers that died without one (:func:`guest`).

A guest takes the journal lock for as long as its records take, joins the last record's
attempt (same run id and attempt; steps go on from the last record's) and lets go. So the
single-writer rule and the position a late record gets are decided in one place, not by
each caller with its own lock and writer. ``tests/test_structure.py`` fails when a
:class:`~journal.write.writer.JournalWriter` is built anywhere else in the packages.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from journal.read.cursor import START, Cursor
from journal.read.reader import JournalReader, ReadBatch
from journal.read.tailing import RotatingReader
from journal.rundir.lock import JournalLock
from journal.rundir.paths import resolve_journal
from journal.write.writer import JournalWriter


def run_dir(path: str | os.PathLike[str]) -> Path:
    """A run dir in its one spelling (absolute, links resolved): the paths a writer
    journals (a checkpoint's, a removal's) are the same whichever way a process was given
    the directory (relative to its working directory, ``./``, a trailing slash, a symlink)."""
    return Path(os.path.realpath(path))


class GuestWriter:
    """Appends records to the last attempt of a run whose journal lock the guest holds; the
    journal is opened on the first record (a guest with nothing to say never opens it)."""

    def __init__(self, ckpt_dir: Path) -> None:
        self.ckpt_dir = ckpt_dir
        self._writer: JournalWriter | None = None

    def append(self, event: str, data: Mapping[str, Any]) -> int | None:
        """Append one record at the last record's position (run id, attempt, step); returns
        its ``seq`` (None when it could not be written: see the writer's ``on_error``)."""
        if self._writer is None:
            self._writer = JournalWriter(self.ckpt_dir, join=True)
        return self._writer.append_at_last_position(event, data)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


@contextmanager
def guest(
    ckpt_dir: str | os.PathLike[str],
    *,
    role: str,
    timeout: float = 0.0,
    lock: JournalLock | None = None,
) -> Iterator[GuestWriter]:
    """Hold the run's journal lock as ``role`` and append as a guest (see the module's
    docstring). ``timeout``: seconds to wait for a busy lock (0: try once); raises
    :class:`~journal.rundir.lock.JournalLocked` when it stays busy (its holder, a trainer,
    journals for itself). ``lock``: one the caller already holds (it stays held)."""
    path = run_dir(ckpt_dir)
    own = lock is None
    held = JournalLock(path, role=role) if lock is None else lock
    if own:
        held.acquire(timeout=timeout)
    writer = GuestWriter(path)
    try:
        yield writer
    finally:
        try:
            writer.close()
        finally:
            if own:
                held.release()


def attempt_writer(
    ckpt_dir: str | os.PathLike[str],
    *,
    resume: bool,
    run_id: str | None,
    reserve_bytes: int,
) -> JournalWriter:
    """The journal writer of a training attempt (rank 0 or a bridge's trainer, which holds
    the journal lock for the attempt): a new run, or with ``resume`` the run of the last
    record with its next attempt."""
    return JournalWriter(
        run_dir(ckpt_dir), resume=resume, run_id=run_id, reserve_bytes=reserve_bytes
    )


def read(
    journal: str | os.PathLike[str],
    cursor: Cursor = START,
    *,
    final: bool = False,
    max_bytes: int | None = None,
) -> ReadBatch:
    """The complete records of ``journal`` (a run dir or its journal file) from ``cursor``
    on (at most ``max_bytes`` of them); the batch's ``cursor`` is where the next read
    starts. ``final``: no writer any more, so a torn last line is an invalid one."""
    reader = JournalReader(_journal_file(journal), cursor.offset, cursor.line_no)
    return reader.read(final=final, max_bytes=max_bytes)


def _journal_file(path: str | os.PathLike[str]) -> Path:
    """A journal file named as such (``*.jsonl``) is read as it is, whatever is there (a
    directory in its place is the reader's error to report); otherwise a run dir's."""
    p = Path(path)
    return p if p.suffix == ".jsonl" else resolve_journal(p, must_exist=False)


def follow(journal: str | os.PathLike[str], cursor: Cursor = START) -> RotatingReader:
    """A reader that goes on from ``cursor`` as ``journal`` grows, across rotation and
    recreation (journal/read/tailing.py): call its ``check()`` then ``read()`` in a loop;
    its ``cursor`` is what to keep."""
    return RotatingReader(_journal_file(journal), cursor)
