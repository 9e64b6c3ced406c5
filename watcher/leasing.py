"""The watcher's checkpoint leases: a save being delivered (queued or running) keeps its
checkpoint from rotation. Leases are renewed every ``ttl / 3`` by one thread and released
when the delivery completes; a watcher killed with ``kill -9`` stops renewing, so its
leases expire after ``ttl`` and rotation proceeds."""

from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path

from journal import leases
from journal.leases import Lease, LeaseError

log = logging.getLogger("watcher")


class LeaseKeeper:
    def __init__(self, ckpt_dir: Path, *, ttl: float, holder: str) -> None:
        self.ckpt_dir = ckpt_dir
        self.ttl = ttl
        self.holder = f"{holder} {socket.gethostname()}:{os.getpid()}"
        self._held: dict[str, Lease] = {}
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
        """Lease a checkpoint of this run; None for paths that are not one (or on errors)."""
        try:
            lease = leases.acquire(
                self.ckpt_dir, checkpoint_path, ttl=self.ttl, holder=self.holder, must_exist=False
            )
        except LeaseError:
            return None  # not a checkpoint directory of this run: nothing to protect
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
