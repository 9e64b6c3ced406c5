"""Reports: results computed outside training (eval accuracy, judge scores) for a checkpoint.

Storage keeps the journal's single writer. A reporter writes its report as one file in
``<ckpt_dir>/reports/`` (atomic, any host), then tries the journal lock:

- if a trainer holds it, the trainer journals the report at its next step boundary (and
  before any rotation, so a fresh best is never deleted);
- if nobody holds it (training over), the reporter takes it for one append.

Whoever releases the lock checks the inbox once more and, if files are left, takes the lock
again to journal them: every report file is journaled by a holder that took the lock after
the file was written, so none is stranded. ``report`` records are then read like any other.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard

import orjson

from journal.files import atomic_write, json_files
from journal.lock import JournalLock, JournalLocked
from journal.paths import PROCESSED_DIR_NAME, checkpoint_step, reports_dir

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")
Append = Callable[[str, dict[str, Any]], Any]


class InvalidReport(ValueError):
    """A malformed report (one clear line for the user)."""


class Report:
    """Results for one checkpoint, returned by a Python callback or sent with
    :func:`submit_report`.

    >>> Report(accuracy=0.81, pass_at_1=0.42)            # for the checkpoint being delivered
    >>> Report({"judge/score": 7.5}, checkpoint_path="runs/x/checkpoints/step-000040")

    ``checkpoint_path`` and ``step`` default to those of the event a callback was given.
    Metric values are numbers, booleans or strings; best-checkpoint selection uses numbers.
    """

    def __init__(
        self,
        metrics: Mapping[str, Any] | None = None,
        /,
        *,
        checkpoint_path: str | os.PathLike[str] | None = None,
        step: int | None = None,
        **named: Any,
    ) -> None:
        self.metrics = check_metrics({**(metrics or {}), **named})
        self.checkpoint_path = None if checkpoint_path is None else str(checkpoint_path)
        self.step = step

    def __repr__(self) -> str:
        return (
            f"Report({self.metrics!r}, checkpoint_path={self.checkpoint_path!r}, step={self.step})"
        )


def check_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Names like ``accuracy`` or ``judge/score``; JSON scalar values. Raises InvalidReport."""
    if not metrics:
        raise InvalidReport("a report needs at least one metric (name=value)")
    out = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidReport(f"invalid metric name {name!r} (letters, digits, _ . - /)")
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidReport(f"{name}: {value} is not a finite number")
        if not (value is None or isinstance(value, (bool, int, float, str))):
            raise InvalidReport(f"{name}: value must be a number, boolean or string")
        out[name] = value
    return out


def parse_assignments(items: Iterable[str]) -> dict[str, Any]:
    """``["accuracy=0.81", "judge=gpt"]`` -> ``{"accuracy": 0.81, "judge": "gpt"}``."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise InvalidReport(f"{item!r}: expected name=value")
        out[name] = _scalar(raw)
    return check_metrics(out)


def _scalar(raw: str) -> Any:
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        value = float(raw)
    except ValueError:
        return raw
    if not math.isfinite(value):
        raise InvalidReport(f"{raw!r} is not a finite number")
    return value


# -- best checkpoint ------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricGoal:
    """``accuracy:max`` / ``val_loss:min``: which metric makes a checkpoint the best."""

    metric: str
    mode: Literal["max", "min"]

    @classmethod
    def parse(cls, text: str) -> MetricGoal:
        metric, sep, mode = text.rpartition(":")
        if not sep or not metric or mode not in ("max", "min"):
            raise ValueError(f"{text!r}: expected METRIC:max or METRIC:min (e.g. val_loss:min)")
        return cls(metric, "max" if mode == "max" else "min")

    def __str__(self) -> str:
        return f"{self.metric}:{self.mode}"

    def better(self, a: float, b: float) -> bool:
        return a > b if self.mode == "max" else a < b


@dataclass
class BestCheckpoint:
    checkpoint_path: str
    metric: str
    value: float
    step: int | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


#: Records that can change which checkpoint is the best.
BEST_EVENTS = frozenset({"evaluate", "save", "report", "checkpoint_removed"})


@dataclass
class BestTracker:
    """Folds journal records into the best surviving checkpoint for one goal.

    Values come from ``report`` records (per checkpoint) and from ``evaluate`` records (a
    step's validation belongs to the checkpoint saved at that step). Checkpoints journaled
    as removed drop out.
    """

    goal: MetricGoal
    _values: dict[str, tuple[float, str, int | None]] = field(default_factory=dict)
    _pending_eval: dict[int, float] = field(default_factory=dict)

    def add(self, rec: Mapping[str, Any]) -> None:
        event, data = rec.get("event"), rec.get("data") or {}
        if event == "report":
            value = (data.get("metrics") or {}).get(self.goal.metric)
            path = data.get("checkpoint_path")
            if _is_number(value) and isinstance(path, str):
                self._values[_key(path)] = (float(value), path, data.get("step"))
        elif event == "evaluate":
            value = data.get(self.goal.metric)
            if _is_number(value):
                self._pending_eval[int(rec.get("step", 0))] = float(value)
        elif event == "save":
            step = int(rec.get("step", 0))
            path = data.get("checkpoint_path")
            if step in self._pending_eval and isinstance(path, str):
                self._values.setdefault(_key(path), (self._pending_eval.pop(step), path, step))
            # validations before this save belong to no checkpoint: forget them
            self._pending_eval = {s: v for s, v in self._pending_eval.items() if s > step}
        elif event == "checkpoint_removed" and isinstance(data.get("checkpoint_path"), str):
            self._values.pop(_key(data["checkpoint_path"]), None)

    def to_state(self) -> dict[str, Any]:
        return {
            "goal": str(self.goal),
            "values": {k: list(v) for k, v in self._values.items()},
            "pending_eval": {str(k): v for k, v in self._pending_eval.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> BestTracker:
        tracker = cls(MetricGoal.parse(state["goal"]))
        tracker._values = {k: (float(v[0]), str(v[1]), v[2]) for k, v in state["values"].items()}
        tracker._pending_eval = {int(k): float(v) for k, v in state["pending_eval"].items()}
        return tracker

    def best(self) -> BestCheckpoint | None:
        top: tuple[float, str, int | None] | None = None
        for entry in self._values.values():
            if top is None or self.goal.better(entry[0], top[0]):
                top = entry
        if top is None:
            return None
        return BestCheckpoint(top[1], self.goal.metric, top[0], top[2])


def _is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _key(path: str) -> str:
    """Checkpoints are named step-NNNNNN inside one run: the name identifies them."""
    name = Path(path).name
    return name if checkpoint_step(name) is not None else os.path.normpath(path)


def checkpoint_key(path: str) -> str:
    """The identity :class:`BestTracker` uses for a checkpoint path."""
    return _key(path)


# -- submission and ingestion ---------------------------------------------------------------


def report_payload(
    report: Report, *, source: str | None, delivery_id: str | None
) -> dict[str, Any]:
    return {
        "id": f"{time.time_ns():x}-{uuid.uuid4().hex[:8]}",
        "checkpoint_path": report.checkpoint_path,
        "step": report.step,
        "metrics": report.metrics,
        "source": source or f"{socket.gethostname()}:{os.getpid()}",
        "delivery_id": delivery_id,
        "reported_at": time.time(),
    }


def submit_report(
    ckpt_dir: str | os.PathLike[str],
    report: Report,
    *,
    source: str | None = None,
    delivery_id: str | None = None,
) -> str:
    """Hand a report to the journal (see the module docstring); returns its id."""
    payload = report_payload(report, source=source, delivery_id=delivery_id)
    inbox = reports_dir(ckpt_dir)
    inbox.mkdir(mode=0o750, parents=True, exist_ok=True)
    atomic_write(inbox / f"{payload['id']}.json", orjson.dumps(payload))
    drain(ckpt_dir, role="report")
    return str(payload["id"])


def pending(ckpt_dir: str | os.PathLike[str]) -> list[Path]:
    """Report files not yet journaled, oldest first (ids start with the time)."""
    return json_files(reports_dir(ckpt_dir))


def ingest(ckpt_dir: str | os.PathLike[str], append: Append) -> int:
    """Journal every pending report through ``append`` (the caller holds the journal lock)
    and archive its file; returns how many were journaled."""
    done = 0
    processed = reports_dir(ckpt_dir) / PROCESSED_DIR_NAME
    for path in pending(ckpt_dir):
        try:
            payload = orjson.loads(path.read_bytes())
            if not isinstance(payload, dict):
                raise ValueError("not a JSON object")
            check_metrics(payload.get("metrics") or {})
        except (OSError, ValueError) as exc:
            log.warning("skipping report file %s: %s", path, exc)
            payload = None
        if payload is not None:
            append("report", payload)
            done += 1
        processed.mkdir(mode=0o750, exist_ok=True)
        try:
            os.replace(path, processed / path.name)
        except OSError as exc:
            log.warning("cannot archive %s: %s", path, exc)
    return done


def drain(ckpt_dir: str | os.PathLike[str], *, role: str, rounds: int = 10) -> None:
    """Journal pending reports if nobody writes the journal now; call after writing a report
    file and after releasing the lock. When the lock is busy its holder journals them."""
    from journal.writer import JournalWriter  # the writer imports nothing from here

    for _ in range(rounds):
        if not pending(ckpt_dir):
            return
        lock = JournalLock(ckpt_dir, role=role)
        try:
            # Short holders (another reporter, a status probe) are gone within milliseconds;
            # one that stays is a trainer, which drains before and after it releases.
            lock.acquire(timeout=0.5)
        except JournalLocked:
            return
        try:
            with JournalWriter(ckpt_dir, join=True) as w:
                ingest(ckpt_dir, w.append_at_last_position)
        finally:
            lock.release()
