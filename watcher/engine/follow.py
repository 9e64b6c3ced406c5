"""Following the journal: where to start, reading what is new, noticing replacement.

The start position is a saved cursor when there is one, else the start of the file, or its
current end (``"now"``), or an explicit byte offset (the embedded watcher, which delivers
only its own launch's records). Rotation (a journal moved away, replaced, or truncated in
place) is followed as ``ilab-journal tail -f`` follows it: journal/read/tailing.py reads what the
old file still held, then the new one from its beginning.
:class:`RunProgress` says whether more records can come.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any, Literal

from journal import store
from journal.record.record import Record
from journal.rundir.lock import run_holder
from journal.store import Cursor, ReadBatch, end_of_complete_lines, first_line_fingerprint
from journal.views.query import relaunch_coming
from watcher.engine.cursor import CursorState
from watcher.engine.wake import Waker

log = logging.getLogger("watcher")

#: Where delivery begins when no cursor is saved; an int is a byte offset (cursor ignored).
StartAt = Literal["start", "now"] | int


class JournalFollower:
    """Reads complete records from the journal as it grows."""

    def __init__(self, journal: Path, *, poll: float | None) -> None:
        self.journal = journal
        self.waker = Waker(journal, poll=poll)
        self.reader = store.follow(journal)

    def start_state(self, start: StartAt, saved: CursorState | None, notice: Any) -> CursorState:
        """The cursor state to begin from (and position the reader there)."""
        fp = self.fingerprint()
        if isinstance(start, int):
            state = CursorState(at=Cursor(start), fingerprint=fp)
        elif saved is not None:
            if saved.fingerprint and fp and saved.fingerprint != fp:
                notice(f"{self.journal} was replaced since the cursor was saved; starting over")
                state = CursorState(fingerprint=fp)
            else:
                state = saved
                state.fingerprint = saved.fingerprint or fp
        elif start == "now":
            state = CursorState(at=Cursor(end_of_complete_lines(self.journal)), fingerprint=fp)
        else:
            state = CursorState(fingerprint=fp)
        self.reader.seek(state.at)
        log.info("positioned at byte %d (line %d) of %s", *astuple(state.at), self.journal)
        return state

    def history(self) -> list[Record]:
        """Every record before the start position (for callbacks that rebuild state)."""
        if not self.reader.offset:
            return []
        return store.read(self.journal, max_bytes=self.reader.offset).records

    def read(self, *, final: bool, max_bytes: int | None = None) -> ReadBatch:
        """New complete records (``final``: the writer is gone, a torn tail is consumed),
        about ``max_bytes`` of them at most (at least one line)."""
        return self.reader.read(final=final, max_bytes=max_bytes)

    @property
    def position(self) -> Cursor:
        """Just past what has been read."""
        return self.reader.cursor

    def fingerprint(self) -> str | None:
        """A hash of the first line: tells a replaced journal from a grown one (the index's
        own, journal/read/lines.py: None for a symlink, never followed)."""
        return first_line_fingerprint(self.journal)

    def check_identity(self) -> str | None:
        """``"replaced"`` or ``"truncated"`` once the reader went over to the file now at
        the path, from byte 0 (the old one read to its end first), else None."""
        return self.reader.check()

    def close(self) -> None:
        """Stop reading: the journal let go of, and the process checking its backlog ahead
        (journal/read/precheck.py), if any, stopped."""
        self.reader.close()


@dataclass
class RunProgress:
    """How far the followed run is, as the delivery threads see it.

    The engine's thread sets ``ended``; ``writer_gone`` may be set from any thread."""

    follow: bool  # False: a replay, the file is all there is
    ended: bool = False  # train_end seen, and no train_begin (a resumed attempt) after it
    writer_gone: threading.Event = field(default_factory=threading.Event)
    relaunch: bool = False  # that train_end's attempt failed with restarts left

    def set_ended(self, ended: bool, journal: Path) -> None:
        self.ended, self.relaunch = ended, ended and relaunch_coming(journal)

    def done(self, journal: Path) -> bool:
        """``train_end`` seen, and no relaunch to come: none is left, or the launcher no
        longer holds the run dir (it gave up, or is gone)."""
        return self.ended and not (self.relaunch and run_holder(journal.parent))

    @property
    def final(self) -> bool:
        """No more records can come: read to the end, torn tail included."""
        return not self.follow or self.writer_gone.is_set()

    @property
    def over(self) -> bool:
        """No trainer writes this run any more (it rotates no checkpoint either)."""
        return self.ended or self.final
