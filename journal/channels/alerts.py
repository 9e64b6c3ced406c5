"""``alert`` and ``alert_told`` records: a run went wrong, and who was told.

They reach the journal the way reports and scheduler jobs do, keeping its single writer:
the watcher writes one file per record into ``<ckpt_dir>/reports/`` (``"kind": "alert"``
or ``"kind": "alert_told"``), and whoever journals reports appends it: the trainer at its
next step boundary, or, when nobody holds the journal (training over, or the trainer died),
the watcher itself for one append (:func:`journal.channels.reports.drain`). A trainer that
hangs holding the journal journals nothing: the file waits in ``reports/`` for the next
holder (the launcher's ``train_end`` after an abort, a resumed attempt), while the alert's
notifications go out regardless.

Two records, not one: an ``alert`` is journaled at once, whether or not its ``--notify``
targets answer (they may be down for minutes); ``alert_told`` follows once every target
took it or was given up, naming which (the fold joins them by ``id``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from journal.record.events import ALERT_KINDS
from journal.rundir.files import atomic_write
from journal.rundir.inbox import (
    MAX_FILE_BYTES,
    MAX_NAME_CHARS,
    MAX_TEXT_CHARS,
    checked_id,
    checked_int,
    checked_text,
    checked_time,
    clip,
)
from journal.rundir.paths import reports_dir

#: The ``kind`` of an inbox file that is an ``alert`` record, and of one that is its
#: ``alert_told``: each kind's file is journaled as the event of the same name.
ALERT_KIND = "alert"
TOLD_KIND = "alert_told"
INBOX_KINDS: frozenset[str] = frozenset({ALERT_KIND, TOLD_KIND})
#: At most this many evidence paths, missing lines and targets per record.
MAX_ITEMS = 64


class InvalidAlert(ValueError):
    """A malformed alert file (one line, journaled as its refusal)."""


def alert_payload(
    *,
    id: str,
    kind: str,
    step: int | None,
    message: str,
    attempt: int | None = None,
    evidence: Iterable[str] = (),
    missing: Iterable[str] = (),
    condition: str | None = None,
    targets: Iterable[str] = (),
    run: str | None = None,
    host: str | None = None,
    source: str | None = None,
    resolves: str | None = None,
    raised_at: float,
) -> dict[str, Any]:
    """The JSON object of an alert file (its ``alert`` record, less ``kind`` renamed):
    text clipped to the inbox's bounds, so a long message never costs the alert its place."""
    return {
        "kind": ALERT_KIND,
        "id": id,
        "alert": kind,
        "step": step,
        "attempt": attempt,
        "message": clip(message),
        "evidence": [clip(p, MAX_NAME_CHARS * 4) for p in list(evidence)[:MAX_ITEMS]],
        "missing": [clip(m, MAX_NAME_CHARS * 4) for m in list(missing)[:MAX_ITEMS]],
        "condition": None if condition is None else clip(condition, MAX_NAME_CHARS * 4),
        "targets": [clip(t, MAX_NAME_CHARS) for t in list(targets)[:MAX_ITEMS]],
        "run": None if run is None else clip(run, MAX_NAME_CHARS * 4),
        "host": None if host is None else clip(host, MAX_NAME_CHARS),
        "source": None if source is None else clip(source, MAX_NAME_CHARS),
        "resolves": resolves,
        "raised_at": raised_at,
    }


def told_payload(
    *, id: str, told: Iterable[str], failed: Iterable[Mapping[str, Any]], told_at: float
) -> dict[str, Any]:
    """The JSON object of an ``alert_told`` file: which targets took alert ``id``, and for
    each one given up, its name, how many tries and the last error (no secrets in it)."""
    return {
        "kind": TOLD_KIND,
        "id": id,
        "told": [clip(t, MAX_NAME_CHARS) for t in list(told)[:MAX_ITEMS]],
        "failed": [
            {
                "target": clip(str(f.get("target")), MAX_NAME_CHARS),
                "tries": f.get("tries"),
                "error": clip(str(f.get("error")), MAX_NAME_CHARS * 4),
            }
            for f in list(failed)[:MAX_ITEMS]
        ],
        "told_at": told_at,
    }


def submit(ckpt_dir: str | os.PathLike[str], payload: Mapping[str, Any], name: str) -> Path:
    """Write an alert or alert_told file (``name``: its file name's stem, time-ordered)
    into ``reports/``; the caller then journals it (:func:`journal.channels.reports.drain`)
    or leaves that to the journal's holder. Raises ``OSError`` when it cannot be written."""
    body = orjson.dumps(payload)
    if len(body) > MAX_FILE_BYTES:  # bounded by alert_payload: never, unless hand-made
        raise InvalidAlert(f"alert file too large: {len(body)} bytes")
    path = reports_dir(ckpt_dir) / f"{name}.json"
    atomic_write(path, body, root=ckpt_dir)
    return path


def check_alert(obj: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The event (``alert`` or ``alert_told``) and record payload of an alert file's object,
    with exactly the documented fields; raises :class:`InvalidAlert` naming the first bad one."""
    kind = obj.get("kind")
    aid = checked_id(obj, InvalidAlert)
    if kind == TOLD_KIND:
        return TOLD_KIND, {
            "id": aid,
            "told": _texts(obj, "told"),
            "failed": _failed(obj.get("failed")),
            "told_at": checked_time(obj, "told_at", InvalidAlert),
        }
    if kind != ALERT_KIND:
        raise InvalidAlert(f"kind must be {ALERT_KIND!r} or {TOLD_KIND!r}")
    what = obj.get("alert")
    if what not in ALERT_KINDS:
        raise InvalidAlert(f"alert must be one of {', '.join(ALERT_KINDS)}")
    message = obj.get("message")
    if not isinstance(message, str) or len(message) > MAX_TEXT_CHARS:
        raise InvalidAlert(f"message must be a string of at most {MAX_TEXT_CHARS} characters")
    out: dict[str, Any] = {"id": aid, "kind": what, "message": message}
    for key in ("step", "attempt"):
        out[key] = checked_int(obj, key, InvalidAlert)
    for key in ("evidence", "missing", "targets"):
        out[key] = _texts(obj, key)
    for key in ("condition", "run", "host", "source", "resolves"):
        out[key] = checked_text(obj, key, InvalidAlert)
    out["raised_at"] = checked_time(obj, "raised_at", InvalidAlert)
    return ALERT_KIND, out


def _texts(obj: Mapping[str, Any], key: str) -> list[str]:
    value = obj.get(key, [])
    if (
        not isinstance(value, list)
        or len(value) > MAX_ITEMS
        or not all(isinstance(v, str) and len(v) <= MAX_TEXT_CHARS for v in value)
    ):
        raise InvalidAlert(f"{key} must be a list of at most {MAX_ITEMS} strings")
    return list(value)


def _failed(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise InvalidAlert(f"failed must be a list of at most {MAX_ITEMS} objects")
    out = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("target"), str):
            raise InvalidAlert("failed must hold objects with a target")
        tries = item.get("tries")
        error = item.get("error")
        out.append(
            {
                "target": clip(item["target"], MAX_NAME_CHARS),
                "tries": tries if isinstance(tries, int) and not isinstance(tries, bool) else None,
                "error": clip(error, MAX_TEXT_CHARS) if isinstance(error, str) else None,
            }
        )
    return out
