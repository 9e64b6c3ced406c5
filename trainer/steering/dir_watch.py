"""Change detection for rank 0's inboxes (control commands, reports), off the training thread.

A helper thread ``stat``s a directory every ``interval`` and raises a flag when it changed:
files arriving move its mtime, a chmod its ctime. A step with nothing new costs one
attribute read, and it works the same on network filesystems, where inotify misses remote
writes.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from journal.rundir.safety import safe_dir

log = logging.getLogger(__name__)


class DirWatch:
    """``changed`` is raised by the helper thread and lowered by the reader."""

    def __init__(self, path: Path, *, interval: float = 0.02, name: str = "ilab-dir-watch") -> None:
        self.path = path
        self.interval = interval
        self.name = name
        self.changed = True  # the first look always scans
        self._after_scan: tuple[int, int] | None = None  # the dir right after our own scan
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Create the directory (0o750) and start watching it."""
        try:
            safe_dir(self.path.parent, self.path)  # the run dir's inbox: never a symlink
        except OSError as exc:
            log.warning("cannot create %s: %s", self.path, exc)
        self._thread = threading.Thread(target=self._watch, name=self.name, daemon=True)
        self._thread.start()

    def scanned(self) -> None:
        """Call right after reading the directory: our own archiving is not news."""
        self._after_scan = self._state()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)

    def _state(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_ctime_ns

    def _watch(self) -> None:
        last: tuple[int, int] | None = None
        while not self._stop.wait(self.interval):
            now = self._state()
            if now != last:
                last = now
                if now != self._after_scan:
                    self.changed = True
