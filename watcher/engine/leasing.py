"""The checkpoints of the watcher's save deliveries: leases, removals and rotation.

A save being delivered (queued or running) keeps its checkpoint from rotation with a lease
(a checkpoint directory, or a Lightning ``.ckpt`` file anywhere in the run dir). Leases are
renewed every ``ttl / 3`` by one thread and released when the delivery completes; a
watcher killed with ``kill -9`` stops renewing, so its leases expire after ``ttl`` and
rotation proceeds. A successor on the same cursor does not wait for that: at its start it
takes the dead watcher's leases over, keeps those of the saves it delivers again, and
releases the others once it has caught up with the journal. A save whose checkpoint was
journaled as removed is not leased, and its delivery is skipped. :class:`CheckpointGuard`
is the one object the engine, the executor and completion share for all of this.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from journal.checkpoints import leases
from journal.checkpoints.leases import Lease, LeaseError
from journal.record.record import Record
from journal.rundir.paths import checkpoint_key
from journal.store import prune_finished_run
from watcher.engine.follow import RunProgress
from watcher.hooks.delivery import Delivery

log = logging.getLogger("watcher")

#: How long a save delivery waits for the removal record of a checkpoint missing on disk.
REMOVAL_GRACE_S = 2.0


class LeaseKeeper:
    """The lease files of one watcher, and the thread that renews them."""

    def __init__(self, ckpt_dir: Path, *, ttl: float, holder: str) -> None:
        self.ckpt_dir = ckpt_dir
        self.ttl = ttl
        self.role = holder
        self.holder = holder_name(holder, socket.gethostname(), os.getpid())
        self._held: dict[str, Lease] = {}
        # taken over from a dead predecessor, by checkpoint name: not yet claimed by a save
        self._adopted: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._usable = True
        try:
            leases.check_ttl(ttl)
        except LeaseError as exc:  # every take would fail: say it once, not per save
            self._usable = False
            log.warning("checkpoints are not leased: %s", exc)

    def take(self, checkpoint_path: str) -> str | None:
        """Lease a checkpoint of this run; None for paths that are not one (or on errors).
        A lease taken over from the predecessor on that checkpoint is used first."""
        if self._adopted and (lease_id := self._claim_adopted(checkpoint_path)):
            return lease_id
        try:
            lease = leases.acquire(
                self.ckpt_dir, checkpoint_path, ttl=self.ttl, holder=self.holder, must_exist=False
            )
        except LeaseError:
            return None  # not a checkpoint of this run (dir or .ckpt file): nothing to protect
        except OSError as exc:
            log.warning("cannot lease %s: %s", checkpoint_path, exc)
            return None
        with self._lock:
            self._held[lease.id] = lease
        return lease.id

    def release(self, lease_id: str) -> None:
        """End a lease (a renewal of it in progress finishes first, then the file goes)."""
        with self._lock:
            lease = self._held.pop(lease_id, None)
        if lease is not None:
            try:
                leases.drop(self.ckpt_dir, lease)
            except OSError as exc:
                log.warning("cannot release the lease on %s: %s", lease.checkpoint, exc)

    def take_over(self, host: str, pid: int, *, role: str | None = None) -> int:
        """Make the leases of this keeper's dead predecessor (``role``, by default this
        keeper's, on ``host`` with ``pid``) ours, renewed as ours until :meth:`take` claims
        them for the saves delivered again or :meth:`release_adopted` ends the rest; how
        many."""
        if not self._usable:
            return 0
        dead = holder_name(role or self.role, host, pid)
        if dead == self.holder:
            return 0
        try:
            taken = leases.take_over(self.ckpt_dir, dead, by=self.holder, ttl=self.ttl)
        except OSError as exc:
            log.warning("cannot take over the leases of %s: %s", dead, exc)
            return 0
        with self._lock:
            for lease in taken:
                self._held[lease.id] = lease
                self._adopted.setdefault(lease.checkpoint, []).append(lease.id)
        return len(taken)

    def take_over_from(self, previous: Mapping[str, Any] | None, *, role: str | None = None) -> int:
        """:meth:`take_over` of the holder a lock file described (``previous``: its
        ``host`` and ``pid``; nothing without them); how many leases."""
        host, pid = (previous or {}).get("host"), (previous or {}).get("pid")
        if not (isinstance(host, str) and isinstance(pid, int)):
            return 0
        if n := self.take_over(host, pid, role=role):
            log.info(
                "took over %d lease(s) of the dead %s (%s:%d)", n, role or self.role, host, pid
            )
        return n

    def _claim_adopted(self, checkpoint_path: str) -> str | None:
        try:
            name = leases.checkpoint_name(self.ckpt_dir, checkpoint_path)
        except LeaseError:
            return None
        with self._lock:
            ids = self._adopted.get(name)
            while ids:
                lease_id = ids.pop()
                if lease_id in self._held:  # not lost (a renewal found it gone)
                    return lease_id
            self._adopted.pop(name, None)
        return None

    def release_adopted(self) -> None:
        """Release the taken-over leases no save claimed (their checkpoints may rotate)."""
        if not self._adopted:
            return  # the usual case, once per wait of the watcher's loop
        with self._lock:
            ids = [i for names in self._adopted.values() for i in names]
            self._adopted.clear()
        for lease_id in ids:
            self.release(lease_id)

    def start(self) -> None:
        """Start the renewal thread (none for a ttl no lease can have: nothing to renew)."""
        if not self._usable:
            return
        self._thread = threading.Thread(target=self._renew, name="ilab-leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing and release every lease still held."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            ids = list(self._held)
        for lease_id in ids:
            self.release(lease_id)

    def renew_held(self) -> None:
        """Renew every lease held now. Each renewal (its check and its rewrite) runs under
        the lock that :meth:`release` takes: a delivery that completes meanwhile waits for
        it and then removes the file, so a renewal never brings back a released lease (one
        that did outlived ``--keep-last-n``: nobody renewed or released it again)."""
        with self._lock:
            ids = list(self._held)
        for lease_id in ids:
            with self._lock:
                lease = self._held.get(lease_id)
                if lease is None:
                    continue  # released since the list was taken
                try:
                    self._held[lease_id] = leases.renew(self.ckpt_dir, lease)
                except (LeaseError, OSError) as exc:
                    log.warning("lease on %s lost: %s", lease.checkpoint, exc)

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            self.renew_held()


def holder_name(role: str, host: str, pid: int) -> str:
    """The ``holder`` of a lease file: who (``watcher:<name>``) and which process."""
    return f"{role} {host}:{pid}"


class CheckpointGuard:
    """The checkpoints of save deliveries, from dispatch to completion.

    A save is leased when it is dispatched (unless its checkpoint is known to be removed),
    its delivery is skipped if the checkpoint is removed by the time it runs, and the lease
    is released when the delivery completes, queued or run. Once no trainer writes the run
    (``run.over``), each release also applies the run's rotation policy, which no one
    else would apply any more.

    Args:
        ckpt_dir: the run's directory.
        run: how far the followed run is.
        ttl: seconds a lease lives without renewal.
        holder: who holds the leases and prunes (``watcher:<name>``).
        stop: set when the watcher stops (ends a wait for a removal record).
        notice: says (once) what goes wrong without stopping delivery.
    """

    def __init__(
        self,
        ckpt_dir: Path,
        run: RunProgress,
        *,
        ttl: float,
        holder: str,
        stop: threading.Event,
        notice: Callable[[str], None],
    ) -> None:
        self.ckpt_dir = ckpt_dir
        self.run = run
        self.holder = holder
        self.leases = LeaseKeeper(ckpt_dir, ttl=ttl, holder=holder)
        self._stop = stop
        self._notice = notice
        self._removed: set[str] = set()  # checkpoints journaled as removed (by key)
        self._removed_cond = threading.Condition()

    def note_removals(self, records: list[Record]) -> None:
        """Remember which checkpoints are gone before the batch's saves are dispatched (a
        later save of the same step brings one back)."""
        with self._removed_cond:
            for rec in records:
                if rec["event"] not in ("save", "checkpoint_removed"):
                    continue
                path = rec["data"].get("checkpoint_path")
                if not isinstance(path, str):
                    continue
                if rec["event"] == "checkpoint_removed":
                    self._removed.add(checkpoint_key(path))
                elif rec["event"] == "save":
                    self._removed.discard(checkpoint_key(path))
            self._removed_cond.notify_all()

    def lease_for(self, rec: Record) -> str | None:
        """A save whose checkpoint is still there is leased until its delivery completes."""
        path = rec["data"].get("checkpoint_path")
        if rec["event"] != "save" or not isinstance(path, str):
            return None
        with self._removed_cond:
            if checkpoint_key(path) in self._removed:
                return None
        return self.leases.take(path)

    def removed(self, d: Delivery) -> bool:
        """Whether a save delivery's checkpoint is already removed (it is then skipped).

        A checkpoint of this run that is missing on disk while the trainer still writes may
        have its ``checkpoint_removed`` record on the way: wait briefly for it (or for the
        checkpoint to come back: rotation puts back one that got leased meanwhile). An
        exporter's never is: a save is part of the story it records, its checkpoint gone or
        not (its fate comes with the ``checkpoint_removed`` record)."""
        if d.hook.event != "save" or (d.hook.owner is not None and d.hook.owner.every_record):
            return False
        path = d.record["data"].get("checkpoint_path")
        if not isinstance(path, str):
            return False
        key = checkpoint_key(path)
        live = not self.run.over
        deadline = time.monotonic() + REMOVAL_GRACE_S
        with self._removed_cond:
            while key not in self._removed and live and not os.path.exists(path):
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set() or not self._is_run_checkpoint(path):
                    break
                self._removed_cond.wait(min(left, 0.1))
            return key in self._removed

    def release(self, d: Delivery) -> None:
        """A delivery completed: its checkpoint may rotate away."""
        if d.lease is None:
            return
        self.leases.release(d.lease)
        if self.run.over:  # no trainer rotates any more: apply its policy now
            try:  # (a no-op if one writes after all)
                prune_finished_run(self.ckpt_dir, role=self.holder)
            except Exception as exc:  # rotation is the trainer's job; delivery goes on
                self._notice(f"cannot apply the run's rotation policy: {exc}")

    def _is_run_checkpoint(self, path: str) -> bool:
        """A checkpoint directory in its root, or a ``.ckpt`` file inside the run dir."""
        try:
            leases.checkpoint_name(self.ckpt_dir, path)
        except LeaseError:
            return False
        return True
