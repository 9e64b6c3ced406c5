"""Where alerts go: the journal at once, then the ``--notify`` targets in the background.

:class:`AlertDispatcher` is the :class:`~watcher.alerts.alert.AlertSink` of a watcher. For
each alert, :meth:`~AlertDispatcher.raise_alert`:

1. claims its identity in the run's ledger (journal/rundir/ledger.py: its run, attempt,
   kind and incident), and drops it when any process claimed it first, so any number of
   watchers and guards on a run, on any host, page once and journal once;
2. writes its ``alert`` record's file into ``reports/`` (journal/channels/alerts.py): the
   trainer journals it at its next step boundary, or this dispatcher's journaling thread
   does when nobody holds the journal; a trainer hung holding it journals nothing, and the
   file waits for the journal's next holder (it is retried every few seconds), while the
   claim shows it to ``status``;
3. says it in one console line, and queues one message per target.

Each target has a sending thread of its own, so a target that accepts and never answers
delays no other (a try ends at apprise's socket timeouts): it is tried up to :data:`TRIES`
times with a doubling backoff, and at most :data:`PER_MINUTE` messages a minute go to it. A
failed try is one line; once every target took the alert or was given up, an
``alert_told`` record says which (journaled like the alert). Nothing here waits for a
target: a target that is down costs the watcher nothing but a thread that sleeps.
:meth:`~AlertDispatcher.close` gives the messages still pending until its timeout, trying
what is left without further backoff, then gives up on them, saying so.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import logging
import re
import socket
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal.channels.alerts import alert_payload, told_payload
from journal.record.events import ALERT_KINDS
from journal.rundir.ledger import claim, claimed, claims
from watcher.alerts.alert import Alert, new_alert_id
from watcher.alerts.inbox import AlertInbox
from watcher.alerts.notify import Target, compose, names, parse_targets

log = logging.getLogger("watcher")

#: Tries per alert and target, the first retry's delay (doubling: 1, 2, 4, 8 s).
TRIES = 5
BACKOFF_S = 1.0
#: At most this many messages a minute to one target (a flapping run must not flood it).
PER_MINUTE = 12
#: While closing: the gap between the last tries of a target that is down.
CLOSE_GAP_S = 0.5
#: Seconds one try may take (apprise's own timeouts, 4 s to connect and 4 s to read, end
#: most first); a target still silent then failed that try.
TRY_TIMEOUT_S = 10.0
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class _Message:
    """An alert's message, composed once for all its targets."""

    alert: Alert
    title: str
    body: str


@dataclass(order=True)
class _Send:
    """One alert to one target: when to try next, how many tries so far, the last error."""

    due: float
    seq: int
    message: _Message = field(compare=False)
    target: Target = field(compare=False)
    tries: int = field(default=0, compare=False)
    error: str | None = field(default=None, compare=False)


@dataclass
class _Outcome:
    left: int
    told: list[str] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)


class AlertDispatcher:
    """An :class:`~watcher.alerts.alert.AlertSink` (see the module's docstring).

    Args:
        run_dir: the run's directory (where its journal and ``reports/`` are).
        targets: ``--notify`` URLs (or ``notify_urls``' pairs); a malformed one raises
            :class:`~watcher.alerts.notify.BadTarget` here, before anything starts.
        run_label: the run as messages name it: its dir or URI.
        source: who raises the alerts, as journaled (``ilab-watch``, ``run_training``).
        kinds: the kinds it tells (``--notify-on``'s); the others are journaled only. A
            recovery is told where its hang was.
        tries, backoff, per_minute, try_timeout: the retry and rate rules (defaults above).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        targets: Sequence[str | tuple[str, str]] = (),
        run_label: str,
        source: str = "ilab-watch",
        kinds: Collection[str] = ALERT_KINDS,
        tries: int = TRIES,
        backoff: float = BACKOFF_S,
        per_minute: int = PER_MINUTE,
        try_timeout: float = TRY_TIMEOUT_S,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_label = run_label
        self.source, self.kinds = source, frozenset(kinds)
        self.targets: list[Target] = parse_targets(targets)
        self.tries, self.backoff, self.per_minute = max(1, tries), backoff, max(1, per_minute)
        self.try_timeout = try_timeout
        #: every alert raised (not dropped as a repeat) by this dispatcher, in order
        self.raised: list[Alert] = []
        self._claimed: set[str] = set()  # here (a ledger that cannot be written: said once)
        self._cond = threading.Condition()
        self._sends: dict[Target, list[_Send]] = {t: [] for t in self.targets}  # per target
        self._seq = itertools.count()
        self._outcomes: dict[str, _Outcome] = {}
        self._sent: dict[str, collections.deque[float]] = {}  # target -> recent send times
        self._closing = False
        self._deadline = float("inf")
        self.inbox = AlertInbox(self.run_dir)
        self._notifiers = [  # one per target: a target that does not answer delays no other
            threading.Thread(target=self._notify_loop, args=(t,), name="ilab-notify", daemon=True)
            for t in self.targets
        ]
        for thread in self._notifiers:
            thread.start()

    # -- raising ------------------------------------------------------------------------------

    def repeats(self, alert: Alert) -> bool:
        """Whether :meth:`raise_alert` would drop ``alert``: its identity (run, attempt,
        kind, incident) is claimed already, by any process, or this sink is closing."""
        name = alert.identity
        return self._closing or name in self._claimed or claimed(self.run_dir, name)

    def raise_alert(self, alert: Alert) -> None:
        """Claim, journal and tell ``alert`` (see the module's docstring); returns at once.
        One whose identity is claimed already is dropped."""
        if alert.kind not in ALERT_KINDS:
            raise ValueError(f"unknown alert kind {alert.kind!r}; known: {', '.join(ALERT_KINDS)}")
        if not _ID.fullmatch(alert.id):  # it names files: reports/<id>.json, alerts/<id>/
            raise ValueError(f"alert id {alert.id!r} is not one word (new_alert_id() makes one)")
        if self.repeats(alert):
            return
        told = self.targets if self._tells(alert) else []
        payload = alert_payload(
            id=alert.id,
            kind=alert.kind,
            step=alert.step,
            attempt=alert.attempt,
            message=alert.message,
            evidence=alert.evidence,
            missing=alert.missing,
            condition=alert.condition,
            targets=names(told),
            run=self.run_label,
            host=socket.gethostname(),
            source=self.source,
            resolves=alert.resolves,
            raised_at=time.time(),
        )
        try:
            ledger = {**payload, "run_id": alert.run_id, "incident": alert.incident}
            if not claim(self.run_dir, alert.identity, ledger):
                return  # another process claimed it first: it journals and tells
        except OSError as exc:  # better told twice than never: this process remembers it
            log.warning("alert %s: cannot claim it in %s: %s", alert.kind, self.run_dir, exc)
        self._claimed.add(alert.identity)
        self.raised.append(alert)
        self.inbox.put(payload, alert.id, f"alert {alert.id}")
        step = f" at step {alert.step}" if alert.step is not None else ""
        where = f"; evidence in {self.run_dir / 'alerts' / alert.id}" if alert.evidence else ""
        telling = f"; telling {', '.join(names(told))}" if told else ""
        log.warning("alert: %s%s: %s%s%s", alert.kind, step, alert.message, where, telling)
        for line in alert.missing:
            log.warning("alert %s: not captured: %s", alert.kind, line)
        if not told:
            return
        title, body = compose(alert, run_label=self.run_label, run_id=alert.run_id)
        message = _Message(alert, title, body)
        with self._cond:
            self._outcomes[alert.id] = _Outcome(left=len(told))
            now = time.monotonic()
            for target in told:
                heapq.heappush(self._sends[target], _Send(now, next(self._seq), message, target))
            self._cond.notify_all()

    def _tells(self, alert: Alert) -> bool:
        """Whether ``alert`` goes to the targets: its kind is one they are told of, and a
        recovery's hang was told."""
        if alert.kind not in self.kinds or not self.targets:
            return False
        hangs = claims(self.run_dir, alert.run_id) if alert.resolves is not None else []
        return alert.resolves is None or any(
            c.get("id") == alert.resolves and c.get("targets") for c in hangs
        )

    # -- notifying ----------------------------------------------------------------------------

    def _notify_loop(self, target: Target) -> None:
        """One target's sender: tries its sends in turn."""
        while True:
            with self._cond:
                send = self._next_due(self._sends[target])
            if send is None:
                return
            self._try(send)

    def _next_due(self, sends: list[_Send]) -> _Send | None:
        """The next of one target's ``sends`` whose time has come (waiting for it), or None
        once closed and nothing is left. Called holding the condition."""
        while True:
            now = time.monotonic()
            if self._closing:
                self._give_up_late(now, sends)
                if not sends:
                    return None
            if sends:
                due = sends[0].due
                if due <= now:
                    send = heapq.heappop(sends)
                    wait = self._rate_wait(send.target, now)
                    if wait <= 0:
                        return send
                    send.due = now + wait
                    heapq.heappush(sends, send)
                    continue
                # closing: woken at the deadline, to give up what is left
                self._cond.wait(min(due, self._deadline) - now)
            else:
                self._cond.wait()

    def _rate_wait(self, target: Target, now: float) -> float:
        sent = self._sent.setdefault(target.name, collections.deque())
        while sent and now - sent[0] >= 60.0:
            sent.popleft()
        return 0.0 if len(sent) < self.per_minute else sent[0] + 60.0 - now

    def _try(self, send: _Send) -> None:
        message = send.message
        with self._cond:
            self._sent.setdefault(send.target.name, collections.deque()).append(time.monotonic())
        send.tries += 1
        out: list[str | None] = []
        done = threading.Event()

        def call() -> None:  # in a thread of its own: a target that never answers is left
            out.append(send.target.send(message.title, message.body, message.alert.kind))
            done.set()

        threading.Thread(target=call, name="ilab-alert-try", daemon=True).start()
        error = out[0] if done.wait(self.try_timeout) else f"no answer in {self.try_timeout:g}s"
        alert, name = message.alert, send.target.name
        if error is None:
            if send.tries > 1:
                log.warning("alert %s: %s told at try %d", alert.kind, name, send.tries)
            self._settle(alert, told=name)
            return
        send.error = error
        if send.tries >= self.tries:
            said = f"{name} not told after {send.tries} tries ({error}); given up"
            log.warning(
                "alert %s: %s, see ilab-journal status %s", alert.kind, said, self.run_label
            )
            self._settle(alert, failed={"target": name, "tries": send.tries, "error": error})
            return
        with self._cond:  # closing: what is left is tried at once, without backoff
            delay = CLOSE_GAP_S if self._closing else self.backoff * 2 ** (send.tries - 1)
            send.due = time.monotonic() + delay
            heapq.heappush(self._sends[send.target], send)
            self._cond.notify_all()
        said = f"{name} not told (try {send.tries} of {self.tries}: {error})"
        log.warning("alert %s: %s; trying again in %gs", alert.kind, said, delay)

    def _give_up_late(self, now: float, sends: list[_Send]) -> None:
        """Closing, past the deadline: every one of ``sends`` left is given up (called
        holding it)."""
        if now < self._deadline:
            return
        while sends:
            send = heapq.heappop(sends)
            message = send.message
            why = f"the watcher exited after {send.tries} tries"
            why += f" (last: {send.error})" if send.error else ""
            log.warning("alert %s: %s not told: %s", message.alert.kind, send.target.name, why)
            failed = {"target": send.target.name, "tries": send.tries, "error": why}
            self._settle(message.alert, failed=failed, locked=True)

    def _settle(
        self,
        alert: Alert,
        *,
        told: str | None = None,
        failed: dict[str, Any] | None = None,
        locked: bool = False,
    ) -> None:
        """One target's outcome; the last one journals the alert's ``alert_told``."""
        with contextlib.nullcontext() if locked else self._cond:
            out = self._outcomes[alert.id]
            if told is not None:
                out.told.append(told)
            if failed is not None:
                out.failed.append(failed)
            out.left -= 1
            done = out.left == 0
        if done:
            payload = told_payload(
                id=alert.id, told=out.told, failed=out.failed, told_at=time.time()
            )
            self.inbox.put(payload, new_alert_id(), f"who was told of alert {alert.id}")

    # -- closing ------------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Send what is pending for at most ``timeout`` seconds (tries left are made without
        further backoff), give up the rest, journal the outcomes; then stop the threads. An
        alert the journal's holder has not taken stays in ``reports/`` for its next holder
        (said in one line)."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            self._closing = True
            self._deadline = deadline
            soon = time.monotonic() + CLOSE_GAP_S
            for sends in self._sends.values():  # no more backoff: the watcher is going
                for send in sends:
                    send.due = min(send.due, soon)
                heapq.heapify(sends)
            self._cond.notify_all()
        for thread in self._notifiers:  # a try under way ends at its own timeout
            thread.join(max(0.0, deadline - time.monotonic()) + self.try_timeout + 1.0)
        self.inbox.close(deadline)
