"""The jobs one watcher has in flight, and the one thread that asks the scheduler about them.

Every ``poll_s`` the thread makes ONE :meth:`~watcher.scheduler.Scheduler.states` call
for all jobs in flight (1 or 50: one call), and wakes the deliveries waiting on them. A
scheduler command that fails is said once per distinct error and retried at the next
poll; the jobs keep their last known state meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from journal.record.record import Record
from watcher.hooks.callbacks import Event
from watcher.scheduler import QUEUED_STATES, JobState, Scheduler, SchedulerError
from watcher.scheduler.markers import forget_finished

log = logging.getLogger("watcher")

DEFAULT_POLL_S = 1.0

#: One attempt of one run: what an abort applies to (``(run_id, attempt)``).
AttemptKey = tuple[str, int]


def attempt_of(record: Record) -> AttemptKey:
    """The attempt a journal record belongs to."""
    return str(record["run_id"]), record["attempt"]


class JobBoard:
    """The scheduler behind ``--via`` and its jobs in flight.

    :meth:`wait` gives ``(polls, state)``: how many polls have run, and the state the
    last one gave (None when the scheduler did not know the job: ended long ago, or never
    was); :meth:`unknown`, how many polls in a row that included the job did not know it.

    ``cancel_on_abort``: a ``train_end`` of an aborted run (``command`` abort) cancels the
    queued jobs of that attempt and none is submitted for its saves (:meth:`on_train_end`);
    a later (resumed) attempt's jobs are not its concern."""

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        poll_s: float = DEFAULT_POLL_S,
        cancel_on_abort: bool = False,
        notice: Callable[[str], None] = log.warning,
    ) -> None:
        self.scheduler = scheduler
        self.poll_s = poll_s
        self.cancel_on_abort = cancel_on_abort
        self.notice = notice
        self.polls = 0  # scheduler state queries answered (one per poll with jobs in flight)
        self.skipped_on_abort = 0  # deliveries skipped because their attempt was aborted
        self._aborted: dict[AttemptKey, int] = {}  # attempt -> seq of its train_end
        self._jobs: dict[str, JobState | None] = {}
        self._unknown: dict[str, int] = {}  # job id -> polls in a row that did not know it
        self._attempts: dict[str, AttemptKey] = {}  # job id -> the attempt whose save it is
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._said: set[str] = set()
        #: the markers' dir of each job runner (watcher.scheduler.runner), for :meth:`finish`
        self.job_dirs: list[Path] = []

    def finish(self) -> None:
        """The watcher ended normally: every result is recorded, so the markers of ended
        jobs can go (those of jobs still running stay, for the next watcher)."""
        for jobs_dir in self.job_dirs:
            forget_finished(jobs_dir)

    def watch(self, job_id: str, attempt: AttemptKey | None = None) -> int:
        """Follow ``job_id`` (the job of a record of ``attempt``) until :meth:`forget`.
        Returns the poll number after which the polls include it (one may be under way
        without it)."""
        with self._cond:
            self._jobs.setdefault(job_id, None)
            if attempt is not None:
                self._attempts[job_id] = attempt
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="ilab-jobs", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return self.polls + 1

    def forget(self, job_id: str) -> None:
        with self._cond:
            self._jobs.pop(job_id, None)
            self._attempts.pop(job_id, None)
            self._unknown.pop(job_id, None)

    def wait(self, job_id: str, after: int, timeout: float) -> tuple[int, JobState | None]:
        """Wait until a poll after poll number ``after`` (or ``timeout``); ``(polls, state)``."""
        with self._cond:
            self._cond.wait_for(lambda: self.polls > after or self._closed, timeout)
            return self.polls, self._jobs.get(job_id)

    def unknown(self, job_id: str) -> int:
        """How many polls in a row asked the scheduler about ``job_id`` and it did not know
        the job (counted from the first poll that surely included it)."""
        with self._cond:
            return self._unknown.get(job_id, 0)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def aborted(self, record: Record) -> bool:
        """Whether ``record`` (a save) belongs to an attempt aborted after it: its job is
        not submitted, or cancelled while queued. A resumed attempt is a new one."""
        with self._cond:
            seq = self._aborted.get(attempt_of(record))
        return seq is not None and record["seq"] < seq

    def skips(self, record: Record) -> bool:
        """:meth:`aborted`, for a delivery of ``record`` that is then skipped: counted for
        the watcher's summary (``skipped (run aborted)``)."""
        if not self.aborted(record):
            return False
        with self._cond:
            self.skipped_on_abort += 1
        return True

    def on_train_end(self, event: Event, **data: Any) -> None:
        """A hook on ``train_end`` (``--cancel-on-abort``): an aborted attempt's queued jobs
        are cancelled, and its deliveries not yet submitted are skipped."""
        if self.cancel_on_abort and data.get("command") == "abort":
            self.abort((event.run_id, event.attempt), event.seq)

    def abort(self, attempt: AttemptKey, seq: int) -> None:
        """The ``train_end`` at ``seq`` aborted ``attempt``: cancel its queued jobs."""
        with self._cond:
            self._aborted[attempt] = seq
            queued = [
                j
                for j, st in self._jobs.items()
                if self._attempts.get(j) == attempt and (st is None or st.state in QUEUED_STATES)
            ]
        self.cancel_queued(queued)

    def cancel_queued(self, job_ids: list[str]) -> None:
        """Cancel the aborted run's queued jobs (a failure is one line)."""
        if job_ids:
            try:
                self.scheduler.cancel(job_ids)
            except SchedulerError as exc:
                self.notice(f"cannot cancel the aborted run's queued jobs: {exc}")

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or bool(self._jobs))
                if self._closed:
                    return
                ids = list(self._jobs)
            try:
                states = self.scheduler.states(ids)  # one query for all of them
            except SchedulerError as exc:
                if str(exc) not in self._said:
                    self._said.add(str(exc))
                    self.notice(f"cannot query the jobs' states (retrying): {exc}")
                states = None
            with self._cond:
                if states is not None:
                    for job_id in ids:
                        if job_id in self._jobs:
                            st = self._jobs[job_id] = states.get(job_id)
                            misses = 0 if st is not None else self._unknown.get(job_id, 0) + 1
                            self._unknown[job_id] = misses
                    self.polls += 1
                    self._cond.notify_all()
                if self._cond.wait_for(lambda: self._closed, self.poll_s):
                    return
