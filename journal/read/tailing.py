"""Following a journal across log rotation: ``ilab-journal tail -f`` and ``ilab-watch``.

The file being read is held open. A journal moved away (``mv``, logrotate) is still read
through that descriptor: the records its writer appended there after the move, before it
noticed and started a new journal at the path (journal/write/recreate.py), are not lost. The file
now at the path takes over once it holds a complete line (the writer writes there only
after it stopped writing the old one) and the old one has been read to its end.

A big backlog (a replay, a watcher far behind) is checked ahead in a second process while
it is read (journal/read/precheck.py): the same records, read faster where a core is free.

A journal truncated in place (logrotate's ``copytruncate``) is noticed by its size falling
below the read position, or by a different first line (it grew back past that position
before the next look). What had not been read yet is read from the copy beside it
(``journal.jsonl.1``, or any ``journal.jsonl*`` that begins with the same first line), then
reading starts over at byte 0. Records written between the copy and the truncation are in
neither file: no reader can have them (the writer's seq shows the gap).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from journal.read.cursor import START, Cursor
from journal.read.lines import open_for_reading
from journal.read.precheck import MIN_BACKLOG, Precheck, start_precheck
from journal.read.reader import JournalReader, ReadBatch

#: How much of the first line tells one journal from another (a record starts with its seq
#: and ts, so two journals never share it).
HEAD_BYTES = 4096


def _head(fd: int) -> bytes | None:
    """The file's first line (at most ``HEAD_BYTES`` of it); None while it has none."""
    try:
        head = os.pread(fd, HEAD_BYTES, 0)
    except OSError:  # not a regular file (a FIFO planted there): nothing to tell by
        return None
    nl = head.find(b"\n")
    if nl >= 0:
        return head[: nl + 1]
    return head if len(head) == HEAD_BYTES else None


class RotatingReader:
    """Reads complete records from a journal as it grows, across rotation (module doc)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        cursor: Cursor = START,
        *,
        precheck: int | None = MIN_BACKLOG,
    ) -> None:
        """``precheck``: the backlog (bytes) from which a read is checked ahead in a second
        process (journal/read/precheck.py); None: never."""
        offset, line_no = cursor.offset, cursor.line_no
        self.path = Path(path)
        self.reader: JournalReader = JournalReader(self.path, offset, line_no)
        self._precheck_from = precheck
        self._precheck: Precheck | None = None  # checking the held file ahead of the reader
        self._prechecked = False  # the held file's backlog was looked at (once per reader)
        self._held: int | None = None  # the descriptor of the file being read
        self._ident: tuple[int, int] | None = None
        self._head: bytes | None = None  # the held file's first line, once it has one
        self._finished = False  # the held file gets no more records: read it to its end
        self._cause = "replaced"  # what the next switch to the path's file reports
        self._hold_path(offset, line_no)

    @property
    def offset(self) -> int:
        return self.reader.offset

    @property
    def line_no(self) -> int:
        return self.reader.line_no

    @property
    def cursor(self) -> Cursor:
        """Where the next read starts (of the file being read)."""
        return Cursor(self.reader.offset, self.reader.line_no)

    def seek(self, cursor: Cursor) -> None:
        """Go on from ``cursor`` (its offset a line start) of the file at the path."""
        offset, line_no = cursor.offset, cursor.line_no
        self.close()
        self.reader = JournalReader(self.path, offset, line_no)
        self._hold_path(offset, line_no)

    def read(self, *, final: bool = False, max_bytes: int | None = None) -> ReadBatch:
        """New complete records (``final``: no writer any more, a torn tail is consumed)."""
        if self._held is None:
            self._hold_path(self.reader.offset, self.reader.line_no)
        if not self._prechecked and self._held is not None:
            self._start_precheck(self._held)
        batch = self.reader.read(final=final or self._finished, max_bytes=max_bytes)
        if self._precheck is not None and self.reader.offset >= self._precheck.end:
            self._stop_precheck()  # read past all it could vouch for
        return batch

    @property
    def checker(self) -> Precheck | None:
        """The process checking the backlog ahead of this reader, while there is one."""
        return self._precheck

    def check(self) -> str | None:
        """``"replaced"`` or ``"truncated"`` once reading went over to the file at the path,
        from its start (what the old one held was read first); else None. Call it before
        each :meth:`read`."""
        if self._held is None:
            self._hold_path(self.reader.offset, self.reader.line_no)
            return None
        held = os.fstat(self._held)
        try:
            st = os.stat(self.path)
        except OSError:  # moved or deleted (its writer goes on in the held file for a while),
            return None  # or cannot tell now
        if (st.st_dev, st.st_ino) != self._ident:
            if not self._path_has_a_line():
                return None  # the writer may still write to the held file
            self._finished = True
            if self.reader.offset < held.st_size:
                return None  # read the rest of the held file first (the next read)
            cause, self._cause = self._cause, "replaced"
            self._hold_path(0, 0)
            return cause
        head = _head(self._held)
        if self._head is None:
            self._head = head
        if held.st_size >= self.reader.offset and head == self._head:
            return None
        # Truncated in place. A file that had a complete first line and now has another
        # (or none) was rewritten, even when it grew back past the read position.
        if self._hold_copy():
            self._cause = "truncated"
            return None  # the copy is read to its end, then the path's file from byte 0
        self._stop_precheck()  # it vouched for what the file held before
        self._prechecked = False  # the new backlog may have one of its own
        self.reader = JournalReader(self.path, held=self._held)
        self._head = head
        return "truncated"

    def close(self) -> None:
        """Let go of the held file (and stop checking it ahead)."""
        self._stop_precheck()
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -- internals ----------------------------------------------------------------------

    def _hold_path(self, offset: int, line_no: int) -> None:
        """Hold the file at the path (if any) and read it from ``offset``."""
        try:
            fd = open_for_reading(self.path)
        except OSError:
            return  # not there yet: read() finds nothing, check() holds it later
        self._hold(fd, offset, line_no)

    def _hold(self, fd: int, offset: int, line_no: int) -> None:
        self.close()
        self._held = fd
        st = os.fstat(fd)
        self._ident = (st.st_dev, st.st_ino)
        self._head = _head(fd)
        self._finished = False
        self._prechecked = False  # its backlog is looked at by the first read
        self.reader = JournalReader(self.path, offset, line_no, held=fd)

    def _start_precheck(self, fd: int) -> None:
        """Check the held file's backlog ahead of the reader when it is big (once)."""
        self._prechecked = True
        if self._precheck_from is None:
            return
        self._precheck = start_precheck(fd, self.reader.offset, min_backlog=self._precheck_from)
        self.reader.vouched = self._precheck

    def _stop_precheck(self) -> None:
        """Stop the checker (if any); the reader it served reads on by itself."""
        precheck, self._precheck = self._precheck, None
        if precheck is not None:
            self.reader.vouched = None
            precheck.close()

    def _path_has_a_line(self) -> bool:
        try:
            fd = open_for_reading(self.path)
        except OSError:
            return False
        try:
            return _head(fd) is not None
        finally:
            os.close(fd)

    def _hold_copy(self) -> bool:
        """Hold the copy of the truncated journal (same first line, more bytes than were
        read) at the read position, to read it to its end. False when there is none."""
        if self._head is None:
            return False
        name, offset, line_no = self.path.name, self.reader.offset, self.reader.line_no
        with contextlib.suppress(OSError):
            for p in sorted(self.path.parent.iterdir()):
                if p.name == name or not p.name.startswith(name):
                    continue
                with contextlib.suppress(OSError):
                    if not stat.S_ISREG(p.lstat().st_mode):
                        continue
                    fd = open_for_reading(p)
                    try:
                        same = os.fstat(fd).st_size > offset and _head(fd) == self._head
                    except OSError:
                        same = False
                    if same:
                        self._hold(fd, offset, line_no)
                        self._finished = True  # a copy does not grow
                        return True
                    os.close(fd)
        return False
