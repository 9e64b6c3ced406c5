"""``job`` records: a scheduler job that ran a watcher delivery (``ilab-watch --via slurm``).

A job's state changes (submitted, running on a node, ended with an exit code) reach the
journal the way reports do, keeping its single writer: the watcher writes one file per
change into ``<ckpt_dir>/reports/`` (``"kind": "job"``), and whoever journals reports
(the trainer at a step boundary, or the reporter itself once training is over, see
:mod:`journal.channels.reports`) appends it as a ``job`` record. A reader so sees which job
evaluated which checkpoint: ``job_id`` and ``checkpoint_path`` in one record.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from journal.rundir.inbox import (
    MAX_FILE_BYTES,
    MAX_NAME_CHARS,
    MAX_TEXT_CHARS,
    checked_id,
    checked_int,
    checked_text,
    checked_time,
)

#: The ``kind`` of an inbox file that is a job record (a report file has none).
JOB_KIND = "job"
#: A job's states after which nothing more happens (Slurm's names, which local and Ray jobs
#: are given too): the watcher's scheduler stops polling them, ``check --wait`` stops
#: waiting for them.
FINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "LOST",  # ours: the scheduler no longer knows the job and it left no exit code
    }
)
#: A job's text fields, in their record's order: names, then paths (which may be long).
_NAMES = ("job_id", "scheduler", "state", "node", "delivery_id", "hook", "source")
_PATHS = ("log_path", "checkpoint_path")


class InvalidJob(ValueError):
    """A malformed job file (one line, journaled as its refusal)."""


def job_payload(
    *,
    job_id: str,
    scheduler: str,
    state: str,
    delivery_id: str,
    hook: str,
    checkpoint_path: str | None,
    step: int | None,
    attempt: int,
    node: str | None = None,
    exit_code: int | None = None,
    log_path: str | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """The JSON object of a job file (and of its ``job`` record, less ``kind``)."""
    return {
        "kind": JOB_KIND,
        "id": f"{time.time_ns():x}-{uuid.uuid4().hex[:8]}",
        "job_id": job_id,
        "scheduler": scheduler,
        "state": state,
        "node": node,
        "exit_code": exit_code,
        "log_path": log_path,
        "checkpoint_path": checkpoint_path,
        "step": step,
        "delivery_id": delivery_id,
        "hook": hook,
        "attempt": attempt,
        "source": source,
        "reported_at": time.time(),
    }


def check_job(obj: dict[str, Any]) -> dict[str, Any]:
    """The ``job`` record payload of a job file's object, with exactly the documented
    fields; raises :class:`InvalidJob` naming the first bad one."""
    out: dict[str, Any] = {"id": checked_id(obj, InvalidJob)}
    for key in (*_NAMES, *_PATHS):
        limit = MAX_TEXT_CHARS if key in _PATHS else MAX_NAME_CHARS
        out[key] = checked_text(obj, key, InvalidJob, limit)
    for key in ("job_id", "scheduler", "state", "delivery_id"):
        if not out[key]:
            raise InvalidJob(f"{key} is required")
    for key in ("step", "exit_code", "attempt"):
        out[key] = checked_int(obj, key, InvalidJob)
    out["reported_at"] = checked_time(obj, "reported_at", InvalidJob)
    if len(orjson.dumps(out)) > MAX_FILE_BYTES:
        raise InvalidJob("job record too large")
    return out
