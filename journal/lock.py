"""The journal's single-writer lock: whoever appends to ``journal.jsonl`` holds it.

An exclusive ``flock`` on ``<ckpt_dir>/journal.lock``. The trainer's rank 0 holds it for the
whole attempt; ``ilab-journal report`` and the launcher's fallback ``train_end`` hold it for
one append. The kernel drops it when its holder dies, so a crash never leaves it taken. The
file also says who holds it (host, pid, role, since when), for messages and ``status``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from typing import Any

import orjson

from journal.paths import lock_path


class JournalLocked(RuntimeError):
    """Another process is writing this journal (the message names it)."""


class JournalLock:
    """``with JournalLock(ckpt_dir, role="report").hold(timeout=5):`` appends safely."""

    def __init__(self, ckpt_dir: str | os.PathLike[str], *, role: str) -> None:
        self.path = lock_path(ckpt_dir)
        self.role = role
        self._fd = -1

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def try_acquire(self) -> bool:
        """Take the lock if it is free; never waits."""
        if self.held:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        self._fd = fd
        info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "role": self.role,
            "since": time.time(),
        }
        with contextlib.suppress(OSError):  # the description is a courtesy, the lock is not
            os.ftruncate(fd, 0)
            os.pwrite(fd, orjson.dumps(info, option=orjson.OPT_APPEND_NEWLINE), 0)
        return True

    def acquire(self, timeout: float) -> None:
        """Take the lock, waiting up to ``timeout`` seconds; raises :class:`JournalLocked`."""
        deadline = time.monotonic() + timeout
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                raise JournalLocked(describe_holder(self.path.parent))
            time.sleep(0.05)

    def release(self) -> None:
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = -1

    @contextlib.contextmanager
    def hold(self, timeout: float) -> Any:
        self.acquire(timeout)
        try:
            yield self
        finally:
            self.release()


def lock_holder(ckpt_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Who holds the lock now (host, pid, role, since), or None when it is free."""
    probe = JournalLock(ckpt_dir, role="probe")
    try:
        if probe.try_acquire():
            probe.release()
            return None
    except OSError:
        return None
    try:
        info = orjson.loads(lock_path(ckpt_dir).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return info if isinstance(info, dict) else {}


def describe_holder(ckpt_dir: str | os.PathLike[str]) -> str:
    info = lock_holder(ckpt_dir) or {}
    who = f"{info.get('role', 'a process')} pid {info.get('pid', '?')} on {info.get('host', '?')}"
    since = info.get("since")
    when = time.strftime(" since %H:%M:%S", time.localtime(since)) if since else ""
    return f"{lock_path(ckpt_dir).parent}: the journal is being written by {who}{when}"
