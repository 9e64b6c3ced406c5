"""An alert's way into the journal: its file in ``reports/``, journaled by the journal's
holder (the trainer, at its next step boundary) or, when nobody holds the journal, by a
thread of ours (journal/channels/alerts.py). A trainer hung holding the journal journals
nothing: our files wait for its next holder, tried again every :data:`RETRY_S`."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from journal.channels.alerts import submit
from journal.channels.reports import drain

log = logging.getLogger("watcher")

#: How often a file the journal's holder has not taken is tried again.
RETRY_S = 2.0
#: At the end: how long the last files may wait for the journal (a trainer that has just
#: ended lets go of it within moments).
FINAL_WAIT_S = 3.0


class AlertInbox:
    """Puts alert files into a run's ``reports/`` and sees them journaled."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._files: set[Path] = set()  # ours, not journaled yet
        self.tries = 0  # journaling tries made (each takes the journal if nobody holds it)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="ilab-alert-journal", daemon=True)
        self._thread.start()

    def put(self, payload: dict[str, Any], name: str, what: str) -> None:
        """Write one file (``name``: its time-ordered stem) and have it journaled; one line
        when it cannot be written (``what`` names it)."""
        try:
            path = submit(self.run_dir, payload, name)
        except (OSError, ValueError) as exc:
            log.warning("cannot journal %s: %s (its messages still go out)", what, exc)
            return
        with self._lock:
            self._files.add(path)
        self._wake.set()

    def _loop(self) -> None:
        while True:
            with self._lock:
                waiting = bool(self._files)
            self._wake.wait(RETRY_S if waiting else None)
            self._wake.clear()
            if self._stop:
                return
            self.journal_now()

    def journal_now(self) -> bool:
        """One try; True when none of our files is left waiting."""
        with self._lock:
            self._files = {p for p in self._files if p.exists()}
            if not self._files:
                return True
        self.tries += 1
        try:
            drain(self.run_dir, role="alerts")
        except Exception as exc:  # the next try, or the journal's holder, journals them
            log.debug("cannot journal alerts now: %s: %s", type(exc).__name__, exc)
        with self._lock:
            self._files = {p for p in self._files if p.exists()}
            return not self._files

    def close(self, deadline: float) -> None:
        """Stop the thread; try for a few seconds more (not past ``deadline``, a monotonic
        time); files left wait for the journal's next holder, said in one line."""
        self._stop = True
        self._wake.set()
        self._thread.join(5.0)
        until = min(deadline, time.monotonic() + FINAL_WAIT_S)
        while not self.journal_now() and time.monotonic() < until:
            time.sleep(0.2)  # a retry pace, not a synchronization: the holder may go any time
        with self._lock:
            left = len(self._files)
        if left:
            log.warning(
                "alerts: %d record(s) not journaled yet: the journal's holder (a trainer) "
                "has not taken them; they wait in %s for its next writer",
                left,
                self.run_dir / "reports",
            )
