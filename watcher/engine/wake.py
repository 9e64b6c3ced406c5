"""Waking up when the journal changes: watchdog on the directory, plus a safety poll.

Filesystem events are only wake-ups; the reader always re-reads from its cursor. On network
and FUSE filesystems, where inotify misses remote writes, polling is chosen automatically.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from watchdog.observers.api import BaseObserver

log = logging.getLogger("watcher")

#: watchdog event types that mean the journal changed. Not "opened"/"closed_no_write":
#: reading the journal emits those, and waking on them made every read wake the next one
#: (a watcher spinning at a full core, even on an idle journal).
_CHANGES = frozenset({"created", "modified", "moved", "deleted", "closed"})


class _ShutdownRace(logging.Filter):
    """watchdog logs an *error* when its observer stops while the emitter thread is still
    queueing an event; nothing is lost (we re-read from the cursor), so it is not news."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "called when the thread is inactive" not in record.getMessage()


logging.getLogger("watchdog.observers.inotify").addFilter(_ShutdownRace())


class Waker:
    """``wait(timeout)`` returns early when the journal's directory reports a change."""

    def __init__(self, journal: Path, *, poll: float | None) -> None:
        self.journal = journal
        self.poll = poll
        self._event = threading.Event()
        self._observer: BaseObserver | None = None
        self.mode = "poll" if poll is not None else "watchdog"

    def start(self) -> None:
        if self.poll is None:
            self._try_schedule()

    def _try_schedule(self) -> None:
        if self._observer is not None or not self.journal.parent.is_dir():
            return
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        name = self.journal.name
        wake = self._event

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.event_type not in _CHANGES:  # our own reads open the file too
                    return
                for p in (event.src_path, getattr(event, "dest_path", "")):
                    if p and os.path.basename(os.fsdecode(p)) == name:
                        wake.set()
                        return

        obs = Observer()
        obs.schedule(Handler(), str(self.journal.parent), recursive=False)
        obs.daemon = True
        obs.start()
        self._observer = obs

    def wake(self) -> None:
        """Wake the waiter now (shutdown, or a delivery finished)."""
        self._event.set()

    def wait(self, timeout: float) -> None:
        if self.poll is not None:
            timeout = min(timeout, self.poll)
        elif self._observer is None:
            self._try_schedule()  # the directory may exist by now
        self._event.wait(timeout)
        self._event.clear()

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
