"""Exclusive locks on a checkpoint dir: one launch per directory, one journal writer.

- :class:`RunLock` (``<ckpt_dir>/run.lock``): the launcher (``ilab-train``, ``run_training``
  on node 0) holds it for the whole run, so a second launch on a busy directory is refused.
- :class:`JournalLock` (``<ckpt_dir>/journal.lock``): whoever appends to ``journal.jsonl``
  holds it. Rank 0 of the trainer for the whole attempt; ``ilab-journal report``, rotation
  after training and the launcher's fallback ``train_end`` for one append each.

Both are ``flock``s: the kernel drops them when the holder dies, so a crash never leaves one
taken. The file says who holds it (host, pid, role, since when) for messages and ``status``;
a clean release empties it, so a non-empty file found by a new holder means the previous one
died holding it (a warning). Where ``flock`` is not shared between hosts (some network file
systems), the run lock's holder also rewrites a heartbeat every few seconds: a lock whose
file names another host with a fresh heartbeat counts as held even when ``flock`` says free.
A lock file is never opened through a symlink or as a FIFO (see :mod:`journal.rundir.safety`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from journal.rundir.paths import lock_path, run_lock_path
from journal.rundir.safety import StrPath, make_dir, open_no_follow

HEARTBEAT_S = 5.0
STALE_AFTER_S = 30.0  # a heartbeat older than this is a dead holder's


class Locked(RuntimeError):
    """Someone else holds the lock (the message names them)."""


class JournalLocked(Locked):
    """Another process is writing this journal."""


class FileLock:
    """An exclusive, non-blocking ``flock`` with a description of its holder; ``path`` is
    below ``root`` (the run dir or state dir it belongs to: no symlink followed below it)."""

    error: type[Locked] = Locked

    def __init__(
        self, path: Path, *, root: StrPath, role: str, heartbeat_s: float | None = None, **info: Any
    ) -> None:
        self.path, self.root = path, root
        self.role = role
        self.heartbeat_s = heartbeat_s
        self.info = info
        self.previous: dict[str, Any] | None = None  # a dead holder's description, if any
        self._fd = -1
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def try_acquire(self) -> bool:
        """Take the lock if it is free; never waits. Raises
        :class:`~journal.rundir.safety.UnsafeRunDir` for a lock file that is a symlink, not a
        regular file, or someone else's (never followed, never written)."""
        if self.held:
            return True
        make_dir(self.root)
        fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT, root=self.root)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        if _replaced(fd, self.path):  # removed by its holder as we waited: not the lock now
            os.close(fd)
            return False
        previous = _read_info(fd)
        if previous and _alive_elsewhere(previous):
            os.close(fd)  # flock is not shared with that host: trust its heartbeat
            return False
        self._fd, self.previous = fd, previous or None
        self._write_info()
        if self.heartbeat_s:
            self._stop.clear()
            self._beat = threading.Thread(target=self._heartbeat, name="ilab-lock", daemon=True)
            self._beat.start()
        return True

    def acquire(self, timeout: float) -> None:
        """Take the lock, waiting up to ``timeout`` seconds; raises :attr:`error`."""
        deadline = time.monotonic() + timeout
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                raise self.error(describe_holder(self.path))
            time.sleep(0.05)

    def release(self, *, remove: bool = False) -> None:
        """Let go; ``remove``: the lock file too (a launch refused before it wrote anything
        leaves nothing), removed while held, so a waiter on it takes the next one."""
        if self._fd < 0:
            return
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=2)
            self._beat = None
        with contextlib.suppress(OSError):
            os.unlink(self.path) if remove else os.ftruncate(self._fd, 0)  # empty: released
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = -1

    @contextlib.contextmanager
    def hold(self, timeout: float) -> Any:
        self.acquire(timeout)
        try:
            yield self
        finally:
            self.release()

    def _write_info(self) -> None:
        now = time.time()
        body = {
            "host": os.uname().nodename,
            "pid": os.getpid(),
            "role": self.role,
            "since": self.info.get("since", now),
            "heartbeat": now,
            **self.info,
        }
        self.info["since"] = body["since"]
        with contextlib.suppress(OSError):  # the description is a courtesy, the lock is not
            data = orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE)
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))

    def _heartbeat(self) -> None:
        assert self.heartbeat_s is not None
        while not self._stop.wait(self.heartbeat_s):
            if self._fd >= 0:
                self._write_info()


class JournalLock(FileLock):
    """``with JournalLock(ckpt_dir, role="report").hold(timeout=5):`` appends safely."""

    error = JournalLocked

    def __init__(self, ckpt_dir: str | os.PathLike[str], *, role: str) -> None:
        super().__init__(lock_path(ckpt_dir), root=ckpt_dir, role=role)


class RunLock(FileLock):
    """One launch per checkpoint dir; heartbeating for file systems without shared flock."""

    def __init__(self, ckpt_dir: str | os.PathLike[str], **info: Any) -> None:
        path = run_lock_path(ckpt_dir)
        super().__init__(path, root=ckpt_dir, role="launcher", heartbeat_s=HEARTBEAT_S, **info)


def _replaced(fd: int, path: Path) -> bool:
    """Whether ``path`` no longer names the file open as ``fd`` (removed, or another one)."""
    try:
        return os.stat(path, follow_symlinks=False).st_ino != os.fstat(fd).st_ino
    except FileNotFoundError:
        return True


def _read_info(fd: int) -> dict[str, Any]:
    try:
        raw = os.pread(fd, 4096, 0)
        info = orjson.loads(raw) if raw.strip() else {}
    except (OSError, orjson.JSONDecodeError):
        return {}
    return info if isinstance(info, dict) else {}


def _alive_elsewhere(info: dict[str, Any], now: float | None = None) -> bool:
    """A holder on another host whose heartbeat is fresh (flock may not reach us)."""
    beat = info.get("heartbeat")
    if info.get("host") in (None, os.uname().nodename) or not isinstance(beat, (int, float)):
        return False
    return (time.time() if now is None else now) - beat < STALE_AFTER_S


def _probe(path: Path) -> tuple[bool, dict[str, Any]] | None:
    """(whether a process holds the lock file ``path`` now, what the file says), or None
    when there is no such regular file."""
    try:  # never through a symlink, never blocked by a FIFO planted in its place
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        info = _read_info(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True, info
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    return False, info


def holder(path: Path) -> dict[str, Any] | None:
    """Who holds the lock file ``path`` now (host, pid, role, since), or None when free."""
    got = _probe(path)
    if got is not None and got[0]:
        return got[1] or {"role": "unknown"}
    return got[1] if got and got[1] and _alive_elsewhere(got[1]) else None


def writer_gone(ckpt_dir: str | os.PathLike[str]) -> bool:
    """Whether nobody is left to write this run's journal, as far as this host can tell:
    a writer took its journal lock once (the file is there), nobody holds it now, its last
    holder let go cleanly or was on this host (one on another host, where ``flock`` may not
    reach, says nothing), and no launcher holds the run dir (:func:`run_holder`: its
    heartbeat is stale when it runs elsewhere). A run dir without a journal lock (a copy,
    a journal written by hand) is never judged."""
    got = _probe(lock_path(ckpt_dir))
    if got is None or got[0] or got[1].get("host") not in (None, os.uname().nodename):
        return False
    return run_holder(ckpt_dir) is None


def lock_holder(ckpt_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Who writes the journal now, or None."""
    return holder(lock_path(ckpt_dir))


def run_holder(ckpt_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Which launcher runs in this directory now, or None."""
    return holder(run_lock_path(ckpt_dir))


def describe(info: dict[str, Any]) -> str:
    """``launcher pid 123 on host-a since 09:12:03`` (plus the run id when known)."""
    who = f"{info.get('role', 'a process')} pid {info.get('pid', '?')} on {info.get('host', '?')}"
    since = info.get("since")
    when = time.strftime(" since %H:%M:%S", time.localtime(since)) if since else ""
    run = f", run {info['run_id']}" if info.get("run_id") else ""
    return f"{who}{when}{run}"


def describe_holder(path: Path) -> str:
    info = holder(path) or {}
    what = "the journal is being written" if path.name == lock_path("x").name else "in use"
    return f"{path.parent}: {what} by {describe(info)}"
