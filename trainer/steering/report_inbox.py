"""Rank 0's side of reports: journal what reporters hand in through ``<ckpt_dir>/reports/``
(the protocol is in :mod:`journal.channels.reports`), and keep the best checkpoint up to date."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from journal.channels.reports import ingest
from journal.rundir.paths import reports_dir
from trainer.steering.dir_watch import DirWatch


class ReportInbox:
    """``poll()`` at each step boundary costs one attribute read when nothing arrived."""

    def __init__(self, ckpt_dir: Path, emit: Callable[[str, dict[str, Any]], Any]) -> None:
        self.ckpt_dir = ckpt_dir
        self._emit = emit
        # Files journaled but left in place (they could not be archived or moved aside):
        # not journaled again at every step boundary.
        self._handled: set[str] = set()
        self.watch = DirWatch(reports_dir(ckpt_dir), name="ilab-report-watch")

    def start(self) -> None:
        self.watch.start()

    def poll(self) -> None:
        if self.watch.changed:
            self.ingest_now()

    def ingest_now(self) -> None:
        """Journal every pending report now (before rotation and before train_end); a
        malformed file, or one naming a checkpoint not on disk (never saved, removed since:
        it must not become the best), is refused with its reason and moved aside (see
        :func:`journal.channels.reports.ingest`)."""
        self.watch.changed = False
        ingest(self.ckpt_dir, self._emit, self._handled)
        self.watch.scanned()

    def close(self) -> None:
        self.watch.close()
