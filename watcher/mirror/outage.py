"""How the mirror waits out what waiting can fix (:mod:`journal.remote.errors` decides
which): a store that does not answer, said once per outage and once when it is back; this
machine's disk, said once per cause; retries 1 s apart, doubling to MAX_BACKOFF_S."""

from __future__ import annotations

import logging
import threading
import time

from journal.remote.errors import Kind, Problem

log = logging.getLogger("watcher.mirror")
MAX_BACKOFF_S = 10.0


class Outage:
    """Whether the store answers; says so on the console once per outage and once when it
    is back (several threads report to one). A local cause (a full disk) is said once
    as what it is, never as the store not answering."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._local: str | None = None
        self._lock = threading.Lock()

    def failed(self, what: str, problem: Problem) -> None:
        with self._lock:
            if problem.kind is Kind.LOCAL:
                if self._local != problem.cause:
                    self._local = problem.cause
                    log.warning(
                        "mirror: %s: %s (on this machine, not the store); retrying",
                        what,
                        problem.cause,
                    )
                return
            if self._since is None:
                self._since = time.monotonic()
                log.warning(
                    "mirror: the store does not answer (%s: %s); training goes on, uploads "
                    "wait and retry",
                    what,
                    problem.cause[:200],
                )

    def ok(self) -> None:
        with self._lock:
            self._local = None
            if self._since is not None:
                log.warning(
                    "mirror: the store answers again after %.0fs; catching up",
                    time.monotonic() - self._since,
                )
                self._since = None


class Backoff:
    """Retry delays: 1 s doubling to MAX_BACKOFF_S while attempts fail."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.at = 0.0

    def ready(self, now: float) -> bool:
        return now >= self.at

    def after(self, ok: bool, now: float) -> None:
        self.delay = 0.0 if ok else min(MAX_BACKOFF_S, max(1.0, self.delay * 2))
        self.at = now + self.delay
