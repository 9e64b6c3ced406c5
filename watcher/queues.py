"""Per-hook queues: ``concurrency`` worker threads and a queue policy for each hook."""

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
    """Pending deliveries of one hook and the threads that run them.

    With the ``latest`` policy a new delivery replaces every pending one (recorded as
    ``coalesced``): a hook on ``log`` runs for the newest record, never falls behind.

    Nothing that goes wrong while recording a delivery (a full disk, a record nobody
    expected) ends a worker: ``notice`` says so in one line and the hook goes on.
    """

    def __init__(
        self,
        hook: Hook,
        deliver: Deliver,
        complete: Complete,
        *,
        notice: Callable[[str], None] = log.error,
    ) -> None:
        self.hook = hook
        self._deliver, self._complete_fn, self._notice = deliver, complete, notice
        self._queue: deque[Delivery] = deque()
        self._cond = threading.Condition()
        self._running = 0
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"hook-{hook.short_id}-{i}", daemon=True)
            for i in range(max(1, hook.options.concurrency))
        ]
        for t in self._threads:
            t.start()

    def submit(self, d: Delivery) -> None:
        dropped: list[Delivery] = []
        with self._cond:
            if self.hook.options.queue == "latest":
                dropped, self._queue = list(self._queue), deque()
            self._queue.append(d)
            self._cond.notify()
        for old in dropped:
            self._complete(old, DeliveryResult.of(old, "coalesced"))

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
                f"{self.hook.label}: recording the {d.hook.event} delivery of seq "
                f"{d.record['seq']} failed ({type(exc).__name__}: {exc}); the hook goes on"
            )
