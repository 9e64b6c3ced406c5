"""What a scheduler job leaves on disk for a watcher killed with ``kill -9``: its marker
(``<state>/<name>.jobs/<delivery>.json``: the job's name, id, owner and, once it ended, its
end), the exit file its script writes (watcher/scheduler/runner.py) and, for a local job,
its record (``<prefix>.job``: its id, written before its command may run;
watcher/scheduler/local.py)."""

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


def save(path: Path, marker: dict[str, Any], *, root: Path) -> None:
    """Write ``marker`` to ``path`` (below ``root``), durably: a restarted watcher must
    find the job."""
    atomic_write(path, orjson.dumps(marker), root=root)


def forget_finished(jobs_dir: Path) -> None:
    """Remove the markers of ended jobs (the watcher ended normally: their results are
    recorded); those of jobs still running stay for the next watcher."""
    for path in json_files(jobs_dir):
        marker = load(path)
        if marker is not None and marker.get("final") is not None:
            path.unlink(missing_ok=True)


#: The suffix of a local job's record, beside its script ``<prefix>.sh``.
JOB_RECORD = ".job"


def record_job(script: Path, job_id: str) -> Path:
    """Record ``job_id`` as the job of ``script`` (``<prefix>.job``), durably: a local job
    runs its command only once this names it, so a restarted watcher always finds a job
    that may have run (:func:`recorded_job`). The path written."""
    path = script.with_suffix(JOB_RECORD)
    atomic_write(path, f"{job_id}\n".encode(), root=script.parent)  # the runner checked it
    return path


def recorded_job(prefix: Path) -> str | None:
    """The id :func:`record_job` recorded for the job of ``prefix`` (None: none was)."""
    try:
        job_id = prefix.with_suffix(JOB_RECORD).read_text().strip()
    except OSError:
        return None
    return job_id or None


def exit_code(path: Path) -> int | None:
    """The command's exit code, from the exit file its job script wrote (None: not yet)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
