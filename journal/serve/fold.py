"""One run's journal folded for the page: curves and markers, kept up to date by reading on
from where the last read stopped (never the whole file again). The status, the checkpoints
with their fates and the best are the run's one fold (:class:`journal.views.fold.RunFold`,
``RunFold.run`` here), fed the same records: the page cannot disagree with ``status``.

A curve holds one point per step. A resumed attempt goes back in steps: its points replace
the ones from its step on (the curves show the latest attempt's path; the resume is a
marker). Reported metrics are per checkpoint step, inserted in step order. The points are
the fold's (:func:`journal.views.fold.metric_points`: finite numbers, as every view reads
them).

Memory is bounded in the number of names: the first :data:`MAX_CURVES` logged names and
the first :data:`MAX_CURVES` reported ones (and the page's own, :data:`PRIORITY`, whenever
they come) are kept as curves; later names are only listed (at most :data:`MAX_LISTED`),
and one's curve is read from the journal when asked for (:meth:`RunFold.listed_curve`).
"""

from __future__ import annotations

import bisect
import math
import threading
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from journal.read.reader import CHUNK_SIZE, iter_events
from journal.read.tailing import RotatingReader
from journal.record.events import LIFECYCLE_EVENTS
from journal.record.fields import PAYLOAD_TYPES
from journal.record.record import Record
from journal.serve.marks import MARKER_KINDS
from journal.store import follow
from journal.views.fold import NOT_METRICS, metric_points
from journal.views.fold import RunFold as RunTruth
from journal.views.ledger import CheckpointLedger, finite_number

#: Events that are neither a curve nor a marker: folded into the summary only.
_PLAIN = frozenset(LIFECYCLE_EVENTS).difference(
    ("train_begin", "log", "evaluate", "save", "step_end", "train_end")
)
#: The prefix of a reported metric's curve (its x: the checkpoint's step), so that a
#: reported ``loss`` is not the training loss.
REPORTED = "report:"
#: The longest string a marker's detail carries (a reason, a source): the page shows text.
MAX_TEXT = 500
#: Curves kept (at full resolution) of logged names, and as many of reported ones: the
#: first met. A journal with thousands of names paints in a second, not a minute.
MAX_CURVES = 32
#: Names kept as curves whenever they come, beyond the cap: the trainer's own numbers.
PRIORITY = frozenset(
    name
    for event in ("log", "evaluate")
    for name, types in PAYLOAD_TYPES[event].items()
    if float in types and name not in NOT_METRICS
)
#: Names listed beyond the curves (a curve read on demand); later ones are not kept.
MAX_LISTED = 10_000


def scalar(v: Any) -> Any:
    """A detail value as JSON scalars: strings clipped, nested values left out."""
    if isinstance(v, str):
        return v if len(v) <= MAX_TEXT else v[:MAX_TEXT] + "..."
    if v is None or isinstance(v, (bool, int)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, dict):  # a report's metrics: one level, as "name=value" text
        return scalar(", ".join(f"{k}={x}" for k, x in v.items()))
    if isinstance(v, list) and all(isinstance(x, str) for x in v):  # an alert's evidence
        return scalar(", ".join(v)) if v else None
    return None


@dataclass
class Series:
    """One curve: steps and values, ascending in step. ``reset_at``: the record count at the
    last change that was not an append (a resume's replacement, a report's insertion)."""

    name: str
    by_report: bool = False
    steps: array[float] = field(default_factory=lambda: array("d"))
    values: array[float] = field(default_factory=lambda: array("d"))
    reset_at: int = 0

    def add(self, step: float, value: float, count: int) -> None:
        steps = self.steps
        if not steps or step > steps[-1]:
            steps.append(step)
            self.values.append(value)
            return
        if step == steps[-1] and not self.by_report:  # the same step again (log after step_end)
            self.values[-1] = value
            return
        at = bisect.bisect_left(steps, step)
        if self.by_report:  # a checkpoint's result: in step order, a later one replacing
            if at < len(steps) and steps[at] == step:
                self.values[at] = value
            else:
                steps.insert(at, step)
                self.values.insert(at, value)
        else:  # a resumed attempt: its points replace those from its step on
            del steps[at:]
            del self.values[at:]
            steps.append(step)
            self.values.append(value)
        self.reset_at = count


class RunFold:
    """Everything the page shows about one journal, folded incrementally (thread-safe)."""

    def __init__(self, journal: Path, only: str | None = None) -> None:
        self.journal = journal
        self.only = only  # a listed name's fold (listed_curve): that one curve, and no other
        # the one fold: status, every checkpoint with its fate, the best (never folded here)
        self.run = RunTruth(journal.parent)
        self.series: dict[str, Series] = {}
        self.markers: list[dict[str, Any]] = []
        self.ck_changed_at = 0  # the record count when the checkpoints or the best last changed
        self.count = 0  # records folded
        self.invalid = 0
        self.listed: dict[str, None] = {}  # names beyond the curves, in the order met
        self.listed_all = True  # False once a name came past MAX_LISTED
        self.names_changed_at = 0  # the record count when ``listed`` last changed
        self._capped = {False: 0, True: 0}  # curves kept beyond PRIORITY, by by_report
        self.unreadable: str | None = None  # why the journal cannot be read now: one line
        self.told: dict[int, int] = {}  # alert marker -> the record count its outcome came at
        self.last_log: Record | None = None
        self.prev_log: Record | None = None
        self._reader: RotatingReader | None = None
        self.lock = threading.RLock()  # held by the api while it reads the fold

    def update(self) -> int:
        """Fold what was appended since the last call; the number of records folded now.
        A journal that cannot be read (a directory, no permission) sets ``unreadable``
        and is tried again on the next call."""
        with self.lock:
            before = self.count
            try:
                self._read_on()
            except OSError as exc:
                self.unreadable = f"cannot read {self.journal.name}: {exc.strerror or exc}"
            else:
                self.unreadable = None
            return self.count - before

    def _read_on(self) -> None:
        if self._reader is None:
            if not self.journal.exists():
                return
            self._reader = follow(self.journal)
        while True:
            self._reader.check()
            offset = self._reader.offset
            batch = self._reader.read(max_bytes=CHUNK_SIZE)
            self.invalid += len(batch.invalid)
            for rec in batch.records:
                self._add(rec)
            if self._reader.offset == offset:
                return

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()

    # -- folding one record -----------------------------------------------------------------

    def _add(self, rec: Record) -> None:
        self.count += 1
        event = rec["event"]
        if not self.run.add(rec) or event in _PLAIN:  # not the run's, or no curve or mark
            return
        if event in CheckpointLedger.EVENTS:  # the table (or which is the best) may change
            self.ck_changed_at = self.count
        if event in ("step_end", "log", "evaluate"):
            self._curves(rec, event)
        kind = MARKER_KINDS.get(event)
        if kind is not None:
            self._marker(rec, kind)
        elif event == "alert_told":
            self._told(rec["data"])

    def _new_series(self, name: str, by_report: bool = False) -> Series | None:
        """A curve for a name met for the first time, or None past the cap (then listed)."""
        if self.only is not None and name != self.only:
            return None
        if name == self.only or name in PRIORITY or self._capped[by_report] < MAX_CURVES:
            self._capped[by_report] += name not in PRIORITY
            return self.series.setdefault(name, Series(name, by_report=by_report))
        if name not in self.listed:
            if len(self.listed) < MAX_LISTED:
                self.listed[name] = None
                self.names_changed_at = self.count
            else:
                self.listed_all = False
        return None

    def listed_curve(self, name: str) -> Series | None:
        """A listed name's curve, read now from the journal's lines that hold the name
        (a byte search: only those are parsed); None for a name not listed. Reads the
        journal file at the path (a rotated-away part is not in it)."""
        if name not in self.listed:
            return None
        key = name.removeprefix(REPORTED)
        one = RunFold(self.journal, only=name)
        for rec in iter_events(self.journal, set(), holding=(orjson.dumps(key).decode()[1:-1],)):
            one._add(rec)
        return one.series.get(name) or Series(name, by_report=name.startswith(REPORTED))

    def _point(self, name: str, step: float, value: float, *, by_report: bool = False) -> None:
        series = self.series.get(name)
        if series is None:
            series = self._new_series(name, by_report)
            if series is None:
                return
        series.add(step, value, self.count)

    def _curves(self, rec: Record, event: str) -> None:
        step, data = rec["step"], rec["data"]
        if event == "step_end":
            if (loss := finite_number(data.get("loss"))) is not None:
                self._point("loss", step, loss)
            return
        if event == "log":
            self.prev_log, self.last_log = self.last_log, rec
        for key, value in metric_points(event, step, data)[2].items():  # type: ignore[index]
            self._point(str(key), step, value)

    def _marker(self, rec: Record, kind: str) -> None:
        data, step = rec["data"], rec["step"]
        detail = {str(k): x for k, v in data.items() if (x := scalar(v)) is not None}
        if kind in ("alert", "report") and isinstance(data.get("step"), int):
            step = data["step"]  # the step it is about: an alert's, a report's checkpoint's
        if kind == "attempt":
            detail = {
                "attempt": rec["attempt"],
                "run_id": scalar(rec["run_id"]),
                "resumed_from": scalar(data.get("resumed_from")),
                "total_steps": data.get("total_steps"),
            }
        self.markers.append(
            {
                "i": len(self.markers),
                "kind": kind,
                "event": rec["event"],
                "seq": rec["seq"],
                "step": step,
                "ts": rec["ts"],
                "attempt": rec["attempt"],
                "detail": detail,
            }
        )
        if kind == "report":  # its metrics: points of its checkpoint's step
            _, at, values = metric_points("report", rec["step"], data)  # type: ignore[misc]
            for name, value in values.items():
                self._point(f"{REPORTED}{name}", at, value, by_report=True)

    def _told(self, data: dict[str, Any]) -> None:
        """Who was told of an alert, and when: on the alert's marker."""
        for m in reversed(self.markers):
            if m["kind"] == "alert" and m["detail"].get("id") == data.get("id"):
                m["detail"]["told"] = scalar(data.get("told")) or "nobody"
                m["detail"]["told_at"] = scalar(data.get("told_at"))
                self.told[m["i"]] = self.count
                return
