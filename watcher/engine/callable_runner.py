"""Running a Python callable's deliveries: ``(event, **payload)``, and what it returns.

One loop runs them all (:meth:`CallableRunner.run`), for a queue's worker and a replay's
inline lane alike. A callable without a timeout is called directly (a replay's millions of
calls pay no thread and no result object when they return None); with a timeout it runs on
a thread we can stop waiting for. What it returns goes to the hand-back
(:mod:`watcher.engine.handback`): ``Control``s and ``Report``s.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from watcher.engine.attempts import TAIL_BYTES, Attempt, Finished, Retries, abandoned
from watcher.engine.handback import HandBack
from watcher.hooks.callbacks import Event
from watcher.hooks.delivery import Delivery, DeliveryResult, Run, TrackerUnavailable

log = logging.getLogger("watcher")

#: Seconds between two looks of :meth:`CallableRunner.run` at the watcher's stop (one
#: after a slower call): not one per call of a replay's millions.
_ASK_STOP_S = 0.05
#: What :meth:`CallableRunner.run` gives: the deliveries with a result, and the plain
#: successes as runs (watcher.engine.completion ``Completions.complete``).
Ran = tuple[list[Finished], list[Run]]

#: Full tracebacks a hook's failures print (the first ones); later failures are counted
#: (watcher.engine.completion keeps every failure's one-line error in the results file).
TRACEBACKS_SAID = 3


@dataclass(eq=False)
class CallableRunner:
    """Runs the deliveries of callable hooks (lone callables and callback objects' methods).
    ``handback`` sends what they return; ``notice`` says a tracker's failure once."""

    ckpt_dir: str
    _: KW_ONLY
    retries: Retries
    handback: HandBack
    notice: Callable[[str], None]
    #: hook id -> full tracebacks printed
    _tracebacks: dict[str, int] = field(default_factory=dict, init=False)
    _tracebacks_lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def deliver(self, d: Delivery, first: Attempt | None = None) -> DeliveryResult:
        """Run ``d`` until it succeeds, its retries are spent, or the watcher stops, each
        attempt on a thread we stop waiting for after the hook's timeout, if it has one.
        ``first``: its first attempt, made already (:meth:`run`'s direct call), is judged."""

        def attempt(d: Delivery, out: DeliveryResult, n: int) -> None:
            if n == 1 and first is not None:
                self._judge(first.returned, first.error, d, out)
            else:
                self._attempt(d, out, n)

        try:
            return self.retries.run(d, attempt, None if first is None else first.t0)
        except Exception as exc:
            return DeliveryResult.of(d, "failed", error=f"internal error: {exc!r}")

    def run(self, runs: list[Run], stopped: Callable[[], bool]) -> Ran:
        """Deliver ``runs`` in order, in the caller's thread: a queue's worker, or the
        engine's for a replay's inline lane (watcher.engine.engine). The one loop of every
        callable's deliveries: a replay runs millions in a row. ``stopped`` is asked before
        a call at most every :data:`_ASK_STOP_S`: once it is true, what was not started is
        abandoned.

        Returns what ``Completions.complete`` (watcher.engine.completion) takes: the
        deliveries with a result (what a callable returned, a failure after its retries, a
        skipped save, the abandoned), and the plain successes (a callable that returned None
        at its first attempt) as runs, with no :class:`Delivery` or result of their own."""
        finished: list[Finished] = []
        ok: list[Run] = []
        ckpt_dir, event_of, perf_counter = self.ckpt_dir, Event.of, time.perf_counter
        plain = _PLAIN_KEYS.issuperset  # the common payload, passed as it is (_keywords)
        asked = 0.0  # when ``stopped`` was last asked
        for hook, batch, recs, ds in runs:
            target: Any = hook.target
            inline = hook.inline
            # a hook with a timeout or on save (its checkpoint may be gone) runs through
            # deliver, asking before each call; the others ask after a slow call at once
            ask = _ASK_STOP_S if inline else -1.0
            acted: set[int] = set()  # the positions with a result: in ``finished``
            ran = len(recs)
            for i, rec in enumerate(recs):
                t0 = perf_counter()
                if t0 - asked > ask:
                    if stopped():
                        ran = i
                        break
                    asked = t0
                    if not inline:
                        d = ds[i] if ds else Delivery(hook, rec, batch)
                        finished.append((d, self.deliver(d)))
                        acted.add(i)
                        continue
                data = rec["data"]
                try:
                    returned = target(
                        event_of(rec, ckpt_dir, data, hook),
                        **(data if plain(data) else _keywords(data)),
                    )
                    if returned is None:
                        continue
                    first = Attempt(returned, None, t0)
                except BaseException as exc:  # a callback's SystemExit too: it fails
                    first = Attempt(None, exc, t0)
                d = ds[i] if ds else Delivery(hook, rec, batch)
                finished.append((d, self.deliver(d, first)))
                acted.add(i)
            for i in range(ran, len(recs)):  # the watcher stops: the rest is abandoned
                d = ds[i] if ds else Delivery(hook, recs[i], batch)
                finished.append((d, abandoned(d)))
            took = recs if ran == len(recs) and not acted else recs[:ran]
            if acted:
                took = [rec for i, rec in enumerate(took) if i not in acted]
            if took:
                ok.append(Run(hook, batch, took))
        return finished, ok

    def _attempt(self, d: Delivery, out: DeliveryResult, n: int) -> None:
        """One call, on a thread we stop waiting for after the hook's timeout (if any)."""
        fn: Callable[..., Any] = d.hook.target  # type: ignore[assignment]
        rec = d.record
        data = rec["data"]
        event = Event.of(rec, self.ckpt_dir, data, d.hook)
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
