"""One delivery's attempts: the retry loop every runner shares, and what a runner is.

A runner (:mod:`watcher.engine.command_runner`, :mod:`watcher.engine.callable_runner`, the
scheduler's jobs through :mod:`watcher.engine.jobs`) makes one attempt of a delivery at a
time; :class:`Retries` repeats it with a doubling backoff (capped at 60 s) until it succeeds,
its retries are spent or the watcher stops, and reports into one :class:`DeliveryResult`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from watcher.hooks.delivery import Delivery, DeliveryResult

log = logging.getLogger("watcher")

#: One attempt of a delivery (its number from 1): fills in the result's status and the rest.
AttemptFn = Callable[[Delivery, DeliveryResult, int], None]
#: The longest wait between two attempts, in seconds.
MAX_BACKOFF_S = 60.0
#: Output kept in the results file per stream: a command's (its delivery log keeps 64 KiB),
#: a callable's traceback.
TAIL_BYTES = 2000


class Runner(Protocol):
    """Runs the deliveries of one kind of hook (chosen once per lane: watcher.engine.execute)."""

    def deliver(self, d: Delivery) -> DeliveryResult:
        """Run ``d`` until it succeeds, its retries are spent, or the watcher stops."""
        ...


#: A delivery a runner ran (or abandoned), with its result.
Finished = tuple[Delivery, DeliveryResult]


def abandoned(d: Delivery) -> DeliveryResult:
    """The result of ``d``, never started: the watcher stops."""
    return DeliveryResult.of(d, "abandoned", error="watcher stopped")


class Checkpoints(Protocol):
    """What the attempts ask of the checkpoints (watcher.engine.leasing.CheckpointGuard)."""

    def removed(self, d: Delivery) -> bool:
        """Whether a save delivery's checkpoint is gone already (it is then skipped)."""
        ...


@dataclass(frozen=True, slots=True)
class Attempt:
    """A callable's first attempt, made before any result (the inline fast path)."""

    returned: Any
    error: BaseException | None
    t0: float  # its perf_counter start


@dataclass(eq=False)
class Retries:
    """The retry loop of one executor: ``stop`` ends retries and backoff waits early;
    ``checkpoints`` skips a save whose checkpoint was removed."""

    stop: threading.Event
    checkpoints: Checkpoints

    def run(self, d: Delivery, attempt: AttemptFn, first_t0: float | None = None) -> DeliveryResult:
        """``attempt`` until it succeeds, its retries are spent, or the watcher stops.
        ``first_t0``: the first attempt was made already (its start), and ``attempt(d, out,
        1)`` only judges it."""
        opts = d.hook.options
        if self.checkpoints.removed(d):
            path = d.record["data"].get("checkpoint_path")
            return DeliveryResult.of(d, "skipped", error=f"checkpoint {path} was removed")
        started = time.time()
        out = DeliveryResult.of(d, "failed", start_ts=started)
        for n in range(1, opts.retries + 2):
            out.attempts = n
            t0 = time.perf_counter()
            if first_t0 is not None and n == 1:  # it ran before this loop: timed from then
                out.start_ts = started - (t0 - first_t0)
                t0 = first_t0
            try:
                attempt(d, out, n)
            except Exception as exc:  # ours, not the hook's: the attempt and its log still count
                log.exception("delivery %s, attempt %d", d.delivery_id, n)
                out.status, out.error = "failed", f"internal error: {type(exc).__name__}: {exc}"
            out.duration = time.perf_counter() - t0
            if out.status in ("ok", "skipped") or self.stop.is_set():
                break
            if n <= opts.retries:
                delay = min(MAX_BACKOFF_S, opts.backoff * 2 ** (n - 1))
                if self.stop.wait(delay):
                    break
        out.end_ts = time.time()
        return out
