"""A job's state changes as ``job`` records (journal/channels/jobs.py): each is written into
the run's ``reports/`` and journaled by whoever holds the journal (the trainer), or by a
thread of the watcher's own when nobody does."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

from journal.channels.jobs import job_payload
from journal.channels.reports import drain
from journal.rundir.files import atomic_write
from journal.rundir.paths import reports_dir
from watcher.hooks.delivery import Delivery
from watcher.scheduler import JobState


class JobRecords:
    """Journals the state changes of one runner's jobs (``source``: whose they are)."""

    def __init__(self, ckpt_dir: str, source: str, notice: Callable[[str], None]) -> None:
        self.ckpt_dir, self.source, self.notice = ckpt_dir, source, notice
        self._journal_q: queue.Queue[bool] = queue.Queue()
        self._drainer = threading.Thread(target=self._drain, name="ilab-job-records", daemon=True)
        self._drainer.start()

    def note(self, job: dict[str, Any], st: JobState, d: Delivery, marker: dict[str, Any]) -> None:
        """A state change: into the result's ``job``, and into the journal as a ``job`` record."""
        job["states"].append({"state": st.state, "at": time.time()})
        job["node"] = st.node or job["node"]
        path = d.record["data"].get("checkpoint_path")
        payload = job_payload(
            job_id=job["id"],
            scheduler=job["scheduler"],
            state=st.state,
            node=job["node"],
            exit_code=st.exit_code if st.final else None,
            log_path=marker.get("log") if st.final else None,
            checkpoint_path=path if isinstance(path, str) else None,
            step=d.record["step"],
            delivery_id=d.delivery_id,
            hook=d.hook.label[:200],
            attempt=int(marker["attempt"]),
            source=self.source,
        )
        inbox = reports_dir(self.ckpt_dir)
        try:
            atomic_write(inbox / f"{payload['id']}.json", orjson.dumps(payload), root=self.ckpt_dir)
        except OSError as exc:
            self.notice(f"cannot journal job states in {inbox}: {exc.strerror or exc}")
            return
        self._journal_q.put(True)  # journaled by whoever holds the journal, or by us

    def _drain(self) -> None:
        while self._journal_q.get():
            while not self._journal_q.empty():  # one drain for changes that came together
                self._journal_q.get_nowait()
            try:
                drain(self.ckpt_dir, role="job")
            except Exception as exc:  # the next change, or the trainer, journals it
                self.notice(f"cannot journal job states: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Journal what is pending, then stop the journaling thread."""
        self._journal_q.put(False)
        self._drainer.join(timeout=10)
        with contextlib.suppress(Exception):
            drain(self.ckpt_dir, role="job")
