"""The dispatch engine behind ``ilab-watch`` and the embedded watcher of ``run_training``.

Reads journal records from a durable cursor, turns each (record, hook) pair into a delivery,
and runs deliveries on per-hook queues with timeouts, retries, a concurrency limit and a
queue policy. Delivery is at-least-once per (event, hook): the cursor only moves past a
record once every delivery of it has completed (or was coalesced away by a ``latest``
queue), and completed deliveries are remembered so a restart does not repeat them.

The parts, in the order a record meets them: :mod:`watcher.follow` (start position, reading,
replaced journals), :mod:`watcher.queues` (per-hook queues), :mod:`watcher.execute` (running
commands and callables), :mod:`watcher.completion` (results and the cursor).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from journal.leases import DEFAULT_TTL_S
from journal.paths import checkpoint_key, checkpoint_root
from journal.query import ended_before
from journal.rotation import prune_finished_run
from watcher.callbacks import callable_name
from watcher.command import end_leftovers
from watcher.completion import Completions, Reporter
from watcher.cursor import Cursor, CursorState
from watcher.delivery import Delivery, DeliveryResult
from watcher.execute import Executor
from watcher.follow import JournalFollower, StartAt
from watcher.hooks import Hook
from watcher.leasing import LeaseKeeper
from watcher.queues import HookQueue

log = logging.getLogger("watcher")

SAFETY_POLL_S = 1.0
#: How long a save delivery waits for the removal record of a checkpoint missing on disk.
REMOVAL_GRACE_S = 2.0


class Watcher:
    """Tail a journal and deliver its records to hooks. ``run()`` blocks; see its docstring.

    Args:
        journal: the journal file.
        hooks: what runs on which event.
        name: cursor identity; state files are ``<state_dir>/<name>.*``.
        state_dir: cursor, results file and delivery logs (None: nothing is written).
        start: where to begin when no cursor is saved: ``"start"``, ``"now"`` (the current
            end of the file), or a byte offset (then any saved cursor is ignored).
        follow: keep following until ``train_end`` (True), or deliver what the file holds
            now and return (False: ``ilab-watch --replay``).
        poll: poll every ``poll`` seconds instead of using filesystem events.
        persist_cursor: save the cursor in ``state_dir`` (the embedded watcher does not).
        reporter: called with each finished delivery's result (not for coalesced ones).
        stateful_callbacks: objects whose ``restore_state(records)`` is called once with the
            records before the start position, so they rebuild counters and best values.
        control_source: the ``source`` of control commands that callables return.
        lease_ttl: seconds a save delivery's checkpoint lease lives without renewal (it is
            renewed while the delivery is queued or running, and released after it).
    """

    def __init__(
        self,
        journal: Path,
        hooks: list[Hook],
        *,
        name: str = "watch",
        state_dir: Path | None = None,
        start: StartAt = "start",
        follow: bool = True,
        poll: float | None = None,
        persist_cursor: bool = True,
        reporter: Reporter | None = None,
        stateful_callbacks: list[Any] | None = None,
        control_source: str | None = None,
        lease_ttl: float = DEFAULT_TTL_S,
    ) -> None:
        self.journal = journal
        self.hooks = hooks
        self.name = name
        self.follow = follow
        self.stateful_callbacks = stateful_callbacks or []
        self.notices: list[str] = []
        self.saw_end = False
        self._start = start
        self._stop = threading.Event()
        self._final = threading.Event()  # the writer is gone: read to the end, torn tail included
        self._follower = JournalFollower(journal, poll=poll)
        cursor_path = state_dir / f"{name}.cursor.json" if state_dir and persist_cursor else None
        self.cursor = Cursor(cursor_path)
        self.results_path = state_dir / f"{name}.results.jsonl" if state_dir else None
        self.completions = Completions(
            self.cursor,
            results_path=self.results_path,
            reporter=reporter,
            read_position=lambda: self._follower.position,
            notice=self._notice,
        )
        executor = Executor(
            journal,
            logs_dir=state_dir / f"{name}.logs" if state_dir else None,
            control_source=control_source or f"watcher:{name}",
            stop=self._stop,
            removed=self._checkpoint_removed,
            running_dir=state_dir / f"{name}.running" if state_dir else None,
            notice=self._notice,
        )
        self._executor = executor
        self._running_dir = executor.running_dir
        self._leases = LeaseKeeper(journal.parent, ttl=lease_ttl, holder=f"watcher:{name}")
        self._removed: set[str] = set()  # checkpoints journaled as removed (by key)
        self._removed_cond = threading.Condition()
        self._queues = {
            id(h): HookQueue(h, executor.deliver, self._complete, notice=self._notice)
            for h in hooks
        }

    @property
    def results(self) -> list[DeliveryResult]:
        """Every finished delivery so far (coalesced ones included)."""
        return self.completions.results

    @property
    def failed_final(self) -> int:
        """Deliveries that finally failed (after their retries)."""
        return self.completions.failed

    # -- control from other threads -----------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()
        self._follower.waker.wake()

    def writer_finished(self) -> None:
        """Tell a follower that no more records will come (run_training after torchrun)."""
        self._final.set()
        self._follower.waker.wake()

    # -- main loop ---------------------------------------------------------------------

    def run(self) -> int:
        """Catch up from the cursor, then follow until ``train_end`` and all its deliveries
        are done (or, with ``follow=False``, until the end of the file). Returns 0 when every
        delivery succeeded, 1 when any finally failed."""
        follower = self._follower
        follower.waker.start()
        self._leases.start()
        try:
            self._begin()
            waiting_at: int | None = None
            while not self._stop.is_set():
                self._check_identity()
                final = not self.follow or self._final.is_set()
                before = follower.position
                batch = follower.read(final=final)
                for bad in batch.invalid:
                    self._notice(
                        f"{self.journal}:{bad.line_no}: skipped invalid line ({bad.reason})"
                    )
                if batch.records:
                    self._dispatch(batch.records, *before)
                if self._finished(final, progressed=follower.position != before):
                    break
                if waiting_at != follower.position[0] and self._idle():
                    # Said once per position, only with nothing in flight: a watcher that
                    # says this is following, not about to finish.
                    waiting_at = follower.position[0]
                    log.debug("idle at byte %d; waiting for more records", waiting_at)
                follower.waker.wait(SAFETY_POLL_S)
        finally:
            self._shutdown()
        return 1 if self.failed_final else 0

    def _finished(self, final: bool, progressed: bool) -> bool:
        if progressed:
            return False
        # Nothing new: done once train_end was seen, or the file is final (replay, or the
        # writer is gone), and every delivery has completed.
        return (self.saw_end or final) and self._idle()

    def _idle(self) -> bool:
        return all(q.idle() for q in self._queues.values())

    def _begin(self) -> None:
        if self._running_dir is not None and (n := end_leftovers(self._running_dir)):
            self._notice(f"ended {n} callback process group(s) a previous watcher left running")
        saved = self.cursor.load()
        if self.cursor.warning:
            self._notice(self.cursor.warning)
        if saved is not None and saved.offset and not isinstance(self._start, int):
            log.info("resuming cursor %s at byte %d", self.cursor.path, saved.offset)
        self.completions.reset(self._follower.start_state(self._start, saved, self._notice))
        # A restart past the run's train_end (its deliveries all done) has nothing to wait for.
        self.saw_end = ended_before(self.journal, self._follower.position[0])
        if self.stateful_callbacks:
            history = self._follower.history()
            for obj in self.stateful_callbacks:
                try:
                    obj.restore_state(history)
                except Exception:
                    log.exception("restore_state() of %s failed", callable_name(obj))

    def _check_identity(self) -> None:
        what = self._follower.check_identity()
        if what is None:
            if self.completions.state.fingerprint is None:
                self.completions.state.fingerprint = self._follower.fingerprint()
            return
        self._notice(f"{self.journal} was {what}; reading it again from the start")
        self.completions.reset(CursorState(fingerprint=self._follower.fingerprint()))
        self.saw_end = False

    def _dispatch(self, records: list[dict[str, Any]], offset: int, line_no: int) -> None:
        self._note_removals(records)
        todo: list[tuple[Hook, dict[str, Any]]] = []
        for rec in records:
            ev = rec.get("event")
            if ev == "train_end":
                self.saw_end = True
            elif ev == "train_begin":  # a resumed attempt: its predecessor's end is not ours
                self.saw_end = False
            todo.extend(
                (hook, rec)
                for hook in self.hooks
                if hook.event == ev and not self.completions.is_done(hook.id, rec["seq"])
            )
        batch = self.completions.open_batch(offset, line_no, records[0]["seq"], len(todo))
        for hook, rec in todo:
            did = f"{rec.get('run_id', '')}-{rec['seq']}-{hook.short_id}"
            d = Delivery(hook, rec, batch, did, lease=self._lease_for(rec))
            self._queues[id(hook)].submit(d)

    def _complete(self, d: Delivery, out: DeliveryResult) -> None:
        if d.lease is not None:
            self._leases.release(d.lease)
            if self.saw_end or self._final.is_set() or not self.follow:
                # No trainer rotates any more: apply its policy now (a no-op if one writes).
                try:
                    prune_finished_run(self.journal.parent, role=f"watcher:{self.name}")
                except Exception as exc:  # rotation is the trainer's job; delivery goes on
                    self._notice(f"cannot apply the run's rotation policy: {exc}")
        self.completions.complete(d, out)
        self._follower.waker.wake()

    def _shutdown(self) -> None:
        self._follower.waker.stop()
        for queue in self._queues.values():
            for d in queue.close():
                self._complete(d, DeliveryResult.of(d, "abandoned", error="watcher stopped"))
        self._leases.stop()
        self._executor.close()

    # -- checkpoints: leases and removals ------------------------------------------------

    def _lease_for(self, rec: dict[str, Any]) -> str | None:
        """A save whose checkpoint is still there is leased until its delivery completes."""
        path = (rec.get("data") or {}).get("checkpoint_path")
        if rec.get("event") != "save" or not isinstance(path, str):
            return None
        with self._removed_cond:
            if checkpoint_key(path) in self._removed:
                return None
        return self._leases.take(path)

    def _note_removals(self, records: list[dict[str, Any]]) -> None:
        """Remember which checkpoints are gone before dispatching the batch's saves (a later
        save of the same step brings one back)."""
        with self._removed_cond:
            for rec in records:
                path = (rec.get("data") or {}).get("checkpoint_path")
                if not isinstance(path, str):
                    continue
                if rec.get("event") == "checkpoint_removed":
                    self._removed.add(checkpoint_key(path))
                elif rec.get("event") == "save":
                    self._removed.discard(checkpoint_key(path))
            self._removed_cond.notify_all()

    def _checkpoint_removed(self, d: Delivery) -> bool:
        """Whether a save delivery's checkpoint is already removed (it is then skipped).

        A checkpoint of this run that is missing on disk while the trainer still writes may
        have its ``checkpoint_removed`` record on the way: wait briefly for it (or for the
        checkpoint to come back: rotation puts back one that got leased meanwhile)."""
        path = (d.record.get("data") or {}).get("checkpoint_path")
        if d.hook.event != "save" or not isinstance(path, str):
            return False
        key = checkpoint_key(path)
        live = self.follow and not self.saw_end and not self._final.is_set()
        deadline = time.monotonic() + REMOVAL_GRACE_S
        with self._removed_cond:
            while key not in self._removed and live and not os.path.exists(path):
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set() or not self._is_run_checkpoint(path):
                    break
                self._removed_cond.wait(min(left, 0.1))
            return key in self._removed

    def _is_run_checkpoint(self, path: str) -> bool:
        root = checkpoint_root(self.journal.parent, os.path.basename(path))
        return os.path.realpath(os.path.dirname(path)) == os.path.realpath(root)

    def _notice(self, msg: str) -> None:
        if msg not in self.notices:
            self.notices.append(msg)
            log.warning(msg)
