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

from watcher.engine.attempts import TAIL_BYTES, Attempt, Retries
from watcher.engine.handback import HandBack
from watcher.hooks.callbacks import Event
from watcher.hooks.delivery import Delivery, DeliveryResult, TrackerUnavailable

log = logging.getLogger("watcher")

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
        event = Event.from_record(d.record, self.ckpt_dir, d.delivery_id)
        try:
            returned = hook.target(event, **_keywords(event.data))  # type: ignore[operator]
        except BaseException as exc:  # a callback's SystemExit too: the hook fails, not us
            return self._retry_after(d, Attempt(None, exc, t0))
        if returned is None:
            return None
        return self._retry_after(d, Attempt(returned, None, t0))

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
        event = Event.from_record(d.record, self.ckpt_dir, d.delivery_id)
        kwargs = _keywords(event.data)
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


#: Payload key sets seen, and whether all of them are identifiers (a few per journal).
_IDENTIFIER_KEYS: dict[tuple[str, ...], bool] = {}


def _keywords(data: dict[str, Any]) -> dict[str, Any]:
    """The payload fields that can be keyword arguments (a bridge may log ``train/loss``)."""
    keys = tuple(data)
    plain = _IDENTIFIER_KEYS.get(keys)
    if plain is None:
        plain = _IDENTIFIER_KEYS[keys] = all(k.isidentifier() for k in keys)
        if len(_IDENTIFIER_KEYS) > 1024:  # a journal whose every record has its own keys
            _IDENTIFIER_KEYS.clear()
    return data if plain else {k: v for k, v in data.items() if k.isidentifier()}
