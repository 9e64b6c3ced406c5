"""The mirror: a run dir's checkpoints and journal copied to a store as they are written.

Two threads. One follows the journal: it leases each saved checkpoint as soon as its
``save`` record is read (rotation then keeps it until it is in the store), queues it, and
uploads the new complete lines as a segment every ``interval`` seconds, at once when they
hold a ``save`` or ``train_end``. The other uploads the queued checkpoints, marker last,
journals what each sent (a ``report`` of ``mirror_bytes``, ``mirror_files`` and
``mirror_seconds``), releases its lease, and deletes from the store what rotation deleted
locally (unless a remote watcher leases it). Where uploads stand is read back from the store
at start, so a mirror killed with ``kill -9`` and started again goes on where it was.

A store that does not answer never reaches training (which writes only to its disk): the
uploads wait and retry with backoff, the console says so once per outage, and the mirror
catches up when the store is back. A store that answers no (:mod:`journal.remote.errors`:
no such bucket, wrong keys, denied) is no outage: the mirror stops with one line and lets go
of its leases, so training rotates as if no mirror ran (exit 2). So does a prefix that is
another run's (:mod:`journal.remote.owner`: exit 1): nothing under it is written or deleted,
and no checkpoint is touched before the prefix is found to be this run's.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from journal import store as journal_store
from journal.channels.reports import InvalidReport, Report, submit_report
from journal.checkpoints.leases import DEFAULT_TTL_S
from journal.record.record import Record
from journal.remote.errors import classify
from journal.remote.owner import NotOwner, OwnedStore, PrefixGone
from journal.rundir.paths import checkpoint_root, journal_path
from watcher.engine.dispatch import attempt_ended
from watcher.engine.leasing import LeaseKeeper
from watcher.mirror.checkpoints import Uploaded, lease_role, remove_checkpoint, upload_checkpoint
from watcher.mirror.inbound import bring_in
from watcher.mirror.outage import Backoff, Outage
from watcher.mirror.segments import JournalMismatch, is_replaced, upload_segment, uploaded_end

log = logging.getLogger("watcher.mirror")
T = TypeVar("T")

#: Seconds between segment uploads of a journal that holds no save or train_end.
DEFAULT_INTERVAL_S = 2.0
TICK_S = 0.2
#: Seconds the start waits to learn whether the store refuses (then: exit 2 at once).
PREFLIGHT_S = 8.0

#: Exit codes of a mirror that stopped: the prefix is another run's; the store refuses.
REFUSED, STORE_REFUSES = 1, 2
_AS_IF_NONE = "training goes on as without a mirror, its checkpoints rotate as if none ran"


@dataclass
class _Job:
    kind: str  # "upload" or "remove"
    name: str  # checkpoints/step-000010
    local: Path
    record: Mapping[str, Any]  # a Record; {} for the end of the jobs
    lease: str | None = None
    not_before: float = 0.0


class Mirror:
    """Mirror the run dir ``ckpt_dir`` to ``uri`` (see the module docstring).

    Args:
        follow: keep mirroring until the run's ``train_end`` is mirrored (False: what the
            run dir holds now, then stop).
        interval: seconds between segment uploads when nothing urgent is pending.
        linger: seconds to go on once the run's end and all after it is mirrored,
            bringing in what remote watchers report late (journaled here, and mirrored:
            each report brought in starts the wait again).
    """

    def __init__(
        self,
        ckpt_dir: Path,
        uri: str,
        *,
        follow: bool = True,
        interval: float = DEFAULT_INTERVAL_S,
        lease_ttl: float = DEFAULT_TTL_S,
        linger: float = 0.0,
    ) -> None:
        self.ckpt_dir = Path(ckpt_dir)
        self.linger = linger
        self.journal = journal_path(self.ckpt_dir)
        self.store = OwnedStore(uri, self.journal)
        self.follow = follow
        self.interval = interval
        self.uploaded: list[Uploaded] = []
        #: 0; REFUSED (another run's prefix, a replaced journal) or STORE_REFUSES once stopped
        self.code = 0
        #: its leases on the checkpoints it has still to send (MirrorRun takes a dead
        #: predecessor's over)
        self.leases = LeaseKeeper(self.ckpt_dir, ttl=lease_ttl, holder=lease_role(self.store.uri))
        self._jobs: queue.Queue[_Job] = queue.Queue()
        self._stop = threading.Event()
        self._outage = Outage()
        self._threads: list[threading.Thread] = []
        self._read_at = journal_store.START  # where the next read of the local journal starts
        self._parsed = 0  # journal bytes read for records (the complete lines before it)
        #: journal bytes in the store (0 before the store first answered and the prefix was
        #: found to be ours)
        self.sent = 0
        self._claimed = threading.Event()  # no checkpoint is touched before
        self._deferred: list[_Job] = []  # removals a remote lease holds back

    # -- running --------------------------------------------------------------------------

    @property
    def failed(self) -> bool:
        return self.code != 0

    def preflight(self, wait: float = PREFLIGHT_S) -> tuple[int, str] | None:
        """Before the threads start: (exit code, one line) when this mirror can never work
        (the store refuses: no such bucket, wrong keys, denied; or the prefix is another
        run's), None otherwise. A store that does not answer within ``wait`` seconds is
        for the threads to wait out (they lease the checkpoints meanwhile)."""
        found: list[tuple[int, str] | None] = []

        def look() -> None:
            try:
                self.store.check()
                self._claim()
            except (NotOwner, JournalMismatch) as exc:
                found.append((REFUSED, str(exc)))
            except Exception as exc:
                problem = classify(exc)
                where = "this machine" if problem.local else self.store.uri
                permanent = problem.permanent
                found.append((STORE_REFUSES, f"{where}: {problem.cause}") if permanent else None)
            else:
                found.append(None)

        t = threading.Thread(target=look, name="ilab-mirror-preflight", daemon=True)
        t.start()
        t.join(wait)
        return found[0] if found else None

    def start(self) -> None:
        self.leases.start()
        for target, name in ((self._follow_journal, "journal"), (self._checkpoints, "ckpts")):
            t = threading.Thread(target=target, name=f"ilab-mirror-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def join(self) -> int:
        """Wait until done (or stopped); :attr:`code`."""
        for t in self._threads:
            while t.is_alive():
                t.join(0.5)
        self.leases.stop()
        return self.code

    def request_stop(self) -> None:
        self._stop.set()

    def _give_up(self, code: int, line: str) -> None:
        """Stop for good (one line): nothing more is written to the store, and the leases
        go (by the journal thread, once the checkpoint thread has ended)."""
        if not self.code:
            self.code = code
            log.error("mirror: %s", line)
        self._stop.set()

    # -- the journal thread ---------------------------------------------------------------

    def _follow_journal(self) -> None:
        ended = False
        urgent_to = 0  # the end of the last save/train_end line read
        last_sent = 0.0
        last_inbound = 0.0
        done_at = 0.0  # when everything was first found mirrored (for --linger)
        backoff = Backoff()
        while not self._stop.is_set():
            idle = self._jobs.unfinished_tasks == 0 and not self._deferred  # before the end
            # the records by the store's rules (invalid lines skipped, said by the readers),
            # the bytes uploaded as they are (upload_segment)
            read = journal_store.read(self.journal, self._read_at)
            end = read.offset
            fresh = end > self._parsed  # its records may have queued work: not done yet
            if fresh:
                ended = bool(attempt_ended([rec["event"] for rec in read.records], ended))
                for rec in read.records:
                    ev = rec["event"]
                    if ev in ("save", "train_end"):
                        urgent_to = end
                    self._note(rec)
                self._parsed, self._read_at = end, read.cursor
                # every save read so far is leased: a dead predecessor's lease none of them
                # claimed holds a checkpoint nobody needs any more
                self.leases.release_adopted()
            now = time.monotonic()
            if backoff.ready(now):
                ok = True
                if not self._claimed.is_set():
                    ok = self._try("reading the store", self._claim)
                claimed = self._claimed.is_set()
                if claimed and self._parsed > self.sent:
                    due = self.sent < urgent_to or ended or now - last_sent >= self.interval
                    if due and (ok := self._try("uploading a journal segment", self._send)):
                        last_sent = now
                if ok and claimed and now - last_inbound >= self.interval:
                    bring = functools.partial(bring_in, self.store, self.ckpt_dir)
                    ok = self._try("reading reports/ and control/", bring)
                    last_inbound = now if ok else last_inbound
                backoff.after(ok, now)
            if self.failed:
                break
            if (ended or not self.follow) and idle and not fresh and self.sent == end:
                # all mirrored; with --linger, reports sent after the end are still awaited
                done_at = done_at or now
                if now - done_at >= self.linger:
                    break
            else:
                done_at = 0.0
            self._stop.wait(TICK_S)
        self._jobs.put(_Job("end", "", Path(), {}))
        if self._stop.is_set() and self.failed:  # stopped for good: training rotates as
            for t in self._threads[1:]:  # without a mirror from now, not from our exit
                t.join()
            self.leases.stop()
            # the trainer gone: ours to do
            journal_store.prune_finished_run(self.ckpt_dir, role="mirror")

    def _claim(self) -> None:
        """Find the prefix to be this run's (or make it so) and how much of the journal it
        holds; until the journal has a first line (a restore writes it whole), later."""
        if self.store.claim():
            self.sent = uploaded_end(self.store, self.journal)
            self._claimed.set()

    def _send(self) -> None:
        if is_replaced(self.journal, self.sent):
            log.error(
                "mirror: %s was replaced; its mirror stops at byte %d", self.journal, self.sent
            )
            self.code = REFUSED
            return
        while self.sent < self._parsed:
            self.sent = upload_segment(self.store, self.journal, self.sent, self._parsed)

    def _note(self, rec: Record) -> None:
        """Queue the work a record asks for: a save's upload (leased now), a removal."""
        ev = rec["event"]
        path = rec["data"].get("checkpoint_path")
        if ev not in ("save", "checkpoint_removed") or not isinstance(path, str):
            return
        local = self._local(path)
        name = local.relative_to(self.ckpt_dir).as_posix()
        if ev == "checkpoint_removed":
            self._jobs.put(_Job("remove", name, local, rec))
        elif local.exists():
            lease = self.leases.take(str(local))
            self._jobs.put(_Job("upload", name, local, rec, lease=lease))

    def _local(self, path: str) -> Path:
        """A record's checkpoint in this run dir (records keep the path the run had when
        it was written: a restored run's earlier ones name another dir)."""
        given = Path(path)
        with contextlib.suppress(ValueError):
            return self.ckpt_dir / given.relative_to(self.ckpt_dir)
        return checkpoint_root(self.ckpt_dir, given.name) / given.name

    # -- the checkpoint thread ------------------------------------------------------------

    def _checkpoints(self) -> None:
        backoff = Backoff()
        while True:
            try:
                job = self._jobs.get(timeout=TICK_S)
            except queue.Empty:
                if self._stop.is_set():
                    return
                if self._deferred and self._deferred[0].not_before <= time.monotonic():
                    self._jobs.put(self._deferred[0])  # queued before it leaves the list
                    self._deferred.pop(0)
                continue
            if job.kind == "end" or self._stop.is_set():
                self._release(job)
                self._jobs.task_done()
                if job.kind == "end":
                    return
                continue
            done = False
            while not self._stop.is_set():
                now = time.monotonic()
                if not backoff.ready(now) or not self._claimed.is_set():
                    self._stop.wait(TICK_S)  # nothing is touched before the prefix is ours
                    continue
                done = self._try(f"{job.kind} {job.name}", functools.partial(self._do, job))
                backoff.after(done, now)
                if done:
                    break
            if not done:  # stopped first
                self._release(job)
            self._jobs.task_done()

    def _do(self, job: _Job) -> None:
        if job.kind == "remove":
            if not remove_checkpoint(self.store, job.name):  # a remote watcher holds it
                job.not_before = time.monotonic() + 5.0
                self._deferred.append(job)
            return
        if not job.local.exists():
            self._release(job)
            return  # removed before it could be leased: nothing to upload
        rec = job.record
        about = {k: rec[k] for k in ("run_id", "seq", "step", "attempt")}
        up = upload_checkpoint(self.store, job.local, job.name, about=about)
        if up is not None:
            self.uploaded.append(up)
            mb = up.bytes / 1e6
            log.info("mirror: %s: %d files, %.1f MB in %.1fs", up.name, up.files, mb, up.seconds)
            # before the lease ends: a report on a checkpoint rotated away is refused
            self._journal_upload(up, job.local, rec["step"])
        self._release(job)

    def _journal_upload(self, up: Uploaded, local: Path, step: int) -> None:
        metrics = {
            "mirror_bytes": up.bytes,
            "mirror_files": up.files,
            "mirror_seconds": round(up.seconds, 3),
        }
        try:
            submit_report(
                self.ckpt_dir,
                Report(metrics, checkpoint_path=str(local), step=step),
                source="mirror",
            )
        except (InvalidReport, OSError) as exc:
            log.info("mirror: not journaled for %s: %s", up.name, exc)

    def _release(self, job: _Job) -> None:
        if job.lease is not None:
            self.leases.release(job.lease)
            job.lease = None
            # the trainer gone: rotation is ours
            journal_store.prune_finished_run(self.ckpt_dir, role="mirror")

    def _try(self, what: str, fn: Callable[[], object]) -> bool:
        """Run one step against the store; whether it went through. What waiting can fix
        is waited out (said once); a refusal stops the mirror (:meth:`_give_up`)."""
        try:
            fn()
        except PrefixGone as exc:
            self._give_up(STORE_REFUSES, f"stopped: {exc}; {_AS_IF_NONE}")
            return False
        except (NotOwner, JournalMismatch) as exc:
            self._give_up(REFUSED, str(exc))
            return False
        except Exception as exc:  # any client error: the store's, the network's, the disk's
            problem = classify(exc)
            if problem.permanent:
                who = "this machine" if problem.local else self.store.uri
                self._give_up(
                    STORE_REFUSES,
                    f"stopped: {who} refuses ({what}: {problem.cause}); {_AS_IF_NONE}",
                )
            else:
                self._outage.failed(what, problem)
            return False
        self._outage.ok()
        return True
