"""Reports: results computed outside training (eval accuracy, judge scores) for a checkpoint.

Storage keeps the journal's single writer. A reporter writes its report as one file in
``<ckpt_dir>/reports/`` (atomic, any host), then tries the journal lock:

- if a trainer holds it, the trainer journals the report at its next step boundary (and
  before any rotation, so a fresh best is never deleted);
- if nobody holds it (training over), the reporter takes it for one append.

Whoever releases the lock checks the inbox once more and, if files are left, takes the lock
again to journal them: every report file is journaled by a holder that took the lock after
the file was written, so none is stranded. ``report`` records are then read like any other.

A file that is not a valid report (see :mod:`journal.rundir.inbox` for what is read at all, and
:func:`check_payload`) is refused: journaled once as a ``control`` record naming no command
and moved to ``reports/rejected/``; the reports beside it are journaled as usual.
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
from pathlib import Path
from typing import Any

import orjson

from journal.channels.alerts import INBOX_KINDS, InvalidAlert, check_alert
from journal.channels.jobs import JOB_KIND, InvalidJob, check_job
from journal.record.numbers import parse_number, shown_value
from journal.rundir.files import atomic_write, json_files
from journal.rundir.inbox import (
    MAX_FILE_BYTES,
    MAX_NAME_CHARS,
    RejectedFile,
    checked_id,
    checked_time,
    clip,
    move_aside,
    read_json_object,
    refusal,
)
from journal.rundir.lock import JournalLocked
from journal.rundir.paths import (
    PROCESSED_DIR_NAME,
    checkpoint_root,
    checkpoint_step,
    checkpoints_dir,
    reports_dir,
)
from journal.rundir.safety import STEERING_DIRS, WRITTEN_DIRS, safe_dir
from journal.store import guest

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")
Append = Callable[[str, dict[str, Any]], Any]
#: The run dir's own directories: never a checkpoint.
_RUN_DIRS = frozenset({*STEERING_DIRS, *WRITTEN_DIRS})


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


def check_metrics(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    """Names like ``accuracy`` or ``judge/score``; JSON scalar values. Raises InvalidReport."""
    if not metrics:
        raise InvalidReport("a report needs at least one metric (name=value)")
    if not isinstance(metrics, Mapping):
        raise InvalidReport("metrics must be a JSON object of name: value")
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
        out[name] = _scalar(name, raw)
    return check_metrics(out)


def _scalar(name: str, raw: str) -> Any:
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        float(raw)
    except ValueError:
        return raw  # text: a judge's name, a verdict
    try:  # a number: finite, and not 5000 digits long (int() refuses past 4300)
        whole = not any(c in raw.lower() for c in ".ein")  # no point, exponent, inf, nan
        return parse_number(raw, whole=whole)
    except ValueError:
        raise InvalidReport(f"{name}={shown_value(raw)}: not a finite number") from None


# -- which checkpoint -----------------------------------------------------------------------


def run_checkpoint(ckpt_dir: str | os.PathLike[str], checkpoint: str | os.PathLike[str]) -> str:
    """The full path of a checkpoint of this run, given as a path or a bare name; raises
    :class:`InvalidReport` for anything else.

    A checkpoint of the run is ``step-NNNNNN`` in its ``checkpoints/`` (HF Trainer's
    ``checkpoint-N`` in the run dir itself), or, for bridges that name theirs freely, an
    existing directory inside the run dir. A relative path is taken from the current
    directory. It must be on disk now, with its files (see :func:`not_on_disk`): a report
    for a checkpoint never saved, or already removed, could otherwise become the best and
    cost the real one its place in rotation. Checked when a report is submitted and again
    when it is journaled (a leased checkpoint stays on disk until its lease ends).
    """
    run, given = Path(ckpt_dir), Path(checkpoint)
    name = given.name
    if checkpoint_step(name) is not None and str(given.parent) in ("", "."):
        given = checkpoint_root(run, name) / name  # a bare name
    where = Path(os.path.abspath(given))
    try:  # the parent resolved: checkpoints/ may be a symlink to other storage
        parent, real_run = where.parent.resolve(), run.resolve()
        roots = {real_run, checkpoints_dir(run).resolve()}
        home = checkpoint_root(run, name).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise InvalidReport(f"{checkpoint}: {exc}") from None
    if checkpoint_step(name) is not None:
        ok = parent == home
    else:
        ok = (
            any(r == parent or r in parent.parents for r in roots)
            and where.is_dir()
            and not name.startswith(".")
            and (parent != real_run or name not in _RUN_DIRS)
        )
    if not ok:
        raise InvalidReport(
            f"{checkpoint}: not a checkpoint of {ckpt_dir} "
            f"(expected {checkpoints_dir(run)}/step-NNNNNN or its name)"
        )
    if why := not_on_disk(where):
        shown = "" if os.path.abspath(checkpoint) == str(where) else f" ({where})"
        raise InvalidReport(f"{checkpoint}: {why}{shown}")
    return str(where)


def not_on_disk(path: Path) -> str | None:
    """Why ``path`` is not a complete checkpoint on disk now, or None when it is one: a
    directory holding its files (saves write under ``.tmp-`` and rename, so such a
    directory is complete; an empty one was made by hand)."""
    try:
        with os.scandir(path) as entries:
            if next(entries, None) is None:
                return "an empty directory, not a checkpoint"
    except FileNotFoundError:
        return "no such checkpoint, never saved or removed since"
    except NotADirectoryError:
        return "a file, not a checkpoint directory"
    except OSError as exc:
        return f"unreadable checkpoint ({exc.strerror or exc})"
    return None


# -- submission and ingestion ---------------------------------------------------------------


def report_payload(
    report: Report, *, source: str | None, delivery_id: str | None
) -> dict[str, Any]:
    """The JSON object of a report file (and of its ``report`` record). A ``source`` over
    256 characters (a hook's long command line) is cut here, saying so: it only says who
    reported, and must never cost the report its place in the journal."""
    return {
        "id": f"{time.time_ns():x}-{uuid.uuid4().hex[:8]}",
        "checkpoint_path": report.checkpoint_path,
        "step": report.step,
        "metrics": report.metrics,
        "source": clip(source or f"{socket.gethostname()}:{os.getpid()}", MAX_NAME_CHARS),
        "delivery_id": delivery_id,
        "reported_at": time.time(),
    }


def submit_report(
    ckpt_dir: str | os.PathLike[str],
    report: Report,
    *,
    source: str | None = None,
    delivery_id: str | None = None,
    written: Callable[[str], Any] | None = None,
) -> str:
    """Hand a report to the journal (see the module docstring); returns its id.

    Raises :class:`InvalidReport` when its checkpoint is not one of this run on disk now or
    when it is too large for the inbox (64 KiB: fewer or shorter metrics); nothing is
    written then. ``written(id)`` is called once its file is in ``reports/``, before this
    process tries to journal it: from then on a ``report`` record or a refusal may name it.
    """
    payload = report_payload(report, source=source, delivery_id=delivery_id)
    if report.checkpoint_path is not None:
        payload["checkpoint_path"] = run_checkpoint(ckpt_dir, report.checkpoint_path)
    body = orjson.dumps(payload)
    if len(body) > MAX_FILE_BYTES:
        raise InvalidReport(
            f"report too large: {len(body)} bytes, over the {MAX_FILE_BYTES // 1024} KiB "
            "limit (fewer or shorter metrics)"
        )
    atomic_write(reports_dir(ckpt_dir) / f"{payload['id']}.json", body, root=ckpt_dir)
    if written is not None:
        written(str(payload["id"]))
    drain(ckpt_dir, role="report")
    return str(payload["id"])


def pending(ckpt_dir: str | os.PathLike[str]) -> list[Path]:
    """Report files not yet journaled, oldest first (ids start with the time)."""
    return json_files(reports_dir(ckpt_dir))


def check_payload(ckpt_dir: str | os.PathLike[str], obj: dict[str, Any]) -> dict[str, Any]:
    """The ``report`` record payload of a report file's object, with exactly the documented
    fields (others are dropped); raises :class:`InvalidReport` naming the first bad one."""
    rid = checked_id(obj, InvalidReport)
    metrics = check_metrics(obj.get("metrics"))
    step = obj.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise InvalidReport("step must be a non-negative integer or null")
    reported_at = checked_time(obj, "reported_at", InvalidReport)
    out: dict[str, Any] = {"id": rid, "checkpoint_path": None, "step": step, "metrics": metrics}
    checkpoint = obj.get("checkpoint_path")
    if checkpoint is not None:
        if not isinstance(checkpoint, str):
            raise InvalidReport("checkpoint_path must be a string or null")
        out["checkpoint_path"] = run_checkpoint(ckpt_dir, checkpoint)
    for key in ("source", "delivery_id"):
        value = obj.get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidReport(f"{key} must be a string or null")
        # who reported is ours to shorten, never a reason to drop the metrics (an older
        # watcher put a hook's whole command line in it)
        out[key] = None if value is None else clip(value, MAX_NAME_CHARS)
    out["reported_at"] = reported_at
    return out


def ingest(
    ckpt_dir: str | os.PathLike[str], append: Append, handled: set[str] | None = None
) -> int:
    """Journal every pending report through ``append`` (the caller holds the journal lock)
    and archive its file; returns how many were journaled.

    A file that is not a valid report (not a regular file, over 64 KiB, malformed, for a
    checkpoint of another run or one not on disk now) is refused: journaled once as a
    ``control`` record naming no command, and moved to ``reports/rejected/``. ``handled``
    (names already journaled by this process, that could not be moved) keeps such a file
    from being journaled again.
    """
    done = 0
    handled = set() if handled is None else handled
    processed = reports_dir(ckpt_dir) / PROCESSED_DIR_NAME
    for path in pending(ckpt_dir):
        if path.name in handled:
            continue
        source: Any = None
        try:
            obj = read_json_object(path)
            source = obj.get("source")
            kind = obj.get("kind")
            if kind == JOB_KIND:  # a scheduler job's state (journal/channels/jobs.py)
                event, payload = "job", check_job(obj)
            elif isinstance(kind, str) and kind in INBOX_KINDS:  # journal/channels/alerts.py
                event, payload = check_alert(obj)
            else:
                event, payload = "report", check_payload(ckpt_dir, obj)
        except FileNotFoundError:
            continue  # taken by another holder of the lock meanwhile
        except (RejectedFile, InvalidReport, InvalidJob, InvalidAlert) as exc:
            log.warning("refusing report file %s: %s", path, exc)
            moved = move_aside(path)
            if moved is None:
                handled.add(path.name)
            append("control", refusal(path, str(exc), moved, source))
            continue
        append(event, payload)
        done += 1
        try:
            os.replace(path, safe_dir(path.parent, processed) / path.name)
        except OSError as exc:
            handled.add(path.name)
            log.warning("cannot archive %s: %s", path, exc)
    return done


def drain(ckpt_dir: str | os.PathLike[str], *, role: str, rounds: int = 10) -> None:
    """Journal pending reports if nobody writes the journal now; call after writing a report
    file and after releasing the lock. When the lock is busy its holder journals them."""
    handled: set[str] = set()
    for _ in range(rounds):
        if not [p for p in pending(ckpt_dir) if p.name not in handled]:
            return
        try:
            # Short holders (another reporter, a status probe) are gone within milliseconds;
            # one that stays is a trainer, which drains before and after it releases.
            with guest(ckpt_dir, role=role, timeout=0.5) as w:
                ingest(ckpt_dir, w.append, handled)
        except JournalLocked:
            return
