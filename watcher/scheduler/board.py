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
from typing import Any

from watcher.scheduler import QUEUED_STATES, JobState, Scheduler, SchedulerError

log = logging.getLogger("watcher")

DEFAULT_POLL_S = 1.0


class JobBoard:
    """The scheduler behind ``--via`` and its jobs in flight.

    ``seen(job_id)`` is ``(polls, state)``: how many polls have run, and the state the
    last one gave (None when the scheduler did not know the job: ended long ago, or never
    was). ``cancel_on_abort``: a ``train_end`` of an aborted run (``command`` abort)
    cancels the queued jobs and no new one is submitted (:meth:`on_train_end`)."""

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
        self.aborted = False
        self.polls = 0  # scheduler state queries made (one per poll with jobs in flight)
        self._jobs: dict[str, JobState | None] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._said: set[str] = set()
        self.runners: list[Any] = []  # the watcher.jobs.JobRunner of each executor

    def finish(self) -> None:
        """The watcher ended normally: every result is recorded, so the markers of ended
        jobs can go (those of jobs still running stay, for the next watcher)."""
        for runner in self.runners:
            runner.forget_finished()

    def watch(self, job_id: str) -> int:
        """Follow ``job_id`` until :meth:`forget`. Returns the poll number after which
        the polls include it (one may be under way without it)."""
        with self._cond:
            self._jobs.setdefault(job_id, None)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="ilab-jobs", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return self.polls + 1

    def forget(self, job_id: str) -> None:
        with self._cond:
            self._jobs.pop(job_id, None)

    def wait(self, job_id: str, after: int, timeout: float) -> tuple[int, JobState | None]:
        """Wait until a poll after poll number ``after`` (or ``timeout``); ``(polls, state)``."""
        with self._cond:
            self._cond.wait_for(lambda: self.polls > after or self._closed, timeout)
            return self.polls, self._jobs.get(job_id)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def on_train_end(self, event: Any, **data: Any) -> None:
        """A hook on ``train_end`` (``--cancel-on-abort``): an aborted run's queued jobs are
        cancelled, and its deliveries not yet submitted are skipped."""
        if self.cancel_on_abort and data.get("command") == "abort":
            self.abort()

    def abort(self) -> None:
        with self._cond:
            self.aborted = True
            queued = [j for j, st in self._jobs.items() if st is None or st.state in QUEUED_STATES]
        if queued:
            try:
                self.scheduler.cancel(queued)
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
                            self._jobs[job_id] = states.get(job_id)
                    self.polls += 1
                    self._cond.notify_all()
                if self._cond.wait_for(lambda: self._closed, self.poll_s):
                    return
