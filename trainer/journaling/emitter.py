"""Journal emission from the training loop: rank 0 writes, the other ranks do nothing.

Intra-step records are deferred and written in one ``os.write`` with the step's ``step_end``
(or earlier, with any durable record): after tensor work the append path runs with cold
caches, and paying that once per step instead of once per record cuts the journal's cost
per step about threefold. Every record keeps its own ``ts`` and ``seq``; a crash can lose at
most the current step's intra-step records. Also measures, directly, the time spent inside
journal appends (for the overhead report).

A record's position (step, epoch, samples seen) is read from the training state it follows
when it is emitted, so no call site can stamp a record with a stale step.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Any, Protocol

from journal.record.events import MICROBATCH_EVENTS
from journal.store import JournalWriter

#: Written together with the next immediate record (step_end at the latest).
DEFERRED_EVENTS = frozenset(
    {
        "epoch_begin",
        "step_begin",
        "before_optimizer_step",
        "after_optimizer_step",
        "log",
        "evaluate",
    }
    | MICROBATCH_EVENTS
)


class Position(Protocol):
    """Where training is: what a record's envelope says (``TrainerState`` is one)."""

    @property
    def step(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    @property
    def samples_seen(self) -> int: ...


@dataclass
class Where:
    """A plain :class:`Position`: before the training state exists, or for a loop that
    tells the step itself (the Accelerate tracker)."""

    step: int = 0
    epoch: int = 0
    samples_seen: int = 0


class Emitter:
    """Appends lifecycle records with the followed state's position in the envelope."""

    def __init__(
        self, writer: JournalWriter | None, detail: str, position: Position | None = None
    ) -> None:
        self.writer = writer
        self.detail = detail
        self.microbatch = writer is not None and detail == "microbatch"
        self.position: Position = Where() if position is None else position
        self.append_ns = 0  # all appends, fsync of durable records included
        self.appends = 0
        self.durable_ns = 0  # the part spent on durable (fsynced) records
        self.durable_appends = 0

    def emit(self, event: str, data: dict[str, Any] | None = None) -> None:
        w = self.writer
        if w is None:
            return
        at = self.position
        t0 = time.perf_counter_ns()
        w.append(
            event,
            data,
            step=at.step,
            epoch=at.epoch,
            samples_seen=at.samples_seen,
            defer=event in DEFERRED_EVENTS,
        )
        dt = time.perf_counter_ns() - t0
        self.append_ns += dt
        self.appends += 1
        if event in w.durable_events:
            self.durable_ns += dt
            self.durable_appends += 1

    def emit_micro(self, event: str, data: dict[str, Any]) -> None:
        """Per-micro-batch events, recorded only at ``journal_detail="microbatch"``."""
        if self.microbatch:
            assert event in MICROBATCH_EVENTS
            self.emit(event, data)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def failure_payload(exc: BaseException, reason: str | None = None) -> dict[str, Any]:
    """The ``train_end`` payload of a failed attempt: the error (``reason`` when the cause
    is known better than the exception says) and its traceback's tail."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = str(exc)
    first = message.strip().splitlines()[0] if message.strip() else ""
    return {
        "status": "failed",
        "reason": reason or f"{type(exc).__name__}: {first}",
        "final_checkpoint": None,
        "error_type": type(exc).__name__,
        "error_message": message[:2000],
        "traceback": "\n".join(tb.strip().splitlines()[-25:]),
    }
