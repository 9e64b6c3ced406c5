"""The trainer's declared long phase: ``<ckpt_dir>/phase.json``.

A hang is no step progress while the trainer is in no declared long phase (docs/alerts.md,
"Hangs and deaths"). The phases that legitimately stop steps (waiting for leases or for
paced callbacks, the blocking part of a save, an in-loop eval, the first step's compile and
warm-up) are declared here by rank 0, when they begin and when they end: a small file
replaced whole (never a journal record: a phase is about *now*, and a record per phase
change would add an event every consumer of the journal must learn to skip). The hang
detector reads it; a past run's phases are read back from what its ``save`` and
``evaluate`` records already say (``lease_wait_s``, ``blocked_s``, ``duration``).

Torch-free: the trainer writes it, the watcher reads it.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from journal.rundir.files import atomic_write

PHASE_FILE = "phase.json"
#: The phases a trainer declares. ``first_step``: from ``train_begin`` to the first
#: ``step_end`` (compile, warm-up, the first collectives).
PHASES: tuple[str, ...] = ("first_step", "lease_wait", "callback_wait", "save", "eval")
MAX_BYTES = 4096


def phase_path(ckpt_dir: str | os.PathLike[str]) -> Path:
    return Path(ckpt_dir) / PHASE_FILE


@dataclass(frozen=True)
class Phase:
    """What the trainer declared last. ``name`` None: in no phase since ``since`` (the
    last one ended then). ``limit_s``: the phase's own bound, when the trainer knows one
    (a lease wait ends by itself after it)."""

    name: str | None
    since: float
    run_id: str | None = None
    attempt: int | None = None
    pid: int | None = None
    limit_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def write_phase(ckpt_dir: str | os.PathLike[str], phase: Phase) -> None:
    """Replace the phase file (no fsync: it means nothing after a reboot). A failure is
    silent: the declaration is a courtesy to the hang detector, never a reason to stop."""
    with contextlib.suppress(OSError):
        data = orjson.dumps(phase.to_dict())
        atomic_write(phase_path(ckpt_dir), data, root=ckpt_dir, durable=False)


def read_phase(ckpt_dir: str | os.PathLike[str]) -> Phase | None:
    """The declared phase, or None when there is no readable phase file."""
    try:
        with open(phase_path(ckpt_dir), "rb") as f:
            raw = f.read(MAX_BYTES)
        data = orjson.loads(raw)
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    name, since = data.get("name"), data.get("since")
    if (name is not None and name not in PHASES) or not isinstance(since, (int, float)):
        return None

    def num(key: str) -> Any:
        v = data.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    run_id = data.get("run_id")
    return Phase(
        name=name,
        since=float(since),
        run_id=run_id if isinstance(run_id, str) else None,
        attempt=num("attempt"),
        pid=num("pid"),
        limit_s=num("limit_s"),
    )


class PhaseMarker:
    """Rank 0's declarations (other ranks: nothing). ``with marker("save"):`` declares the
    phase for the block; a phase inside another keeps the outer one."""

    def __init__(
        self,
        ckpt_dir: str | os.PathLike[str] | None,
        *,
        run_id: str | None = None,
        attempt: int | None = None,
    ) -> None:
        self.dir = Path(ckpt_dir) if ckpt_dir is not None else None
        self.run_id, self.attempt = run_id, attempt
        self.current: str | None = None

    def set(self, name: str | None, limit_s: float | None = None) -> None:
        """Declare ``name`` from now (None: no phase)."""
        self.current = name
        if self.dir is not None:
            phase = Phase(name, time.time(), self.run_id, self.attempt, os.getpid(), limit_s)
            write_phase(self.dir, phase)

    @contextlib.contextmanager
    def __call__(self, name: str, limit_s: float | None = None) -> Any:
        if self.current is not None:  # nested: the outer phase covers it
            yield
            return
        self.set(name, limit_s)
        try:
            yield
        finally:
            self.set(None)
