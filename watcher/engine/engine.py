"""The dispatch engine behind ``ilab-watch`` and the embedded watcher of ``run_training``.

Reads journal records from a durable cursor, turns each (record, hook) pair into a delivery,
and runs deliveries on queues with timeouts, retries, a concurrency limit and a queue
policy: one queue per callback object, whose methods are so called in journal order, and one
per other hook. Delivery is at-least-once per (event, hook): the cursor only moves past a
record once every delivery of it has completed (or was coalesced away by a ``latest``
queue), and completed deliveries are remembered so a restart does not repeat them.

The parts, in the order a record meets them: :mod:`watcher.engine.follow` (start position,
reading, replaced journals), :mod:`watcher.engine.dispatch` (records to deliveries per lane,
shared with the backtest), :mod:`watcher.engine.queues` (a queue per lane: per object and per
hook), :mod:`watcher.engine.execute` (a runner per kind: commands, callables, scheduler jobs),
:mod:`watcher.engine.completion` (results and the cursor). :mod:`watcher.engine.leasing` keeps
the checkpoints of save deliveries from dispatch to completion. Each part is handed the parts
after it, never a way back.

A replay whose only lane is a plain callable (an object's methods, or one callable: no
timeout, no save to lease, every record delivered) skips its queue's worker: each batch runs
as it is read, in the engine's thread (``HookQueue.run_here``), while its records are in the
CPU's caches, with no :class:`~watcher.hooks.delivery.Delivery` per record (dispatch makes
runs of them), and is recorded at once. No other lane waits for the reading, and a replay
has nothing else to read; with several lanes each keeps its worker, so a slow one delays
only itself.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path

from journal.channels.control import unapplied_commands
from journal.checkpoints.leases import DEFAULT_TTL_S
from journal.record.record import Record
from journal.rundir.safety import UnsafeRunDir
from journal.store import Cursor, tail
from watcher.engine.attempts import Runner, abandoned
from watcher.engine.callable_runner import CallableRunner
from watcher.engine.completion import Completions, Reporter
from watcher.engine.cursor import CursorFile, CursorLock, CursorState
from watcher.engine.dispatch import Dispatcher, events_of
from watcher.engine.execute import Executor, first_job_hook
from watcher.engine.follow import JournalFollower, RunProgress, StartAt
from watcher.engine.jobs import JobRunners
from watcher.engine.leasing import CheckpointGuard
from watcher.engine.notices import Notices
from watcher.engine.queues import HookQueue
from watcher.engine.statedir import StateFiles
from watcher.hooks.command import end_leftovers
from watcher.hooks.contract import CallbackShape, restore_states
from watcher.hooks.delivery import Batch, state_write_failed
from watcher.hooks.hook import Hook

log = logging.getLogger("watcher")

SAFETY_POLL_S = 1.0
#: Bytes of journal read (and dispatched) at once: about 2,000 ``log`` records, still in
#: the CPU's caches when a queue's worker runs them (4 MiB replayed 10 % slower, 64 KiB 15 %).
READ_BYTES = 1 << 20
#: The same for a replay run in the engine's thread (module doc): about 130 records, still
#: in the caches when called and freed (1 MiB ran 30-40 % slower once its plain successes
#: were recorded per 3,072, not per read: docs/performance.md).
INLINE_READ_BYTES = 64 << 10
#: Bytes of a backlog read between two looks at whether the journal was replaced (and at
#: every wait for more).
IDENTITY_EVERY_BYTES = 8 << 20
#: Deliveries pending before reading waits for some to complete: memory stays bounded.
#: Counted in deliveries, not batches: live, a slow eval leaves many small batches open,
#: and the saves that arrive meanwhile must still be read (and leased). 4,096 keeps a
#: queued replay's records in the CPU's caches (docs/performance.md).
MAX_PENDING = 4_096
#: The records :meth:`CheckpointGuard.note_removals` looks at.
_CHECKPOINT_EVENTS = frozenset({"save", "checkpoint_removed"})


class Watcher:
    """Tail a journal and deliver its records to hooks. ``run()`` blocks; see its docstring.

    Args:
        journal: the journal file.
        hooks: what runs on which event.
        name: cursor identity; state files are ``<state_dir>/<name>.*``
            (watcher.engine.statedir).
        state_dir: cursor, results file and delivery logs (None: nothing is written).
        start: where to begin when no cursor is saved: ``"start"``, ``"now"`` (the current
            end of the file), or a byte offset (then any saved cursor is ignored).
        follow: keep following until ``train_end`` (True), or deliver what the file holds
            now and return (False: ``ilab-watch --replay``).
        poll: poll every ``poll`` seconds instead of using filesystem events.
        persist_cursor: save the cursor in ``state_dir`` (the embedded watcher does not).
        reporter: called with each finished delivery's result (not for coalesced ones).
        stateful_callbacks: callback objects (as read: ``HookSet.stateful``) whose
            ``restore_state(records)`` is called once with the records before the start
            position, so they rebuild counters and best values.
        control_source: the ``source`` of control commands that callables return.
        lease_ttl: seconds a save delivery's checkpoint lease lives without renewal (it is
            renewed while the delivery is queued or running, and released after it).
        jobs: makes the runner of the command hooks with ``HookOptions.via`` (scheduler
            jobs; watcher/scheduler/runner.py, wired by ``ilab-watch --via``).
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
        stateful_callbacks: list[CallbackShape] | None = None,
        control_source: str | None = None,
        lease_ttl: float = DEFAULT_TTL_S,
        jobs: JobRunners | None = None,
    ) -> None:
        if jobs is None and (job := first_job_hook(hooks)):
            raise ValueError(f"hook {job.label} runs via {job.options.via}: it needs jobs=")
        self.journal = journal
        self.hooks = hooks
        #: what a saved cursor records of its hooks (CursorState.hooks)
        self._labels = tuple(sorted({h.label for h in hooks}))
        self.name = name
        self.follow = follow
        self.stateful_callbacks = stateful_callbacks or []
        self._start = start
        self._stop = threading.Event()
        self._notices = Notices()
        self._run = RunProgress(follow)
        # follow -> dispatch -> queue -> complete: each part is handed the ones after it
        # a replay reads what the file holds: no file events to wait for (its waits are
        # for deliveries, which wake it themselves), so no watchdog observer either
        self._follower = JournalFollower(journal, poll=poll if follow else SAFETY_POLL_S)
        self._checkpoints = CheckpointGuard(
            journal.parent,
            self._run,
            ttl=lease_ttl,
            holder=f"watcher:{name}",
            stop=self._stop,
            notice=self._notices,
        )
        files = StateFiles.of(state_dir, name, journal.parent) if state_dir is not None else None
        self._executor = Executor(
            journal,
            files=files,
            control_source=control_source or f"watcher:{name}",
            stop=self._stop,
            checkpoints=self._checkpoints,
            notice=self._notices,
            jobs=jobs,
        )
        # one process per cursor: its results, logs and running markers are shared too
        self._lock = CursorLock(files, journal=str(journal)) if files is not None else None
        self.cursor = CursorFile(files if persist_cursor else None)
        self.results_path = files.results if files is not None else None
        self.completions = Completions(
            self.cursor,
            files=files,
            reporter=reporter,
            checkpoints=self._checkpoints,
            waker=self._follower.waker,
            notice=self._notices,
        )
        # records -> deliveries per lane, a save's checkpoint leased per delivery; a
        # replay's lone plain callable runs in this thread (module doc)
        lane_runner = self._executor.lane_runner
        self._dispatcher = Dispatcher(
            hooks,
            lease_for=self._checkpoints.lease_for,
            notice=self._notices,
            inline=None if follow else lambda lane: _plain(lane, lane_runner(lane)),
        )
        # one queue per lane (a callback object, its methods in journal order, or a lone
        # hook), handed the runner of its hooks' kind once
        self._queues = [self._queue(lane, lane_runner(lane)) for lane in self._dispatcher.lanes]

    def _queue(self, lane: list[Hook], runner: Runner) -> HookQueue:
        return HookQueue(
            lane,
            runner.deliver,
            self.completions.complete,
            notice=self._notices,
            # a callable's deliveries taken together run in one loop of its runner's
            run_many=runner.run if isinstance(runner, CallableRunner) else None,
        )

    def count(self, status: str) -> int:
        """Finished deliveries with ``status`` (ok, failed, skipped, coalesced, ...)."""
        return sum(n for (_, _, st), n in self.completions.tally.items() if st == status)

    @property
    def failed_final(self) -> int:
        """Deliveries that finally failed (after their retries)."""
        return self.completions.failed

    @property
    def notices(self) -> list[str]:
        """What went wrong without stopping delivery (each said once, as a warning)."""
        return self._notices.said

    def claim(self) -> None:
        """Take this cursor's lock (``run()`` does, if not done before): raises
        :class:`~watcher.engine.cursor.CursorBusy` when another watcher process holds it. A state
        dir that cannot be written is the usual one line and no lock: deliveries go on."""
        if self._lock is None or self._lock.held:
            return
        try:
            self._lock.claim()
        except UnsafeRunDir:  # a symlink or a FIFO planted as the lock file: never followed
            raise
        except OSError as exc:
            self._notices(state_write_failed(self._lock.path.parent, exc))
            self._lock = None

    # -- control from other threads -----------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()
        self._follower.waker.wake()

    def writer_finished(self) -> None:
        """Tell a follower that no more records will come (run_training after torchrun)."""
        self._run.writer_gone.set()
        self._follower.waker.wake()

    # -- main loop ---------------------------------------------------------------------

    def run(self) -> int:
        """Catch up from the cursor, then follow until ``train_end`` and all its deliveries
        are done (or, with ``follow=False``, until the end of the file). Returns 0 when every
        delivery succeeded, 1 when any finally failed."""
        self.claim()
        follower = self._follower
        follower.waker.start()
        self._checkpoints.leases.start()
        try:
            self._begin()
            waiting_at: int | None = None
            full, checked = False, 0
            read_bytes = INLINE_READ_BYTES if self._dispatcher.inline else READ_BYTES
            while not self._stop.is_set():
                if not full or follower.position.offset - checked >= IDENTITY_EVERY_BYTES:
                    self._check_identity()  # not at every chunk of a backlog: 3 system calls
                    checked = follower.position.offset
                if self.completions.pending >= MAX_PENDING:
                    follower.waker.wait(SAFETY_POLL_S)  # a completion wakes it
                    continue
                final = self._run.final  # taken before the read: it reads to the end
                before = follower.position
                batch = follower.read(final=final, max_bytes=read_bytes)
                for bad in batch.invalid:
                    self._notices(
                        f"{self.journal}:{bad.line_no}: skipped invalid line ({bad.reason})"
                    )
                if batch.records:
                    self._dispatch(batch.records, before, follower.position, batch.patched)
                else:
                    self.completions.read_to(follower.position)
                del batch  # its records freed before the next read makes more: the cache
                progressed = follower.position != before
                full = follower.position.offset - before.offset >= read_bytes // 2
                if not full:  # before a wait or the end: what ran is written
                    self.completions.flush()
                if self._finished(final, progressed=progressed):
                    break
                if full:
                    continue  # a full chunk: more is there to read at once
                if final and progressed:
                    # nothing more can come: the next read finds the end at once, and only
                    # deliveries still running are worth a wait (a replay whose last batch
                    # made none waited out the safety poll here: a second per replay)
                    continue
                if waiting_at != follower.position.offset and self._idle():
                    # Said once per position, only with nothing in flight: a watcher that
                    # says this is following, not about to finish.
                    waiting_at = follower.position.offset
                    log.debug("idle at byte %d; waiting for more records", waiting_at)
                # every save read so far is leased: a dead predecessor's lease none of them
                # claimed holds a checkpoint nobody needs any more
                self._checkpoints.leases.release_adopted()
                follower.waker.wait(SAFETY_POLL_S)
            if self._run.ended and not self._stop.is_set():
                self._say_unapplied()
        finally:
            self._shutdown()
        return 1 if self.failed_final else 0

    def _say_unapplied(self) -> None:
        """After ``train_end`` and every delivery (a hook's stop comes late, too): one line
        for each command that arrived after the run ended (read only: the trainer is the
        journal's writer, and a record after ``train_end`` would resume this run)."""
        step, late = unapplied_commands(self.journal.parent)
        for cmd in late:
            self._notices(cmd.line(step))

    def _finished(self, final: bool, progressed: bool) -> bool:
        if progressed:
            return False
        # Nothing new: done once train_end was seen (unless a launcher that still holds the
        # run dir relaunches it), or the file is final (replay, or the writer is gone), and
        # every delivery has completed.
        return (self._run.done(self.journal) or final) and self._idle()

    def _idle(self) -> bool:
        return all(q.idle() for q in self._queues)

    def _begin(self) -> None:
        files = self._executor.files
        if files is not None and (n := end_leftovers(files.running)):
            self._notices(f"ended {n} callback process group(s) a previous watcher left running")
        if self._lock is not None:  # its leases are ours now, not held until their ttl
            # (kept for the saves delivered again, released for the others once caught up)
            self._checkpoints.leases.take_over_from(self._lock.previous)
        saved = self.cursor.load()
        if self.cursor.warning:
            self._notices(self.cursor.warning)
        if saved is not None and saved.at.offset and not isinstance(self._start, int):
            log.info("resuming cursor %s at byte %d", self.cursor.path, saved.at.offset)
        state = self._follower.start_state(self._start, saved, self._notices)
        self._say_new_hooks(state)
        self._remember_done(state)
        self.completions.reset(state)
        # A restart past the run's train_end (its deliveries all done) has nothing to wait
        # for; a launch's watcher (a start offset, no cursor) waits for its attempt.
        at = self._follower.position.offset
        ended = not isinstance(self._start, int) and tail(self.journal, at).ended
        self._run.set_ended(ended, self.journal)
        restore_states(self.stateful_callbacks, self._follower.history)

    def _say_new_hooks(self, state: CursorState) -> None:
        """A hook the saved cursor did not deliver to starts where the cursor is, not at the
        journal's start: said, with the two ways to give it everything (its default cursor
        name is made from the hooks, so only a ``--name`` shared by other hooks gets here)."""
        new = state.take_hooks(self._labels)
        if new and state.at.offset:
            self._notices(
                f"cursor {self.name!r} was saved without {', '.join(new)}: "
                f"it gets the records from line {state.at.line_no + 1} on; "
                "--replay delivers the journal from its start, or give it its own --name"
            )
            # said once: the cursor knows them from now on (a cursor that cannot be saved
            # is said by the first delivery's save, as always)
            with contextlib.suppress(OSError):
                self.cursor.save(state)

    def _remember_done(self, state: CursorState) -> None:
        """The deliveries a saved cursor says completed: not made again."""
        self._dispatcher.remember_done(state.done)

    def _check_identity(self) -> None:
        what = self._follower.check_identity()
        if what is None:
            if self.completions.state.fingerprint is None:
                self.completions.state.fingerprint = self._follower.fingerprint()
            return
        self._notices(f"{self.journal} was {what}; reading it again from the start")
        state = CursorState(fingerprint=self._follower.fingerprint(), hooks=self._labels)
        self._remember_done(state)
        self.completions.reset(state)
        self._run.set_ended(False, self.journal)

    def _dispatch(
        self, records: list[Record], start: Cursor, end: Cursor, patched: bool = True
    ) -> None:
        """Turn the records read together into deliveries, handed to each queue at once
        (``patched``: the reader's ``ReadBatch.patched``)."""
        events, kinds = events_of(records)  # one pass in C, for the checks and the routing
        # which checkpoints are gone (none in a batch without save or checkpoint_removed)
        gone = kinds is None or not kinds.isdisjoint(_CHECKPOINT_EVENTS)
        self._checkpoints.note_removals(records if gone else [])
        self._executor.note_records(records)  # a report of a hook refused: said
        batch = Batch(start, records[0]["seq"], 0)  # its deliveries are counted below
        routed = self._dispatcher.route(records, batch, events, kinds, whole=not patched)
        if routed.ended is not None:
            self._run.set_ended(routed.ended, self.journal)
        batch.pending = sum(map(len, routed.deliveries.values()))
        batch.pending += sum(len(run.records) for runs in routed.plain.values() for run in runs)
        self.completions.open_batch(batch, end)
        for lane, queue in enumerate(self._queues):
            if todo := routed.deliveries.get(lane):
                queue.submit_many(todo)
        for lane, runs in routed.plain.items():  # after the queues: they run meanwhile
            self._queues[lane].run_here(runs, self._stop)

    def _shutdown(self) -> None:
        self._follower.waker.stop()
        self._follower.close()  # its checker process, if a big backlog started one
        for queue in self._queues:
            if left := queue.close():
                self.completions.complete([(d, abandoned(d)) for d in left], time.time())
        self._checkpoints.leases.stop()
        self._executor.close()
        self.completions.close()  # a hook's repeated failures: their count, said once
        if self._lock is not None:
            self._lock.release()


def _plain(lane: list[Hook], runner: Runner) -> bool:
    """Whether a replay may run ``lane`` (with ``runner``, its hooks' runner) in the
    engine's thread (module doc)."""
    first = lane[0]
    return (
        isinstance(runner, CallableRunner)
        and all(h.inline and h.options.queue == "all" for h in lane)
        and (first.owner is not None or first.options.concurrency <= 1)
    )
