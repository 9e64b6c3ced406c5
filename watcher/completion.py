"""Completion and the durable cursor: what has been delivered, and where to re-read from.

A batch of records is opened when it is read and closed when every delivery made from it
has completed. The cursor's offset is the start of the oldest open batch (or the read
position when none is open); seqs completed inside open batches are remembered per hook so a
restart neither loses nor repeats work.

Completing a delivery releases its checkpoint lease first (see
:class:`watcher.leasing.CheckpointGuard`), then records it and moves the cursor, then wakes
the engine, which may be waiting for the last deliveries to finish.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import orjson

from watcher.cursor import Cursor, CursorState
from watcher.delivery import Batch, Delivery, DeliveryResult, state_write_failed
from watcher.leasing import CheckpointGuard
from watcher.wake import Waker

Reporter = Callable[[DeliveryResult], None]


class Completions:
    """Thread-safe record of finished deliveries; saves the cursor after each change.

    A results file or cursor that cannot be written (full disk, read-only state dir) is
    said once through ``notice`` and counted in ``unrecorded``; delivery goes on.

    The engine says how far it has read (:meth:`open_batch`, :meth:`read_to`): with no
    batch open, the cursor moves there."""

    def __init__(
        self,
        cursor: Cursor,
        *,
        results_path: Path | None,
        reporter: Reporter | None,
        checkpoints: CheckpointGuard,
        waker: Waker,
        notice: Callable[[str], None],
    ) -> None:
        self.cursor = cursor
        self.results_path = results_path
        self.reporter = reporter
        self.checkpoints = checkpoints
        self.waker = waker
        self._notice = notice
        self._read_end = (0, 0)  # (offset, line_no) just past what the engine has read
        self.state = CursorState()
        self.results: list[DeliveryResult] = []
        self.failed = 0
        self.unrecorded = 0  # results that could not be appended to the results file
        self._batches: deque[Batch] = deque()
        self._lock = threading.Lock()

    def reset(self, state: CursorState) -> None:
        """Start over from ``state`` (a new start position, or a replaced journal)."""
        with self._lock:
            self._batches.clear()
            self.state = state
            self._read_end = (state.offset, state.line_no)

    def is_done(self, hook_id: str, seq: int) -> bool:
        """Completed before a restart (the cursor remembers it)."""
        return seq in self.state.done.get(hook_id, ())

    def open_batch(
        self, start: tuple[int, int], end: tuple[int, int], min_seq: int, pending: int
    ) -> Batch:
        """Records read from ``start`` to ``end`` (offset, line_no), from which ``pending``
        deliveries were made."""
        batch = Batch(*start, min_seq, pending)
        with self._lock:
            self._batches.append(batch)
            self._read_end = end
        if not pending:
            self.advance()
        return batch

    def read_to(self, end: tuple[int, int]) -> None:
        """Read up to ``end`` with no record to deliver (only invalid lines, or nothing)."""
        with self._lock:
            self._read_end = end

    def complete(self, d: Delivery, out: DeliveryResult) -> None:
        """A delivery finished (or was coalesced away, or abandoned at shutdown)."""
        self.checkpoints.release(d)
        with self._lock:
            self.results.append(out)
            if out.failed:
                self.failed += 1
            d.batch.pending -= 1
            self.state.done.setdefault(d.hook.id, set()).add(d.record["seq"])
        if self.results_path is not None:
            self._append_result(self.results_path, out)
        if self.reporter is not None and out.status != "coalesced":
            try:
                self.reporter(out)
            except Exception as exc:  # the console must not stop deliveries
                self._notice(f"cannot show a delivery's result: {type(exc).__name__}: {exc}")
        self.advance()
        self.waker.wake()

    def _append_result(self, path: Path, out: DeliveryResult) -> None:
        line = orjson.dumps(asdict(out), option=orjson.OPT_APPEND_NEWLINE)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                view = memoryview(line)
                while view:  # a short write (disk full) raises on the next one
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        except OSError as exc:
            with self._lock:
                self.unrecorded += 1
            self._notice(state_write_failed(path.parent, exc))

    def advance(self) -> None:
        """Move the durable cursor past every leading batch whose deliveries are all done."""
        with self._lock:
            while self._batches and self._batches[0].pending <= 0:
                self._batches.popleft()
            if self._batches:
                head = self._batches[0]
                self.state.offset, self.state.line_no = head.offset, head.line_no
                floor = head.min_seq
                self.state.done = {
                    k: {s for s in v if s >= floor} for k, v in self.state.done.items()
                }
            else:
                self.state.offset, self.state.line_no = self._read_end
                self.state.done = {}
            snapshot = CursorState(
                self.state.offset,
                self.state.line_no,
                self.state.fingerprint,
                {k: set(v) for k, v in self.state.done.items()},
            )
            try:
                self.cursor.save(snapshot)
            except OSError as exc:
                where = self.cursor.path.parent if self.cursor.path else Path(".")
                self._notice(state_write_failed(where, exc))
