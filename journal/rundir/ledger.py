"""The alert ledger of a run dir: ``alerts/claims/`` (each alert, claimed once) and
``alerts/guards/`` (who watches the run).

**Once, across processes and hosts.** Any number of guards raise alerts on one run (the
launcher's, several ``ilab-watch``, on every host that shares the run dir). Each claims an
alert's identity (:func:`identity`: the run, the attempt, the kind, the incident) before
anything is sent: ``claims/<identity>.json``, linked into place only where nothing is
(:func:`~journal.rundir.files.atomic_write`'s ``exclusive``). The one that creates it
journals the alert and tells its targets; the others drop theirs.

**Visible while it lasts.** A claim holds its alert's record (and the run id), so the views
read an alert that the journal has not got yet: a trainer hung holding the journal journals
nothing until it is unstuck or ended, while ``status``, ``check``, ``tail -f`` and the page
show the hang (journal/views/fold.py).

**Guards.** Each guard rewrites ``guards/<host>-<pid>.json`` every few seconds while it
looks (who, what it watches, when it last looked) and removes it when it stops: ``status``
and the page say which guards watch a run and when each last looked; a guard that died
leaves a heartbeat that ages.

Torch-free, below the views: the fold reads it, the watcher writes it.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

import orjson

from journal.rundir.files import atomic_write, json_files
from journal.rundir.inbox import read_json_object
from journal.rundir.paths import ALERTS_DIR_NAME

#: A heartbeat older than this is a guard that stopped looking (it beats every 5 s).
GUARD_STALE_S = 30.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _word(text: object) -> str:
    """``text`` as a part of a file name: letters, digits and ``_.-`` (others ``_``)."""
    return _UNSAFE.sub("_", str(text))[:64]


def identity(run_id: str | None, attempt: int | None, kind: str, incident: str | None) -> str:
    """What makes two alerts the same, as their claim's name: ``<run id>.a<attempt>.<kind>``
    and the incident when a kind has more than one per attempt (a hang's start, a
    ``--notify-when`` condition, a guard)."""
    return ".".join(_word(p) for p in (run_id, f"a{attempt}", kind, incident) if p is not None)


def claims_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / ALERTS_DIR_NAME / "claims"


def claimed(run_dir: str | os.PathLike[str], name: str) -> bool:
    """Whether the identity ``name`` is claimed (by any process)."""
    return os.path.lexists(claims_dir(run_dir) / f"{name}.json")


def claim(run_dir: str | os.PathLike[str], name: str, record: dict[str, Any]) -> bool:
    """Claim the identity ``name`` with its alert's ``record``: True for the one process
    that creates it, False when it is claimed already. OSError when it cannot be written."""
    try:
        path = claims_dir(run_dir) / f"{name}.json"
        atomic_write(path, orjson.dumps(record), root=run_dir, exclusive=True)
    except FileExistsError:
        return False
    return True


def claims(run_dir: str | os.PathLike[str], run_id: str | None) -> list[dict[str, Any]]:
    """The alerts claimed for the run ``run_id``, oldest first (a file that cannot be read
    is none: the journal has its record, or will)."""
    found = _read_all(claims_dir(run_dir), f"{_word(run_id)}.")
    return sorted(found, key=lambda c: c.get("raised_at") or 0.0)


def _read_all(directory: Path, prefix: str = "") -> list[dict[str, Any]]:
    """The JSON objects of the files in ``directory`` whose names start with ``prefix``;
    what cannot be read is left out (a reader never trips on the ledger)."""
    out = []
    with contextlib.suppress(OSError):
        for path in json_files(directory):
            with contextlib.suppress(OSError, ValueError):
                if path.name.startswith(prefix):
                    out.append(read_json_object(path))
    return out


def _guard_path(run_dir: str | os.PathLike[str], host: str, pid: int) -> Path:
    return Path(run_dir) / ALERTS_DIR_NAME / "guards" / f"{_word(host)}-{pid}.json"


def beat(run_dir: str | os.PathLike[str], host: str, pid: int, info: dict[str, Any]) -> None:
    """Rewrite a guard's heartbeat (no fsync: it says what is now; a failure is silent,
    as a heartbeat that ages)."""
    with contextlib.suppress(OSError):
        data = orjson.dumps({**info, "host": host, "pid": pid})
        atomic_write(_guard_path(run_dir, host, pid), data, root=run_dir, durable=False)


def unbeat(run_dir: str | os.PathLike[str], host: str, pid: int) -> None:
    """A guard that stops watches no more: its heartbeat goes."""
    with contextlib.suppress(OSError):
        os.unlink(_guard_path(run_dir, host, pid))


def guards(run_dir: str | os.PathLike[str], run_id: str | None) -> list[dict[str, Any]]:
    """The heartbeats of the guards that watch (or watched, and died) the run ``run_id``:
    ``host``, ``pid``, ``source``, ``watches``, ``started_at``, ``looked_at``."""
    found = _read_all(Path(run_dir) / ALERTS_DIR_NAME / "guards")
    return [
        g
        for g in found
        if g.get("run_id") in (None, run_id) and isinstance(g.get("looked_at"), (int, float))
    ]
