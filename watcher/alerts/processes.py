"""The processes of a run as seen from this host: which are alive, stopped or gone, and
since when.

The ranks come from the attempt's ``train_begin`` (``ranks``: rank, host, pid, written by
every ``ilab-train`` worker; a bridge's trainer gives its own ``hostname`` and ``pid``);
the torchrun agent is the local ranks' parent; the launcher is whoever holds the run lock
(journal/rundir/lock.py). Only processes on this host can be looked at (``/proc``): the
others are said to be elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal.rundir.lock import run_holder
from journal.rundir.paths import logs_dir
from journal.rundir.procs import boot_id, start_time, stat_fields

#: ``/proc/<pid>/stat`` states, in words.
STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in uninterruptible wait",
    "T": "stopped",
    "t": "stopped by a tracer",
    "Z": "zombie",
    "X": "dead",
    "I": "idle",
}
GONE = "gone"


def this_host() -> str:
    return os.uname().nodename


@dataclass
class Proc:
    """One process of the run. ``state``: a ``/proc`` letter, ``gone``, or None on another
    host; ``since``: when this view first saw it in that state."""

    role: str  # "rank 0", "torchrun agent", "launcher"
    pid: int
    host: str | None
    rank: int | None = None
    state: str | None = None
    since: float | None = None
    cpu_s: float | None = None
    wchan: str | None = None
    start: str | None = None  # its start time (clock ticks since boot): a reused pid differs
    #: ``(boot id, start time)`` its attempt recorded when it launched it (``ilab-train``'s
    #: ranks): what :meth:`unverified` holds it to
    launched: tuple[str, str] | None = None
    bridge: bool = False  # a bridge's trainer process (HF Trainer, Lightning, Accelerate)

    @property
    def local(self) -> bool:
        return self.host in (None, this_host())

    @property
    def alive(self) -> bool:
        return self.local and self.state not in (GONE, "Z", "X", None)

    @property
    def stopped(self) -> bool:
        return self.state in ("T", "t")

    def unverified(self, run_dir: Path) -> str | None:
        """Why this process is not verifiably the rank its attempt launched, None when it
        is: on this host, in this boot, started when its attempt recorded, and running
        ``trainer.rank.worker`` with a worker config of ``run_dir``. A journal is data
        anyone who can write the run dir controls: only such a process may be signalled."""
        what = f"{self.role} (pid {self.pid})"
        if self.bridge:
            return f"{what} is a bridge's trainer: only its own launcher ends it"
        if self.host != this_host():
            return f"{what} was recorded on host {self.host or '(none)'}, not {this_host()}"
        if self.launched != (boot_id(), start_time(self.pid)):  # a reused pid, an old journal
            return f"{what} is not the process its attempt recorded (boot id, start time)"
        args = ""  # NUL-terminated arguments, the last the worker's config
        with contextlib.suppress(OSError):
            args = Path(f"/proc/{self.pid}/cmdline").read_bytes().decode(errors="replace")
        config = Path(args.split("\0")[-2] if args.count("\0") > 1 else "")
        logs = logs_dir(run_dir).resolve()
        if "\0trainer.rank.worker\0" not in args or not config.match(f"{logs}/worker-config-*"):
            return f"{what} runs no worker config of {run_dir}: {args.replace(chr(0), ' ')[:99]}"
        return None

    def describe(self, now: float) -> str:
        if not self.local:
            return f"{self.role}: pid {self.pid} on {self.host}: not visible from {this_host()}"
        word = STATES.get(self.state or "", self.state or "unknown")
        since = ""
        if self.since is not None:
            clock = time.strftime("%H:%M:%S", time.localtime(self.since))
            since = f" since {clock} ({now - self.since:.0f}s, first seen so by this watcher)"
        extra = []
        if self.cpu_s is not None:
            extra.append(f"cpu {self.cpu_s:.1f}s")
        if self.wchan:
            extra.append(f"waiting in {self.wchan}")
        tail = f" [{', '.join(extra)}]" if extra else ""
        return f"{self.role}: pid {self.pid}: {word}{since}{tail}"


def parent_pid(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[1]) if fields else None


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class ProcessView:
    """The run's processes, refreshed by :meth:`update` (the guard, every tick)."""

    procs: dict[int, Proc] = field(default_factory=dict)

    def set_attempt(self, begin: dict[str, Any], launcher_pids: dict[str, int]) -> None:
        """The processes of a new attempt: its ranks (``train_begin``), their torchrun
        agent, and the launcher (``launcher_pids``: role -> pid, known to an embedded
        guard; else the run lock's holder on this host)."""
        self.procs = {}
        for r in ranks_of(begin):
            self._add(Proc(f"rank {r['rank']}", **r))
        for p in list(self.procs.values()):
            if p.local and (ppid := parent_pid(p.pid)) and ppid not in self.procs and ppid > 1:
                self._add(Proc("torchrun agent", ppid, p.host))
        for role, pid in launcher_pids.items():
            self._add(Proc(role, pid, this_host()))

    def add_launcher(self, ckpt_dir: Path) -> None:
        """The launcher holding the run dir, when it is on this host and not known yet."""
        info = run_holder(ckpt_dir) or {}
        pid, host = info.get("pid"), info.get("host")
        if isinstance(pid, int) and host == this_host() and pid not in self.procs:
            self._add(Proc("launcher", pid, host))

    def _add(self, proc: Proc) -> None:
        proc.start = proc.launched[1] if proc.launched else start_time(proc.pid)
        self.procs[proc.pid] = proc

    def update(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        for p in self.procs.values():
            if not p.local:
                continue
            fields = stat_fields(p.pid)
            state = GONE if fields is None or (p.start and fields[19] != p.start) else fields[0]
            if state != p.state:
                p.state, p.since = state, now
            if fields is not None and state != GONE:
                with contextlib.suppress(ValueError, IndexError):
                    p.cpu_s = (int(fields[11]) + int(fields[12])) / _TICK
                p.wchan = None
                with contextlib.suppress(OSError):
                    wchan = Path(f"/proc/{p.pid}/wchan").read_text().strip()
                    p.wchan = wchan if wchan not in ("", "0") else None

    def ranks(self) -> list[Proc]:
        return sorted(
            (p for p in self.procs.values() if p.rank is not None), key=lambda p: p.rank or 0
        )

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        order = sorted(self.procs.values(), key=lambda p: (p.rank is not None, p.rank or 0, p.pid))
        return "\n".join(p.describe(now) for p in order) + "\n"


def ranks_of(begin: dict[str, Any]) -> list[dict[str, Any]]:
    """The ranks a ``train_begin`` payload names: ``ranks`` (``ilab-train``: with the boot
    and start time each recorded of itself), or the one trainer process a bridge names
    (``hostname``, ``pid``)."""
    out = []
    for r in begin.get("ranks") or []:
        if isinstance(r, dict) and isinstance(r.get("pid"), int) and isinstance(r.get("rank"), int):
            boot, start = r.get("boot"), r.get("start")
            launched = (boot, start) if isinstance(boot, str) and isinstance(start, str) else None
            out.append(dict(rank=r["rank"], pid=r["pid"], host=r.get("host"), launched=launched))
    if not out and isinstance(begin.get("pid"), int):
        out.append({"rank": 0, "pid": begin["pid"], "host": begin.get("hostname"), "bridge": True})
    return out
