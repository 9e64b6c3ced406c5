"""A journal deleted or replaced under its writer: notice it, say so, start a new one.

Without this, a writer whose ``journal.jsonl`` was deleted (``rm``, a cleanup script) keeps
appending to the unlinked file: every later record vanishes with it, and the run is later
found with no journal (or one record written by someone else). The writer compares its
path's inode with the file it writes before every durable record and at most once a second
otherwise (a ``stat`` costs about as much as the append it guards). On a mismatch it warns
in one line and writes on at the path, first a ``journal_gap`` record (``cause``
``journal_deleted`` or ``journal_replaced``) naming the seqs that went with the old file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from journal.rundir.safety import APPEND, DEVICES, check_run_dir, make_dir, open_no_follow

log = logging.getLogger("journal.write.writer")

#: Between durable records, the journal's path is checked at most this often (seconds).
PATH_CHECK_S = 1.0


def identity(fd: int) -> tuple[int, int]:
    """(device, inode) of an open file."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def first_seq(path: Path, default: int) -> int:
    """The seq of the file's first record (``default`` when it has none): where the records
    that would go with this file begin."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:  # empty, or a device such as /dev/null
                return default
            rec = orjson.loads(f.readline(1 << 20))
    except (OSError, orjson.JSONDecodeError):
        return default
    seq = rec.get("seq") if isinstance(rec, dict) else None
    return seq if isinstance(seq, int) else default


class RecreatesJournal:
    """Mixin of :class:`journal.write.writer.JournalWriter`: the path check and the new file."""

    path: Path
    seq: int
    _fd: int
    _mode: int
    _ident: tuple[int, int]
    _first_seq: int
    _next_check: float
    _reopen_failed: bool
    _pending: list[tuple[Any, ...]]
    _gap: tuple[int, int, str] | None
    _torn: bool
    #: the writer's: the file's last record, a torn tail terminated
    _adopt_tail: Callable[[], dict[str, Any] | None]
    append: Callable[..., int | None]

    def _check_path(self, now: float, step: int, epoch: int, samples_seen: int) -> None:
        """Start a new journal if ours was deleted or replaced (its path no longer leads to
        the file we write): else every later record would vanish with the old file."""
        self._next_check = now + PATH_CHECK_S
        if self._fd < 0:
            return
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            st = None
        except OSError:
            return  # cannot tell (an unreadable directory): keep writing where we are
        if st is not None and (st.st_dev, st.st_ino) == self._ident:
            return
        self._reopen("deleted" if st is None else "replaced", (step, epoch, samples_seen))

    def _open(self) -> int:
        """The journal, opened to append (never through a symlink), its run dir made and
        checked first (:mod:`journal.rundir.safety`)."""
        make_dir(self.path.parent)
        check_run_dir(self.path.parent)
        return open_no_follow(self.path, APPEND, self._mode, root=self.path.parent, kinds=DEVICES)

    def _reopen(self, cause: str, position: tuple[int, int, int]) -> None:
        """Write on at ``self.path`` (a new file, or the one now there), first a
        ``journal_gap`` record naming the records that went with the old file."""
        lost_first, lost_last = self._first_seq, self.seq - 1
        try:
            fd = self._open()  # the whole run dir may have gone
        except OSError as exc:  # UnsafeRunDir included: never write where others steer
            if not self._reopen_failed:
                self._reopen_failed = True
                log.warning(
                    "journal %s was %s while this run was writing it and cannot be started "
                    "again (%s); records go on into the old file",
                    self.path,
                    cause,
                    exc,
                )
            return
        old, self._fd = self._fd, fd
        os.close(old)
        self._ident = identity(fd)
        self._reopen_failed = False
        # Deferred and failed records went with the old file: the gap below counts them.
        self._pending.clear()
        self._gap, self._torn = None, False
        try:
            last = self._adopt_tail()  # a replacement may hold records: write after them
        except OSError:
            last, self._torn = None, True
        if last is not None:
            self.seq = max(self.seq, last["seq"] + 1)
        self._first_seq = first_seq(self.path, self.seq)
        log.warning(
            "journal %s was %s while this run was writing it: writing a new one; records "
            "seq %d..%d went with the old file (a journal_gap record says so)",
            self.path,
            cause,
            lost_first,
            lost_last,
        )
        if lost_last < lost_first:
            return  # nothing was written before: nothing lost
        gap = {
            "dropped": lost_last - lost_first + 1,
            "first_seq": lost_first,
            "last_seq": lost_last,
            "error": f"{self.path.name} was {cause} while the run was writing it",
            "cause": f"journal_{cause}",
        }
        step, epoch, samples_seen = position
        self.append("journal_gap", gap, step=step, epoch=epoch, samples_seen=samples_seen)
