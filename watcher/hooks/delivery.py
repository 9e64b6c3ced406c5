"""A delivery (one record to one hook) and its recorded result."""

from __future__ import annotations

import hashlib
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from journal.record.fields import missing_fields
from journal.record.record import Record
from journal.store import Cursor
from watcher.hooks.callbacks import CommandTarget, delivery_id_for
from watcher.hooks.hook import Hook


@dataclass(slots=True)
class Batch:
    """Records read together: the cursor may move past them once ``pending`` reaches 0."""

    start: Cursor  # where the batch starts (re-read from here after a restart)
    min_seq: int
    pending: int


class Delivery:
    """One record to one hook. Its ``delivery_id`` (stable across restarts: run id, seq
    and hook) is made on first use: a callable's plain success never asks for it."""

    __slots__ = ("_id", "batch", "hook", "lease", "record")

    def __init__(
        self,
        hook: Hook,
        record: Record,
        batch: Batch,
        delivery_id: str | None = None,
        lease: str | None = None,  # the checkpoint lease held while a save is queued or running
    ) -> None:
        self.hook = hook
        self.record = record
        self.batch = batch
        self.lease = lease
        self._id = delivery_id

    def __repr__(self) -> str:
        return f"Delivery({self.delivery_id!r}, {self.hook.label!r}, lease={self.lease!r})"

    @property
    def delivery_id(self) -> str:
        did = self._id
        if did is None:
            did = self._id = delivery_id_for(self.record, self.hook.short_id)
        return did

    @property
    def file_stem(self) -> str:
        """The delivery id as a file name: the run id in it comes from the record, so it
        may hold ``/``, ``..`` or be very long (then a hash keeps it unique)."""
        did = self.delivery_id
        safe = "".join(c if c in _NAME_CHARS else "_" for c in did)
        if safe == did and len(did) <= 100:
            return did
        return f"{safe[:60]}-{hashlib.sha1(did.encode('utf-8', 'replace')).hexdigest()[:12]}"


class Run(NamedTuple):
    """One hook's deliveries of records read together (one batch), in journal order: what a
    callable's runner runs in a row (watcher.engine.callable_runner). A replay's inline lane
    gets them from dispatch with no :class:`Delivery` per record (a replay makes millions);
    a queue makes them of its deliveries, kept in ``deliveries``."""

    hook: Hook
    batch: Batch
    records: list[Record]
    deliveries: list[Delivery] | None = None


def runs_of(taken: list[Delivery]) -> list[Run]:
    """``taken`` (in order) as runs: each one hook's consecutive deliveries of one batch."""
    runs: list[Run] = []
    last: Any = None
    for d in taken:
        if last is None or d.hook is not last.hook or d.batch is not last.batch:
            last = Run(d.hook, d.batch, [], [])
            runs.append(last)
        last.records.append(d.record)
        last.deliveries.append(d)
    return runs


_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "-_")


def state_write_failed(where: Path, exc: OSError) -> str:
    """The one line said when the watcher's own state cannot be written (the same for
    every file in ``where``, so that it is said once)."""
    return (
        f"cannot write to {where}: {exc.strerror or exc}; deliveries go on, but their "
        "results, logs and cursor are not saved there until it can be written "
        "(a restart may repeat deliveries)"
    )


class TrackerUnavailable(Exception):
    """A callback's tracker stopped answering (an exporter's, watcher/exporters). Its
    message is one line for the user (what is incomplete and which command repairs it):
    the watcher says it once, and each delivery that meets it fails without a traceback of
    its own. Here, below the engine that catches it and the exporters that raise it."""


def already_said(error: str | None) -> bool:
    """Whether a delivery's error is a :class:`TrackerUnavailable` (said once already)."""
    return bool(error) and str(error).startswith(f"{TrackerUnavailable.__name__}: ")


@dataclass(slots=True)
class DeliveryResult:
    """The recorded result of one delivery (one line of the results file)."""

    delivery_id: str
    hook: str
    event: str
    seq: int
    step: int
    status: str  # ok | failed | timeout | skipped | coalesced | abandoned
    kind: str = "command"  # or "callable"
    attempts: int = 0
    start_ts: float | None = None
    end_ts: float | None = None
    duration: float | None = None
    exit_code: int | None = None
    error: str | None = None
    stdout_tail: str | None = None
    stderr_tail: str | None = None
    log_path: str | None = None
    control: list[str] | None = None  # command:id of each Control the callback returned
    reports: list[str] | None = None  # ids of the reports it sent
    #: with --via: each attempt's job (scheduler, id, node, state changes; watcher/scheduler/runner.py)
    jobs: list[dict[str, Any]] | None = None
    #: A callable's plain successes in one batch share a line: ``count`` deliveries, from
    #: ``seq`` to ``last_seq`` (watcher.engine.completion.plain_line); otherwise 1 and None.
    count: int = 1
    last_seq: int | None = None

    @classmethod
    def of(cls, d: Delivery, status: str, **fields: Any) -> DeliveryResult:
        """The result of delivery ``d`` with ``status`` (and any other fields)."""
        kind = "command" if isinstance(d.hook.target, CommandTarget) else "callable"
        return cls(
            d.delivery_id,
            d.hook.label,
            d.hook.event,
            d.record["seq"],
            d.record["step"],
            status,
            kind,
            **fields,
        )

    @property
    def failed(self) -> bool:
        """``skipped`` (the checkpoint was already removed) is not a failure."""
        return self.status in ("failed", "timeout", "abandoned")


def undeliverable(rec: Mapping[str, Any]) -> str | None:
    """Why a record goes to no hook (``missing run_id, data.checkpoint_path``), or None.

    The readers complete a record a writer left envelope fields out of (their defaults,
    journal/record/record.py); what no default stands in for, and what a hook of its event
    needs, is journal/record/fields.py's :func:`missing_fields`: without it a hook would get
    a record that ``ilab-journal validate`` reports, with no run or checkpoint to act on
    (one appended by hand)."""
    missing = missing_fields(rec)
    return f"missing {', '.join(missing)}" if missing else None
