"""A replay's one lane run in the engine's own thread (issue 52: a 1M-record replay into a
callable).

A replay whose only lane is a plain callable (an object's methods, or one callable: no
timeout, no save to lease, every record delivered, one at a time) skips its queue: each
batch runs as it is read, while its records are in the CPU's caches, with no second
thread and no :class:`~watcher.hooks.delivery.Delivery` per record (dispatch makes
``Plain`` runs), and is recorded at once. No other lane waits for the reading, and a
replay has nothing else to read. With several lanes each keeps its queue, so a slow one
delays only itself (watcher.engine.dispatch makes pairs for a lone lane only).
"""

from __future__ import annotations

import threading
import time

from watcher.engine.attempts import Runner
from watcher.engine.callable_runner import CallableRunner
from watcher.engine.completion import Completions
from watcher.engine.queues import HookQueue, failed_with
from watcher.hooks.delivery import Batch, Delivery, Plain
from watcher.hooks.hook import Hook


def runs_inline(lane: list[Hook], runner: Runner) -> bool:
    """Whether a replay may run ``lane`` (with ``runner``, its hooks' runner) in the
    engine's thread (module doc)."""
    first = lane[0]
    return (
        isinstance(runner, CallableRunner)
        and all(h.inline and h.options.queue == "all" for h in lane)
        and (first.owner is not None or first.options.concurrency <= 1)
    )


class InlineLane:
    """Runs one lane's deliveries of each batch in the caller's thread and records them:
    what its queue's worker would do, with ``queue`` kept for its object's
    ``after_deliveries()`` (an exporter writes what it buffered)."""

    def __init__(
        self,
        runner: CallableRunner,
        queue: HookQueue,
        completions: Completions,
        stop: threading.Event,
    ) -> None:
        self.runner = runner
        self.queue = queue
        self.completions = completions
        self.stop = stop

    def run(self, runs: list[Plain], batch: Batch) -> None:
        """Deliver ``runs`` (``batch``'s, in journal order) and record them."""
        started = time.time()
        succeeded, finished = self.runner.deliver_plain(runs, batch, self.stop)
        if not self.stop.is_set() and (error := self.queue.after_deliveries()) is not None:
            ran = [(Delivery(h, r, batch), None) for h, recs in succeeded for r in recs]
            finished, succeeded = failed_with([*finished, *ran], error), []
        if finished:
            self.completions.complete_many(finished, started)
        if succeeded:
            self.completions.complete_plain(batch, succeeded, started)
