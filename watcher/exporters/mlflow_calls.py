"""Calls to an MLflow tracking server that may die mid-run (``ilab-watch --mlflow``).

MLflow's client retries each call for minutes, which would hold the launcher past its grace
period with every later record queued behind it. So each call to an http(s) server runs on a
thread of its own while ``/health`` is probed beside it; after :data:`DOWN_AFTER` unanswered
probes in a row (or a failed call and an unanswered probe) the server is down: every later
call fails at once with one :class:`~watcher.exporters.base.TrackerUnavailable` line (the
exporter's, saying how to repair the run), and the server is probed again every
:data:`RECHECK_S`.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from watcher.exporters.base import TrackerUnavailable
from watcher.hooks.callbacks import CallbackSpecError

PROBE_EVERY_S = 2.0  # while a call is in flight, /health is asked this often
DOWN_AFTER = 3  # unanswered probes in a row: the server is gone
RECHECK_S = 30.0  # once down, calls fail at once; the server is asked again this often
_CALL_THREAD = "ilab-mlflow-call"
T = TypeVar("T")


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`CallbackSpecError` when an http(s) tracking server does not answer
    (before the client's own retries, which take minutes)."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s):
            pass
    except urllib.error.HTTPError:
        pass  # it answered (a proxy may not serve /health): reachable
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise CallbackSpecError(
            f"cannot reach the MLflow tracking server at {uri}: {reason}"
        ) from None


def _answers(uri: str) -> bool:
    try:
        check_reachable(uri, timeout_s=PROBE_EVERY_S)
    except CallbackSpecError:
        return False
    return True


class _QuietCalls(logging.Filter):
    """urllib3's "Retrying ..." lines of our call threads: the breaker says it, once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.threadName or "").startswith(_CALL_THREAD)


class Breaker:
    """Runs calls to an http(s) tracking server, giving up when the server stops answering
    (see the module docstring). ``incomplete(reason)`` is the line a down server raises."""

    def __init__(self, uri: str, incomplete: Callable[[str], str]) -> None:
        self.uri = uri
        self.incomplete = incomplete
        self.down: str | None = None
        self._down_at = 0.0
        quiet = logging.getLogger("urllib3.connectionpool")
        if not any(isinstance(f, _QuietCalls) for f in quiet.filters):
            quiet.addFilter(_QuietCalls())

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.down is not None:
            if time.monotonic() - self._down_at < RECHECK_S:
                raise TrackerUnavailable(self.down)
            if not _answers(self.uri):
                self._down_at = time.monotonic()  # asked again in RECHECK_S, not every call
                raise TrackerUnavailable(self.down)
            self.down = None  # back: later records are exported again (earlier need a replay)
        result: list[T] = []
        error: list[BaseException] = []

        def run() -> None:
            try:
                result.append(fn(*args, **kwargs))
            except BaseException as exc:
                error.append(exc)

        # A thread we can stop waiting for: a call on a dead server retries for minutes,
        # and is left to end by itself (its points, if it ever lands them, are deduplicated).
        t = threading.Thread(target=run, name=_CALL_THREAD, daemon=True)
        t.start()
        misses = 0
        while True:
            t.join(PROBE_EVERY_S)
            if not t.is_alive():
                break
            misses = 0 if _answers(self.uri) else misses + 1
            if misses >= DOWN_AFTER:
                self._trip(f"no answer from {self.uri}/health {misses} times in a row")
        if error:
            if not _answers(self.uri):
                self._trip(f"{type(error[0]).__name__}; no answer from {self.uri}/health")
            raise error[0]
        return result[0]

    def _trip(self, reason: str) -> None:
        self.down, self._down_at = self.incomplete(reason), time.monotonic()
        raise TrackerUnavailable(self.down)


class Guarded:
    """An ``MlflowClient`` whose calls go through a :class:`Breaker`."""

    def __init__(self, client: Any, breaker: Breaker) -> None:
        self._client, self._breaker = client, breaker

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr
        return lambda *args, **kwargs: self._breaker.call(attr, *args, **kwargs)
