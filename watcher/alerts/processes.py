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
from journal.rundir.procs import stat_fields

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

    @property
    def local(self) -> bool:
        return self.host in (None, this_host())

    @property
    def alive(self) -> bool:
        return self.local and self.state not in (GONE, "Z", "X", None)

    @property
    def stopped(self) -> bool:
        return self.state in ("T", "t")

    def describe(self, now: float) -> str:
        where = "" if self.local else f" on {self.host}"
        if not self.local:
            return f"{self.role}: pid {self.pid}{where}: not visible from {this_host()}"
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
            self._add(Proc(f"rank {r['rank']}", r["pid"], r.get("host"), rank=r["rank"]))
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
        if proc.local:
            fields = stat_fields(proc.pid)
            proc.start = fields[19] if fields else None
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
                try:
                    p.wchan = Path(f"/proc/{p.pid}/wchan").read_text().strip() or None
                except OSError:
                    p.wchan = None
                if p.wchan == "0":
                    p.wchan = None

    def ranks(self) -> list[Proc]:
        return sorted(
            (p for p in self.procs.values() if p.rank is not None), key=lambda p: p.rank or 0
        )

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        order = sorted(self.procs.values(), key=lambda p: (p.rank is not None, p.rank or 0, p.pid))
        return "\n".join(p.describe(now) for p in order) + "\n"


def ranks_of(begin: dict[str, Any]) -> list[dict[str, Any]]:
    """The ranks a ``train_begin`` payload names: ``ranks`` (``ilab-train``), or the one
    trainer process a bridge names (``hostname``, ``pid``)."""
    out = []
    for r in begin.get("ranks") or []:
        if isinstance(r, dict) and isinstance(r.get("pid"), int) and isinstance(r.get("rank"), int):
            out.append({"rank": r["rank"], "pid": r["pid"], "host": r.get("host")})
    if not out and isinstance(begin.get("pid"), int):
        out.append({"rank": 0, "pid": begin["pid"], "host": begin.get("hostname")})
    return out
