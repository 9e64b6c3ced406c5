"""Running a Python callable's deliveries: ``(event, **payload)``, and what it returns.

A callable without a timeout is called directly on its queue's worker (the inline fast
path: a replay's millions of calls pay no thread and no result object when they return
None); with a timeout it runs on a thread we can stop waiting for. What it returns goes to
the hand-back (:mod:`watcher.engine.handback`): ``Control``s and ``Report``s.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from journal.record.record import Record
from watcher.engine.attempts import TAIL_BYTES, Attempt, Finished, Lane, Retries
from watcher.engine.handback import HandBack
from watcher.hooks.callbacks import Event
from watcher.hooks.delivery import Batch, Delivery, DeliveryResult, Plain, TrackerUnavailable
from watcher.hooks.hook import Hook

log = logging.getLogger("watcher")

#: Deliveries an inline lane runs between two looks at the watcher's stop.
_STOP_EVERY = 256
_STOPPED = "watcher stopped"

#: Full tracebacks a hook's failures print (the first ones); later failures are counted
#: (watcher.engine.completion keeps every failure's one-line error in the results file).
TRACEBACKS_SAID = 3


class CallableRunner:
    """Runs the deliveries of callable hooks (lone callables and callback objects' methods).
    ``handback`` sends what they return; ``notice`` says a tracker's failure once."""

    def __init__(
        self,
        ckpt_dir: str,
        *,
        retries: Retries,
        handback: HandBack,
        notice: Callable[[str], None],
    ) -> None:
        self.ckpt_dir = ckpt_dir
        self.retries = retries
        self.handback = handback
        self.notice = notice
        self._tracebacks: dict[str, int] = {}  # hook id -> full tracebacks printed
        self._tracebacks_lock = threading.Lock()

    def deliver(self, d: Delivery) -> DeliveryResult | None:
        """Run ``d`` until it succeeds, its retries are spent, or the watcher stops.

        None: a callable that returned nothing at its first attempt, the common case of a
        replay (it is counted, and written in its batch's results line, without a result
        object of its own)."""
        hook = d.hook
        if not hook.inline:
            return self.retries.run(d, self._attempt)
        t0 = time.perf_counter()
        rec = d.record
        data = rec["data"]
        event = Event.of(rec, self.ckpt_dir, data, d)
        try:
            returned = hook.target(event, **_keywords(data))  # type: ignore[operator]
        except BaseException as exc:  # a callback's SystemExit too: the hook fails, not us
            return self._retry_after(d, Attempt(None, exc, t0))
        if returned is None:
            return None
        return self._retry_after(d, Attempt(returned, None, t0))

    def deliver_many(self, taken: list[Delivery], lane: Lane) -> list[Finished]:
        """:meth:`deliver` for each of ``taken`` in order, as one loop (a replay's worker
        runs thousands in a row); what is left once ``lane.closed`` is abandoned. Each
        delivery's result, None for a plain success (as :meth:`deliver`)."""
        finished: list[Finished] = []
        add = finished.append
        ckpt_dir, event_of, perf_counter = self.ckpt_dir, Event.of, time.perf_counter
        plain = _PLAIN_KEYS.issuperset  # the common payload, passed as it is (_keywords)
        hook: Any = None
        inline = False
        for d in taken:
            if lane.closed:  # the watcher stops: what was not started is abandoned
                add((d, DeliveryResult.of(d, "abandoned", error="watcher stopped")))
                continue
            if d.hook is not hook:
                hook = d.hook
                inline, target = hook.inline, hook.target
            if not inline:
                add((d, self._deliver_safely(d)))
                continue
            t0 = perf_counter()
            rec = d.record
            data = rec["data"]
            kwargs = data if plain(data) else _keywords(data)
            try:
                returned = target(event_of(rec, ckpt_dir, data, d), **kwargs)
            except BaseException as exc:  # a callback's SystemExit too: the hook fails, not us
                add((d, self._judged(d, Attempt(None, exc, t0))))
                continue
            add((d, None if returned is None else self._judged(d, Attempt(returned, None, t0))))
        return finished

    def deliver_plain(
        self, runs: list[Plain], batch: Batch, stop: threading.Event
    ) -> tuple[list[Plain], list[Finished]]:
        """Run an inline lane's deliveries of ``batch`` (watcher.engine.dispatch ``Plain``
        runs: inline hooks only) in order, in the caller's thread: the records each run's
        hook took with a plain success (it returned None), as runs, and the other
        deliveries with their results: what a callable returned, a failure after its
        retries, or abandoned once ``stop`` is set. Only these get a :class:`Delivery`."""
        succeeded: list[Plain] = []
        finished: list[Finished] = []
        ckpt_dir, event_of, perf_counter = self.ckpt_dir, Event.of_hook, time.perf_counter
        plain = _PLAIN_KEYS.issuperset  # the common payload, passed as it is (_keywords)
        stopped = False
        for h, recs in runs:
            if stopped:
                finished += _abandoned(h, recs, batch)
                continue
            target: Any = h.target
            acted: list[Record] = []  # not a plain success: in ``finished``
            ran = len(recs)
            for start in range(0, len(recs), _STOP_EVERY):
                if stop.is_set():  # the watcher stops: the rest is abandoned
                    stopped, ran = True, start
                    finished += _abandoned(h, recs[start:], batch)
                    break
                for rec in recs[start : start + _STOP_EVERY]:
                    data = rec["data"]
                    t0 = perf_counter()
                    try:
                        returned = target(
                            event_of(rec, ckpt_dir, data, h),
                            **(data if plain(data) else _keywords(data)),
                        )
                    except BaseException as exc:  # a callback's SystemExit too: it fails
                        d = Delivery(h, rec, batch)
                        finished.append((d, self._judged(d, Attempt(None, exc, t0))))
                        acted.append(rec)
                        continue
                    if returned is not None:
                        d = Delivery(h, rec, batch)
                        finished.append((d, self._judged(d, Attempt(returned, None, t0))))
                        acted.append(rec)
            took = recs if ran == len(recs) else recs[:ran]
            if acted:
                other = {id(rec) for rec in acted}
                took = [rec for rec in took if id(rec) not in other]
            if took:
                succeeded.append((h, took))
        return succeeded, finished

    def _deliver_safely(self, d: Delivery) -> DeliveryResult | None:
        try:
            return self.deliver(d)
        except Exception as exc:
            return DeliveryResult.of(d, "failed", error=f"internal error: {exc!r}")

    def _judged(self, d: Delivery, first: Attempt) -> DeliveryResult:
        try:
            return self._retry_after(d, first)
        except Exception as exc:
            return DeliveryResult.of(d, "failed", error=f"internal error: {exc!r}")

    def _retry_after(self, d: Delivery, first: Attempt) -> DeliveryResult:
        """The attempts of ``d`` whose first one was made inline: judged, then retried."""

        def attempt(d: Delivery, out: DeliveryResult, n: int) -> None:
            if n == 1:
                self._judge(first.returned, first.error, d, out)
            else:
                self._attempt(d, out, n)

        return self.retries.run(d, attempt, first_t0=first.t0)

    def _attempt(self, d: Delivery, out: DeliveryResult, n: int) -> None:
        """One call, on a thread we stop waiting for after the hook's timeout (if any)."""
        fn: Callable[..., Any] = d.hook.target  # type: ignore[assignment]
        rec = d.record
        data = rec["data"]
        event = Event.of(rec, self.ckpt_dir, data, d)
        kwargs = _keywords(data)
        result: list[Any] = []
        error: list[BaseException] = []

        def call() -> None:
            try:
                result.append(fn(event, **kwargs))
            except BaseException as exc:
                error.append(exc)

        timeout = d.hook.options.timeout
        if timeout is None:
            call()
        else:  # a thread we can stop waiting for (Python cannot kill it: it runs on, detached)
            t = threading.Thread(target=call, daemon=True, name=f"callback-{d.hook.short_id}")
            t.start()
            t.join(timeout)
            if t.is_alive():
                out.status, out.error = "timeout", f"timed out after {timeout:g}s (left running)"
                return
        self._judge(result[0] if result else None, error[0] if error else None, d, out)

    def _judge(
        self, returned: Any, exc: BaseException | None, d: Delivery, out: DeliveryResult
    ) -> None:
        """Record what a callable's attempt gave: its exception, or what it returned."""
        if exc is not None:
            if isinstance(exc, TrackerUnavailable):  # its exporter's one line, said once
                self.notice(str(exc))
                out.status, out.error = "failed", f"{type(exc).__name__}: {exc}"
                return
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            if self._say_traceback(d):  # the first ones: a callback failing on every record
                log.error(  # must not flood the console (the later ones are counted)
                    "callback %s failed on %s seq %s:\n%s",
                    d.hook.label,
                    d.hook.event,
                    d.record["seq"],
                    tb,
                )
            out.status, out.error = "failed", f"{type(exc).__name__}: {exc}"
            out.stderr_tail = tb[-TAIL_BYTES:]
            return
        out.status, out.error = "ok", None
        if returned is not None:
            self.handback.act_on(returned, d, out)

    def _say_traceback(self, d: Delivery) -> bool:
        """Whether this failure of ``d``'s hook prints its traceback: the first
        :data:`TRACEBACKS_SAID` do (a hook's deliveries run on one thread at a time, but
        hooks share this runner: the count is per hook)."""
        with self._tracebacks_lock:
            said = self._tracebacks.get(d.hook.id, 0)
            self._tracebacks[d.hook.id] = said + 1
        return said < TRACEBACKS_SAID


#: Payload keys seen that are identifiers: a payload of only these is passed as it is (one
#: C call per delivery).
_PLAIN_KEYS: set[str] = set()
#: Payload key sets seen with a key that is not (a bridge may log ``train/loss``).
_MIXED_KEYS: set[tuple[str, ...]] = set()
#: Past this many keys in either, it starts over (a journal whose records each have their own).
_KEYS_KEPT = 1024


def _keywords(data: dict[str, Any]) -> dict[str, Any]:
    """The payload fields that can be keyword arguments (a bridge may log ``train/loss``)."""
    if _PLAIN_KEYS.issuperset(data):
        return data
    keys = tuple(data)
    if keys not in _MIXED_KEYS:
        if all(k.isidentifier() for k in keys):
            if len(_PLAIN_KEYS) > _KEYS_KEPT:
                _PLAIN_KEYS.clear()
            _PLAIN_KEYS.update(keys)
            return data
        if len(_MIXED_KEYS) > _KEYS_KEPT:
            _MIXED_KEYS.clear()
        _MIXED_KEYS.add(keys)
    return {k: v for k, v in data.items() if k.isidentifier()}


def _abandoned(hook: Hook, recs: list[Record], batch: Batch) -> list[Finished]:
    """``hook``'s deliveries of ``recs``, never started: the watcher stops."""
    ds = [Delivery(hook, rec, batch) for rec in recs]
    return [(d, DeliveryResult.of(d, "abandoned", error=_STOPPED)) for d in ds]
