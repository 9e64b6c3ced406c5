"""Completion and the durable cursor: what has been delivered, and where to re-read from.

A batch of records is opened when it is read and closed when every delivery made from it
has completed. The cursor's offset is the start of the oldest open batch (or the read
position when none is open); seqs completed inside open batches are remembered per hook so a
restart neither loses nor repeats work.

Completing a delivery releases its checkpoint lease first (see
:class:`watcher.engine.leasing.CheckpointGuard`), then records it and moves the cursor, then wakes
the engine, which may be waiting for the last deliveries to finish.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

import orjson

from journal.rundir.safety import APPEND, open_no_follow
from journal.store import START, Cursor
from watcher.engine.attempts import Finished
from watcher.engine.cursor import CursorFile, CursorState
from watcher.engine.leasing import CheckpointGuard
from watcher.engine.statedir import StateFiles
from watcher.engine.wake import Waker
from watcher.hooks.delivery import (
    Batch,
    Delivery,
    DeliveryResult,
    Run,
    already_said,
    state_write_failed,
)

Reporter = Callable[[DeliveryResult], None]
log = logging.getLogger("watcher")

#: Errors kept per hook for summaries (every one is in the results file).
ERRORS_KEPT = 3
#: A hook's failed deliveries shown one by one on the console; later ones are counted,
#: said in one line at 10, 100, 1,000, ... failures and once more when the watcher ends.
FAILURES_SHOWN = 3
#: Every failure has its results line; the first and the last this many of a hook keep
#: their output tails (a callback's traceback), the others their one-line error only.
TAILS_KEPT = 5
#: A replay's plain successes are written (one results line, one cursor save) once this
#: many wait, or after :data:`RECORD_EVERY_S`: a write costs as much as hundreds of calls,
#: and a batch small enough to stay in the CPU's caches holds about 130 (docs/performance.md).
#: A ``kill -9`` so repeats at most these and the batch that was running (64 KiB: at most
#: 700 of the smallest records), under the 4,096 of a worker's (watcher.engine.queues
#: ``TAKE_MAX``).
RECORD_AFTER = 3_072
RECORD_EVERY_S = 0.1


@dataclasses.dataclass
class HookFailures:
    """One hook's failed deliveries so far (a callback that raises on every record must
    not write a traceback per record: 100,000 records once made 268 MB of stderr)."""

    count: int = 0
    first_seq: int = 0
    last: DeliveryResult | None = None
    #: the latest failures whose tails were left out of their results lines
    tails: deque[DeliveryResult] = dataclasses.field(
        default_factory=lambda: deque(maxlen=TAILS_KEPT)
    )

    def add(self, out: DeliveryResult) -> bool:
        """Count ``out`` (trimming its tails past the first :data:`TAILS_KEPT`); whether the
        console shows it."""
        self.count += 1
        if self.count == 1:
            self.first_seq = out.seq
        self.last = out
        if self.count > TAILS_KEPT and (out.stderr_tail or out.stdout_tail):
            self.tails.append(dataclasses.replace(out))
            out.stderr_tail = out.stdout_tail = None
        return self.count <= FAILURES_SHOWN

    def so_far(self) -> str | None:
        """The one line said at 10, 100, 1,000, ... failures (None at other counts)."""
        n = self.count
        if n <= FAILURES_SHOWN or 10 ** round(math.log10(n)) != n or self.last is None:
            return None
        if already_said(self.last.error):  # a tracker that stopped answering: said once
            return None
        return (
            f"{self.last.hook} on {self.last.event}: {n} failures so far, the latest at seq "
            f"{self.last.seq}: {self.last.error} (shown: the first {FAILURES_SHOWN})"
        )


class Completions:
    """Thread-safe record of finished deliveries; saves the cursor as they complete.

    Deliveries complete in batches (:meth:`complete`: what a queue's worker or a replay's
    inline lane ran in one go): the results file gets one write and the cursor one save per
    batch (a replay's plain successes: per :data:`RECORD_AFTER`), so a crash repeats at most
    the batch that was running. Nothing here grows with the number of deliveries already
    made: finished results are counted (:attr:`tally`), not kept.

    A results file or cursor that cannot be written (full disk, read-only state dir) is
    said once through ``notice`` and counted in ``unrecorded``; delivery goes on.

    The engine says how far it has read (:meth:`open_batch`, :meth:`read_to`): with no
    batch open, the cursor moves there."""

    def __init__(
        self,
        cursor: CursorFile,
        *,
        files: StateFiles | None,
        reporter: Reporter | None,
        checkpoints: CheckpointGuard,
        waker: Waker,
        notice: Callable[[str], None],
    ) -> None:
        self.cursor = cursor
        self.files = files
        self.results_path = files.results if files is not None else None
        self.reporter = reporter
        self.checkpoints = checkpoints
        self.waker = waker
        self._notice = notice
        self._read_end = START  # just past what the engine has read
        self.state = CursorState()
        #: finished deliveries by (hook label, event, status)
        self.tally: Counter[tuple[str, str, str]] = Counter()
        #: the first errors of each hook (label, event), at most ERRORS_KEPT each
        self.errors: dict[tuple[str, str], list[str]] = {}
        self.failures: dict[tuple[str, str], HookFailures] = {}  # per hook (label, event)
        self.failed = 0
        self.unrecorded = 0  # results that could not be appended to the results file
        self._batches: deque[Batch] = deque()
        self._pending = 0  # deliveries of the open batches not completed yet
        self._floor: int | None = None  # the min seq of the head batch, done sets pruned to it
        #: plain successes not written yet (complete's ``defer``): id(hook) -> [its first
        #: delivery, count, last seq, started]
        self._lines: dict[int, list[Any]] = {}
        self._unsaved = False  # the cursor moved since it was last saved
        self._recorded = 0.0  # time.monotonic() of the last save
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()

    def reset(self, state: CursorState) -> None:
        """Start over from ``state`` (a new start position, or a replaced journal)."""
        with self._lock:
            self._batches.clear()  # (deliveries in flight still count in _pending)
            self._floor = None
            self.state = state
            self._read_end = state.at

    @property
    def pending(self) -> int:
        """Deliveries made and not completed yet."""
        return self._pending

    def open_batch(self, batch: Batch, end: Cursor) -> None:
        """Records read from ``batch``'s start to ``end``, from which
        ``batch.pending`` deliveries were made (none of them handed to a queue yet)."""
        with self._lock:
            self._batches.append(batch)
            self._read_end = end
            self._pending += batch.pending
            if not batch.pending:
                self._move_head()  # saved with the next record, or by flush
                self._unsaved = True

    def read_to(self, end: Cursor) -> None:
        """Read up to ``end`` with no record to deliver (only invalid lines, or nothing)."""
        with self._lock:
            self._read_end = end

    def complete(
        self,
        finished: Sequence[Finished],
        started: float,
        ok: Sequence[Run] = (),
        defer: bool = False,
    ) -> None:
        """Deliveries run in one go since ``started`` (a queue's worker, a replay's inline
        lane: watcher.engine.callable_runner ``CallableRunner.run``), recorded together:
        ``finished`` with their results, in order; ``ok`` a callable's plain successes, as
        runs, whose records of one hook become one results line (:func:`plain_line`).
        ``defer`` (the engine's thread, which calls :meth:`flush` before it waits): plain
        successes alone wait to be written (:data:`RECORD_AFTER`), their lines growing."""
        leased = [d for d, _ in finished if d.lease is not None]
        outs: list[DeliveryResult] = []
        with self._lock:
            done = self.state.done
            for d, out in finished:
                outs.append(out)
                if out.status != "abandoned":
                    # abandoned: not delivered, its batch stays open, so the cursor keeps it
                    # and the next start delivers it (the seqs done beside it are remembered)
                    d.batch.pending -= 1
                    done.setdefault(d.hook.id, set()).add(d.record["seq"])
            self._pending -= len(finished)
            for hook, batch, recs, _ in ok:
                batch.pending -= len(recs)
                self._pending -= len(recs)
                # the oldest open batch, done: the cursor moves past it (advance), so its
                # seqs need not be remembered (a replay's every batch, in order)
                if batch.pending > 0 or not self._batches or self._batches[0] is not batch:
                    done.setdefault(hook.id, set()).update(map(_seq_of, recs))
                line = self._lines.setdefault(
                    id(hook), [Delivery(hook, recs[0], batch), 0, 0, started]
                )
                line[1] += len(recs)
                line[2] = recs[-1]["seq"]
            self._move_head()
            waiting = sum(line[1] for line in self._lines.values())
            due = waiting >= RECORD_AFTER or time.monotonic() - self._recorded >= RECORD_EVERY_S
            if defer and not finished and not due:
                return
            outs += self._take_lines()
            hidden, said = self._count(outs)
        self._record(outs, leased, hidden, said)

    def flush(self) -> None:
        """Write what :meth:`complete` let wait: the plain successes' lines, and the cursor."""
        with self._lock:
            if not self._lines and not self._unsaved:
                return
            outs = self._take_lines()
            hidden, said = self._count(outs)
        self._record(outs, [], hidden, said)

    def _take_lines(self) -> list[DeliveryResult]:
        """The plain successes' lines so far, ended now (under the lock)."""
        ended = time.time()
        outs = [plain_line(d, n, last, t0, ended) for d, n, last, t0 in self._lines.values()]
        self._lines.clear()
        return outs

    def _count(self, outs: list[DeliveryResult]) -> tuple[set[int], list[str]]:
        """Tally ``outs`` (under the lock): the failures the console does not show one by
        one (by id), and the lines that count a hook's failures so far."""
        hidden: set[int] = set()
        said: list[str] = []
        for out in outs:
            self.tally[out.hook, out.event, out.status] += out.count
            if out.failed:
                self.failed += 1
                errors = self.errors.setdefault((out.hook, out.event), [])
                if len(errors) < ERRORS_KEPT:
                    errors.append(str(out.error))
                hook_failures = self.failures.setdefault((out.hook, out.event), HookFailures())
                if not hook_failures.add(out):
                    hidden.add(id(out))
                    if line := hook_failures.so_far():
                        said.append(line)
        return hidden, said

    def _record(
        self,
        outs: list[DeliveryResult],
        leased: list[Delivery],
        hidden: set[int],
        said: list[str],
    ) -> None:
        """After counting: release the leases, write the results, show them, move the
        cursor and wake the engine."""
        for d in leased:  # before the cursor moves past the delivery (module doc)
            self.checkpoints.release(d)
        if self.results_path is not None and outs:
            self._append_results(self.results_path, outs)
        if self.reporter is not None:
            for out in outs:
                if out.status == "coalesced" or out.count > 1 or id(out) in hidden:
                    continue
                try:
                    self.reporter(out)
                except Exception as exc:  # the console must not stop deliveries
                    self._notice(f"cannot show a delivery's result: {type(exc).__name__}: {exc}")
        for line in said:  # after the failures shown one by one
            log.warning("%s", line)
        # a command's result is worth a durable cursor at once: it may have run for an hour
        commands = any(out.kind == "command" for out in outs)
        self.advance(durable=True if commands else None)
        self.waker.wake()

    def close(self) -> None:
        """The watcher ends: for each hook that failed more often than the console showed,
        one line with the count, and a ``failures`` line in the results file holding the
        output tails of its last failures (the first ones have theirs in their own lines)."""
        self.flush()
        summaries = []
        with self._lock:
            failures, self.failures = self.failures, {}
        for f in failures.values():
            last = f.last
            if last is None:
                continue
            if f.count > FAILURES_SHOWN and not already_said(last.error):
                where = f"; every failure is in {self.results_path}" if self.results_path else ""
                seqs = f"seq {f.first_seq} to {last.seq}"
                said = f"{last.hook} on {last.event} failed {f.count} times in all ({seqs})"
                log.warning("%s, the last: %s%s", said, last.error, where)
            if f.tails:
                tails = "".join(
                    f"--- seq {t.seq} ({t.delivery_id}): {t.error}\n"
                    + "".join(x for x in (t.stdout_tail, t.stderr_tail) if x)
                    for t in f.tails
                )
                summaries.append(
                    DeliveryResult(
                        delivery_id="",
                        hook=last.hook,
                        event=last.event,
                        seq=f.first_seq,
                        step=last.step,
                        status="failures",
                        kind=last.kind,
                        error=f"failed {f.count} times; the output of the last {len(f.tails)}"
                        " follows",
                        stderr_tail=tails,
                        count=f.count,
                        last_seq=last.seq,
                    )
                )
        if summaries and self.results_path is not None:
            self._append_results(self.results_path, summaries)

    def _append_results(self, path: Path, outs: list[DeliveryResult]) -> None:
        data = b"".join(orjson.dumps(out, option=orjson.OPT_APPEND_NEWLINE) for out in outs)
        assert self.files is not None
        try:
            with open(open_no_follow(path, APPEND, root=self.files.root), "ab") as f:
                f.write(data)  # a short write (disk full) raises
        except OSError as exc:
            with self._lock:
                self.unrecorded += len(outs)
            self._notice(state_write_failed(path.parent, exc))

    def advance(self, *, durable: bool | None = None) -> None:
        """Move the durable cursor past every leading batch whose deliveries are all done,
        and save it (with the seqs completed in batches still open; ``durable``: see
        `CursorFile.save`)."""
        with self._save_lock:  # saves in the order their states were taken
            with self._lock:
                self._move_head()
                self._unsaved = False
                self._recorded = time.monotonic()
                if self.cursor.path is None:
                    return
                data = self.state.to_json()  # under the lock: the done sets change outside it
            try:
                self.cursor.save(data, durable=durable)
            except OSError as exc:
                self._notice(state_write_failed(self.cursor.path.parent, exc))

    def _move_head(self) -> None:
        """The cursor's state past every leading batch whose deliveries are all done (under
        the lock; saved by :meth:`advance`)."""
        while self._batches and self._batches[0].pending <= 0:
            self._batches.popleft()
        if self._batches:
            head = self._batches[0]
            self.state.at = head.start
            if head.min_seq != self._floor:  # only when the head moved: linear in all
                self._floor = floor = head.min_seq
                self.state.done = {
                    k: {s for s in v if s >= floor} for k, v in self.state.done.items()
                }
        else:
            self.state.at = self._read_end
            self.state.done = {}
            self._floor = None


def plain_line(
    first: Delivery, count: int, last_seq: int, started: float, ended: float
) -> DeliveryResult:
    """One results line for ``count`` plain successes of one callable, from ``first`` (its
    delivery id) to seq ``last_seq``, run from ``started`` to ``ended``."""
    out = DeliveryResult.of(first, "ok", attempts=1, start_ts=started, end_ts=ended)
    out.duration = ended - started
    if count > 1:
        out.count, out.last_seq = count, last_seq
    return out


_seq_of = itemgetter("seq")
