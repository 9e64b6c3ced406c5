"""Delivery queues: one per callback object (its methods, in journal order) or per lone hook
(a command or a callable), with its worker threads and queue policies."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from watcher.engine.attempts import Finished, abandoned
from watcher.hooks.callbacks import CommandTarget
from watcher.hooks.delivery import Delivery, DeliveryResult, Run, TrackerUnavailable, runs_of
from watcher.hooks.hook import Hook

#: Runs one delivery (a runner's ``deliver``, watcher.engine.attempts.Runner): its result.
Deliver = Callable[[Delivery], DeliveryResult]
#: Runs runs of deliveries in a row, abandoning the rest once told to stop (a callable
#: runner's ``run``): the deliveries with a result, and the plain successes as runs.
RunMany = Callable[[list[Run], Callable[[], bool]], tuple[list[Finished], list[Run]]]
#: Records deliveries run in one go (``Completions.complete``): those with a result, when
#: their run started, plain successes as runs, and whether plain successes alone may wait
#: to be written (the engine's own thread: it flushes them).
Complete = Callable[[Sequence[Finished], float, Sequence[Run], bool], None]

#: The most deliveries a worker of a callable lane takes at once: it runs them in order and
#: records them together (one results write, one cursor save), so a crash repeats at most
#: this many. Command lanes take one at a time (each is a process; its result is saved at
#: once).
TAKE_MAX = 4096

log = logging.getLogger("watcher")


class HookQueue:
    """Pending deliveries of one lane and the threads that run them.

    A lane is every hook of one callback object (``Hook.owner``, its shape), or one lone hook. The
    methods of one object share one queue and one worker thread, so they are called one at
    a time in journal order: ``on_train_end`` comes after every earlier record the object
    subscribes to, and a slow method delays only that object's later calls. A lone hook has
    ``concurrency`` workers (its deliveries may then overlap).

    Coalescing (a hook with the ``latest`` policy): a new delivery replaces the pending
    deliveries of the same hook queued after the last pending delivery of an ``all`` hook
    (recorded as ``coalesced``). Coalescing never reaches across such a record: a ``log``
    pending before a ``train_end`` (or a ``save``) runs, before it. For a lone hook this is
    "the newest pending one runs": a hook on ``log`` never falls behind.

    A worker of a callable lane takes every pending delivery (up to :data:`TAKE_MAX`),
    runs them in one loop of its runner's (``run_many``) and hands their results to
    ``complete`` together: a replay pays one thread hand-off, results write and cursor save
    per batch, not per delivery, and a live record still runs as soon as it is queued. A
    replay's inline lane has its runs made by dispatch and run in the engine's thread
    (:meth:`run_here`), recorded the same way.

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
        run_many: RunMany | None = None,
    ) -> None:
        self.hooks = hooks
        self._deliver, self._complete_fn, self._notice = deliver, complete, notice
        self._queue: deque[Delivery] = deque()
        self._cond = threading.Condition()
        self._running = 0
        #: the watcher stops: what was not started is abandoned (read per delivery)
        self.closed = False
        first = hooks[0]
        # an object's methods: one worker, so that its calls keep the journal's order
        workers = 1 if first.owner is not None else max(1, first.options.concurrency)
        commands = any(isinstance(h.target, CommandTarget) for h in hooks)
        self._take = 1 if commands or workers > 1 else TAKE_MAX
        # what a worker takes runs in one loop of the runner's (a callable's)
        self._many = run_many
        self._after = first.owner.after_deliveries if first.owner is not None else None
        self._threads = [
            threading.Thread(target=self._work, name=f"hook-{first.short_id}-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit_many(self, deliveries: list[Delivery]) -> None:
        """Queue ``deliveries`` (in journal order) with one hand-off to the workers."""
        dropped: list[Delivery] = []
        with self._cond:
            if not any(h.options.queue == "latest" for h in self.hooks):
                self._queue.extend(deliveries)  # nothing to coalesce: in C
            else:
                for d in deliveries:
                    if d.hook.options.queue == "latest":
                        dropped += self._coalesce(d.hook)
                    self._queue.append(d)
            self._cond.notify(len(self._threads))
        if dropped:
            coalesced = [(old, DeliveryResult.of(old, "coalesced")) for old in dropped]
            self._complete(coalesced, time.time())

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
            self.closed = True
            left, self._queue = list(self._queue), deque()
            self._cond.notify_all()
        return left

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self.closed:
                    self._cond.wait()
                if self.closed:
                    return
                if len(self._queue) <= self._take:
                    taken = list(self._queue)
                    self._queue.clear()
                else:
                    taken = [self._queue.popleft() for _ in range(self._take)]
                self._running += len(taken)
            started = time.time()
            try:
                if self._many is None:
                    self._finish(self._run(taken), [], started, self._closed)
                else:
                    self._finish(*self._many(runs_of(taken), self._closed), started, self._closed)
            finally:
                with self._cond:  # idle only once the completion (and cursor) is recorded
                    self._running -= len(taken)

    def run_here(self, runs: list[Run], stop: threading.Event) -> None:
        """Run ``runs`` (a replay's inline lane: watcher.engine.dispatch) in the caller's
        thread, and record them as a worker does; ``stop`` abandons what is left."""
        started = time.time()
        assert self._many is not None  # an inline lane is a callable's
        self._finish(*self._many(runs, stop.is_set), started, stop.is_set, defer=True)

    def _closed(self) -> bool:
        return self.closed

    def _run(self, taken: list[Delivery]) -> list[Finished]:
        """Each of ``taken`` in order, one at a time through ``deliver``."""
        finished: list[Finished] = []
        deliver, add = self._deliver, finished.append
        for d in taken:
            if self.closed:  # the watcher stops: what was not started is abandoned
                add((d, abandoned(d)))
                continue
            try:
                add((d, deliver(d)))
            except Exception as exc:
                add((d, DeliveryResult.of(d, "failed", error=f"internal error: {exc!r}")))
        return finished

    def _finish(
        self,
        finished: list[Finished],
        ok: list[Run],
        started: float,
        stopped: Callable[[], bool],
        *,
        defer: bool = False,
    ) -> None:
        """Record what ran since ``started``, after the object's ``after_deliveries()``
        (unless ``stopped``): if it fails, so did the deliveries it was writing."""
        error = None if stopped() else self.after_deliveries()
        if error is not None:
            finished, ok = failed_with(finished, ok, error), []
        self._complete(finished, started, ok, defer)

    def after_deliveries(self) -> str | None:
        """The object's ``after_deliveries()`` (an exporter writes what it buffered), if it
        has one: None when it went well, else the error its deliveries failed with (said
        once for a tracker that stopped answering; the results and the exit code say the
        rest)."""
        if self._after is None:
            return None
        try:
            self._after()
        except Exception as exc:
            if isinstance(exc, TrackerUnavailable):
                self._notice(str(exc))
            else:
                log.exception("after_deliveries() of %s failed", self.hooks[0].label)
            return f"{type(exc).__name__}: {exc}"
        return None

    def _complete(
        self,
        finished: Sequence[Finished],
        started: float,
        ok: Sequence[Run] = (),
        defer: bool = False,
    ) -> None:
        try:
            self._complete_fn(finished, started, ok, defer)
        except Exception as exc:
            d = finished[0][0] if finished else Delivery(ok[0].hook, ok[0].records[0], ok[0].batch)
            self._notice(
                f"{d.hook.label}: recording the {d.hook.event} deliveries from seq "
                f"{d.record['seq']} failed ({type(exc).__name__}: {exc}); the hook goes on"
            )


def failed_with(finished: list[Finished], ok: list[Run], error: str) -> list[Finished]:
    """``finished`` and the plain successes ``ok``, their successes failed with ``error``
    (an ``after_deliveries()`` that failed: what it was writing is lost)."""

    def failed(d: Delivery) -> Finished:
        return d, DeliveryResult.of(d, "failed", error=error, attempts=1)

    plain = [failed(Delivery(h, rec, batch)) for h, batch, recs, _ in ok for rec in recs]
    return [failed(d) if out.status == "ok" else (d, out) for d, out in finished] + plain
