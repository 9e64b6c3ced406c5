"""Process lifetimes: nothing we start outlives the process that started it.

Training workers, the torchrun agent and watcher callbacks must end when whoever started them
dies, whatever the signal (``kill -9`` included), or a relaunch trains beside orphans and a
restarted watcher runs a delivery twice at once. Two mechanisms, belt and braces: the kernel's
parent-death signal (Linux ``PR_SET_PDEATHSIG``), and a thread that watches the parent (and
the launcher) and reacts within a second where the signal cannot be set or was missed.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
LAUNCHER_PID_ENV = "ILAB_LAUNCHER_PID"
_SETPRIV = shutil.which("setpriv")  # util-linux: sets the signal, then execs the command
_LIBC: Any = None
WATCH_INTERVAL_S = 0.5  # how often the parent watch looks
# How long an orphaned training worker may take to finish its step, save and end before it
# leaves anyway (a collective may hang when other ranks are gone).
ORPHAN_GRACE_S = 30.0


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only;
    elsewhere the parent watch below does the job). Safe as a ``preexec_fn``."""
    global _LIBC
    if not sys.platform.startswith("linux"):
        return
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def spawn_dying_with_us(argv: list[str]) -> tuple[list[str], Callable[[], None] | None]:
    """``(argv, preexec_fn)`` for a child that gets SIGKILL when this process dies. Prefers
    ``setpriv --pdeathsig`` (one extra exec, ~1 ms) over a ``preexec_fn``, which makes
    CPython fork instead of vfork (~2-3 ms more per spawn, and it matters for callbacks)."""
    if not sys.platform.startswith("linux"):
        return argv, None
    if _SETPRIV:
        return [_SETPRIV, "--pdeathsig", "KILL", "--", *argv], None
    return argv, _die_by_sigkill


def _die_by_sigkill() -> None:
    die_with_parent(signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (Linux): field 3, the
    state, first; None when unknown or gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a pid reused by
    another process from the one we started; None when unknown or gone."""
    fields = stat_fields(pid)
    return fields[19] if fields else None


def boot_id() -> str | None:
    """This machine's current boot (Linux): a pid and its start time name one process only
    within one boot; None when unknown."""
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return None


def running_children() -> list[int]:
    """Pids of this process's children that still run: ended ones not yet reaped (zombies)
    are left out. Linux; elsewhere empty."""
    pids: list[int] = []
    for task in Path("/proc/self/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            pids += [int(p) for p in (task / "children").read_text().split()]
    return [p for p in pids if (fields := stat_fields(p)) and fields[0] not in ("Z", "X")]


def watch_parent(
    on_orphaned: Callable[[], None], *, interval: float = WATCH_INTERVAL_S
) -> threading.Thread:
    """Call ``on_orphaned`` once, from a daemon thread, when this process's parent changes
    (it died and we were re-parented) or the launcher named by ``ILAB_LAUNCHER_PID`` is gone."""
    parent = os.getppid()
    launcher = int(os.environ.get(LAUNCHER_PID_ENV, "0") or 0)

    def run() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent or (launcher and not pid_alive(launcher)):
                on_orphaned()
                return

    t = threading.Thread(target=run, name="ilab-parent-watch", daemon=True)
    t.start()
    return t
