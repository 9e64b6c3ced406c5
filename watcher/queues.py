"""Delivery queues: one per callback object (its methods, in journal order) or per lone hook
(a command or a callable), with its worker threads and queue policies."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from watcher.delivery import Delivery, DeliveryResult
from watcher.hooks import Hook

Deliver = Callable[[Delivery], DeliveryResult]
Complete = Callable[[Delivery, DeliveryResult], None]

log = logging.getLogger("watcher")


class HookQueue:
    """Pending deliveries of one lane and the threads that run them.

    A lane is every hook of one callback object (``Hook.owner``), or one lone hook. The
    methods of one object share one queue and one worker thread, so they are called one at
    a time in journal order: ``on_train_end`` comes after every earlier record the object
    subscribes to, and a slow method delays only that object's later calls. A lone hook has
    ``concurrency`` workers (its deliveries may then overlap).

    Coalescing (a hook with the ``latest`` policy): a new delivery replaces the pending
    deliveries of the same hook queued after the last pending delivery of an ``all`` hook
    (recorded as ``coalesced``). Coalescing never reaches across such a record: a ``log``
    pending before a ``train_end`` (or a ``save``) runs, before it. For a lone hook this is
    "the newest pending one runs": a hook on ``log`` never falls behind.

    Nothing that goes wrong while recording a delivery (a full disk, a record nobody
    expected) ends a worker: ``notice`` says so in one line and the hook goes on.
    """

    def __init__(
        self,
        hooks: list[Hook],
        deliver: Deliver,
        complete: Complete,
        *,
        notice: Callable[[str], None] = log.error,
    ) -> None:
        self.hooks = hooks
        self._deliver, self._complete_fn, self._notice = deliver, complete, notice
        self._queue: deque[Delivery] = deque()
        self._cond = threading.Condition()
        self._running = 0
        self._closed = False
        first = hooks[0]
        # an object's methods: one worker, so that its calls keep the journal's order
        workers = 1 if first.owner is not None else max(1, first.options.concurrency)
        self._threads = [
            threading.Thread(target=self._work, name=f"hook-{first.short_id}-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, d: Delivery) -> None:
        dropped: list[Delivery] = []
        with self._cond:
            if d.hook.options.queue == "latest":
                dropped = self._coalesce(d.hook)
            self._queue.append(d)
            self._cond.notify()
        for old in dropped:
            self._complete(old, DeliveryResult.of(old, "coalesced"))

    def _coalesce(self, hook: Hook) -> list[Delivery]:
        """Take out ``hook``'s pending deliveries queued after the last ``all`` one (the
        scan stops there: the tail holds at most one delivery per ``latest`` hook)."""
        kept: list[Delivery] = []
        dropped: list[Delivery] = []
        while self._queue and self._queue[-1].hook.options.queue == "latest":
            d = self._queue.pop()
            (dropped if d.hook is hook else kept).append(d)
        self._queue.extend(reversed(kept))
        dropped.reverse()
        return dropped

    def idle(self) -> bool:
        with self._cond:
            return not self._queue and self._running == 0

    def close(self) -> list[Delivery]:
        """Stop taking work; return the deliveries that never started."""
        with self._cond:
            self._closed = True
            left, self._queue = list(self._queue), deque()
            self._cond.notify_all()
        return left

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                d = self._queue.popleft()
                self._running += 1
            try:
                out = self._deliver(d)
            except Exception as exc:
                out = DeliveryResult.of(d, "failed", error=f"internal error: {exc!r}")
            try:
                self._complete(d, out)
            finally:
                with self._cond:  # idle only once the completion (and cursor) is recorded
                    self._running -= 1

    def _complete(self, d: Delivery, out: DeliveryResult) -> None:
        try:
            self._complete_fn(d, out)
        except Exception as exc:
            self._notice(
                f"{d.hook.label}: recording the {d.hook.event} delivery of seq "
                f"{d.record['seq']} failed ({type(exc).__name__}: {exc}); the hook goes on"
            )


def lanes(hooks: list[Hook]) -> list[list[Hook]]:
    """The hooks grouped into lanes: those of one object together (by identity), each other
    hook alone, in the order first seen."""
    by_key: dict[int, list[Hook]] = {}
    for h in hooks:
        by_key.setdefault(id(h.owner) if h.owner is not None else id(h), []).append(h)
    return list(by_key.values())
