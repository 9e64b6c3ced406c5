"""What a scheduler job leaves on disk for a watcher killed with ``kill -9``: its marker
(``<state>/<name>.jobs/<delivery>.json``: the job's name, id, owner and, once it ended, its
end) and the exit file its script writes (watcher/scheduler/runner.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from journal.rundir.files import atomic_write, json_files


def load(path: Path) -> dict[str, Any] | None:
    """The marker at ``path``; None when there is none (or it is not one)."""
    try:
        obj = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return obj if isinstance(obj, dict) and "attempt" in obj else None


def save(path: Path, marker: dict[str, Any]) -> None:
    """Write ``marker`` to ``path``, durably: a restarted watcher must find the job."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, orjson.dumps(marker))


def forget_finished(jobs_dir: Path) -> None:
    """Remove the markers of ended jobs (the watcher ended normally: their results are
    recorded); those of jobs still running stay for the next watcher."""
    for path in json_files(jobs_dir):
        marker = load(path)
        if marker is not None and marker.get("final") is not None:
            path.unlink(missing_ok=True)


def exit_code(path: Path) -> int | None:
    """The command's exit code, from the exit file its job script wrote (None: not yet)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
