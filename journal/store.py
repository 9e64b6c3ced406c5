"""The run-directory store: the one way into and out of a run dir's journal.

**Reading.** trainer/ and watcher/ import nothing of journal.read or journal.write: the
cursor, the readers they use and the writer's type are taken from here. Every reader that goes on from where it was (``tail -f``, ``serve``, ``check
--wait``, the watcher, the launcher) asks the store with a typed
:class:`~journal.read.cursor.Cursor`: :func:`read` once from a cursor, or :func:`follow`
from a cursor across rotation (``mv``, logrotate's ``copytruncate``) and recreation (a
journal deleted under its writer). The index behind ``status`` and the scans sit below the
store (the writer keeps the index) and use the same readers (journal/read/).

**The tail.** :func:`tail` answers the end of a run's journal in one backward read by one
rule: its last record, its last trainer record, whether its last attempt ended.

**Opening an attempt.** :func:`open_attempt` holds the journal lock, reads the tail once,
decides whether the attempt goes on with the journal's run (:func:`continues_run`) and
from which checkpoint, and hands back the writer with what the attempt must know: the
command ids already answered (the checkpoints, the best among them, are the writer's live
fold: :meth:`~journal.write.writer.JournalWriter.live_fold`).

**Writing.** Three kinds of writers append to a run's journal, and all go through here:

- the **attempt's writer**: rank 0 of a training attempt (or a bridge's trainer) holds the
  journal lock for the whole attempt and appends every lifecycle record
  (:func:`open_attempt`);
- **guests**: processes that append a few records to an attempt that is over, or that is
  between records of its own: reports and scheduler jobs handed in after training
  (:mod:`journal.channels.reports`), a finished run's rotation (``prune``, the watcher),
  the watcher's verdict on a command returned at ``train_end``, and the launcher's
  ``train_end`` for workers that died without one (:func:`guest`);
- a mirrored run's **replica** (journal/remote/replica.py), which holds the journal lock
  as its trainer would and copies the run's journal line for line (:func:`append_copied`).

A guest takes the journal lock for as long as its records take, joins the last record's
attempt (same run id and attempt; steps go on from the last record's) and lets go. So the
single-writer rule and the position a late record gets are decided in one place, not by
each caller with its own lock and writer. ``tests/test_structure.py`` fails when a
:class:`~journal.write.writer.JournalWriter` is built anywhere else in the packages.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from journal.checkpoints.rotation import (
    checkpoint_run_id,
    latest_checkpoint,
    list_checkpoints,
    rotate,
)
from journal.read.cursor import START, Cursor
from journal.read.lines import Tail, read_tail
from journal.read.lines import first_line_fingerprint as first_line_fingerprint
from journal.read.reader import JournalReader, ReadBatch, iter_events
from journal.read.reader import end_of_complete_lines as end_of_complete_lines
from journal.read.reader import iter_batches as iter_batches
from journal.read.reader import iter_records as iter_records
from journal.read.tailing import RotatingReader
from journal.rundir.lock import JournalLock, JournalLocked
from journal.rundir.paths import journal_path, resolve_journal
from journal.rundir.safety import APPEND, open_no_follow
from journal.write.writer import JournalWriter

#: ``"auto"``: resume from the journal's run's newest complete checkpoint (see
#: :func:`journal.checkpoints.rotation.latest_checkpoint`); ``"never"``: a new run; a bool:
#: the trainer decided itself (a bridge: HF resumed from ``checkpoint-N``).
Resume = Literal["auto", "never"] | bool


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
    held = JournalLock(path, role=role) if lock is None else lock
    if lock is None:
        held.acquire(timeout=timeout)
    writer = GuestWriter(path)
    try:
        yield writer
    finally:
        try:
            writer.close()
        finally:
            if lock is None:  # ours: the caller's stays held
                held.release()


def tail(journal: str | os.PathLike[str], end: int | None = None) -> Tail:
    """The end of ``journal`` (a run dir or its journal file; ``end``: up to that byte):
    its last record, its last trainer record, whether its last attempt ended
    (:class:`~journal.read.lines.Tail`)."""
    return read_tail(_journal_file(journal), end=end)


def continues_run(last: Mapping[str, Any] | None, resumes: bool) -> bool:
    """The resume rule: whether this attempt continues the run of the journal's last trainer
    record ``last`` (not a late report) with ``attempt`` + 1 rather than start a new run:
    when that run did not end (killed: no ``train_end`` last) or when this attempt resumes
    it (from a checkpoint, or its launcher relaunches it); never without a journal."""
    return last is not None and (resumes or last.get("event") != "train_end")


@dataclass
class Attempt:
    """An attempt opened by :func:`open_attempt`: its lock (held), its writer (None when it
    journals nothing), its run, the checkpoint it resumes from and the command ids the
    journal answered already."""

    lock: JournalLock
    writer: JournalWriter | None
    run_id: str
    resume_from: Path | None = None
    commands_seen: set[str] = field(default_factory=set)


def open_attempt(
    ckpt_dir: str | os.PathLike[str],
    resume: Resume,
    role: str,
    *,
    relaunch: bool = False,
    records: bool = True,
    wait: float = 0.0,
    reserve_bytes: int = 0,
) -> Attempt:
    """Open a training attempt on ``ckpt_dir`` as ``role``: take the journal lock (waiting
    up to ``wait`` seconds; :class:`~journal.rundir.lock.JournalLocked` after), read the
    tail once, decide by :func:`continues_run` whether the attempt goes on with the
    journal's run (``resume="auto"``: from its newest complete checkpoint; with no journal,
    that checkpoint's run is adopted; ``relaunch``: its launcher launches it again), open
    the writer (``records``; ``reserve_bytes`` of disk held for ``train_end``) and read
    forward once for the command ids answered."""
    given = Path(ckpt_dir)
    lock = JournalLock(run_dir(given), role=role)
    lock.acquire(timeout=wait)
    try:
        jpath = journal_path(run_dir(given))
        known = resume != "never" and jpath.exists()
        end = read_tail(jpath, torn=True)
        last = end.trainer if known else None  # a late report is not it
        run = end.run_id if last else None  # None: no journal says which run
        # the journal's run goes on from its own checkpoint (no journal: that checkpoint's)
        ckpt = latest_checkpoint(given, run) if resume == "auto" else None
        adopted = checkpoint_run_id(ckpt) if ckpt is not None and run is None else None
        again = continues_run(last, ckpt is not None or resume is True or relaunch)
        writer = None
        if records:
            writer = JournalWriter(
                run_dir(given), resume=again, run_id=adopted, reserve_bytes=reserve_bytes, tail=end
            )
        fallback = (run if again else None) or adopted or uuid.uuid4().hex[:12]  # no records
        attempt = Attempt(lock, writer, writer.run_id if writer else fallback, ckpt)
        for rec in iter_events(jpath, {"control"}) if known else ():
            if isinstance(rec["data"].get("id"), str):
                attempt.commands_seen.add(rec["data"]["id"])
        return attempt
    except BaseException:
        lock.release()
        raise


def prune_finished_run(ckpt_dir: Path, *, role: str) -> list[Path]:
    """Rotate the run of the last ``train_begin`` when no trainer is writing, by its policy
    (``keep_last_n``, ``keep_best``) and among its own checkpoints, journaling each
    deletion as a guest. Does nothing while a trainer holds the journal: it rotates at its
    next save. The run is its fold (the index and what came since: one read)."""
    from journal.views import index

    ckpt_dir = run_dir(ckpt_dir)  # journaled paths in one spelling (absolute, resolved)
    folded = index.summarize(journal_path(ckpt_dir))
    run_id, keep_last_n = folded.fold.run_id, folded.fold.summarizer.summary.keep_last_n
    if run_id is None or keep_last_n is None:
        return []
    if len(list_checkpoints(ckpt_dir, run_id=run_id)) <= keep_last_n:
        return []  # the common case: nothing surplus, no lock
    try:
        with guest(ckpt_dir, role=role) as w:

            def emit(event: str, data: dict[str, Any]) -> None:
                if event == "checkpoint_removed":
                    data = {**data, "by": role}  # who removed it, for the run's story
                w.append(event, data)

            fold = index.fold(journal_path(ckpt_dir), folded, final=True).fold  # and since
            goal = fold.keep_best()
            best = fold.best(goal, ckpt_dir) if goal is not None else None
            keep = {Path(best.checkpoint_path).name} if best else set()
            return rotate(ckpt_dir, keep_last_n, keep=keep, emit=emit, run_id=fold.run_id)
    except JournalLocked:  # a trainer writes: it rotates at its next save
        return []


def append_copied(
    ckpt_dir: str | os.PathLike[str], lines: bytes, *, cut_at: int | None = None
) -> int:
    """Append ``lines`` as they are: whole records copied from another run dir's journal
    (a mirrored run's replica, whose copier holds the journal lock as its trainer would),
    after cutting the journal at byte ``cut_at`` (what a copy killed before it noted how
    far it was appended). Returns the journal's size."""
    path = run_dir(ckpt_dir)
    with open(open_no_follow(journal_path(path), APPEND, root=path), "ab") as f:
        if cut_at is not None:
            f.truncate(cut_at)
        f.write(lines)
    return journal_path(path).stat().st_size


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
