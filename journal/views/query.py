"""Fast lookups for scripts: the first or last record of an event, and field extraction.

``last`` scans the file backwards in blocks and only parses lines that contain the event
name, so "newest checkpoint path" on a journal of millions of records costs milliseconds.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import orjson

from journal.read.lines import LongLine, too_long_reason
from journal.read.reader import iter_events, lines_backwards, record_problem
from journal.record.record import Record, complete
from journal.views.best import BestCheckpoint, MetricGoal
from journal.views.ledger import CheckpointLedger

_MISSING = object()


def _match(line: bytes, needle: bytes, event: str) -> Record | None:
    if needle not in line:
        return None
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is dict and obj.get("event") == event and record_problem(obj) is None:
        return complete(obj)
    return None


def find_last(path: str | os.PathLike[str], event: str) -> Record | None:
    """The newest complete record of ``event``, or None."""
    needle = f'"{event}"'.encode()
    for _, line in lines_backwards(path):
        rec = _match(line, needle, event)
        if rec is not None:
            return rec
    return None


def _record_or_note(line: bytes, offset: int, invalid: list[tuple[int, str]]) -> Record | None:
    """The record on a line, or None after noting why it is not one in ``invalid``."""
    if isinstance(line, LongLine):
        invalid.append((offset, too_long_reason(line.length)))
        return None
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        invalid.append((offset, f"invalid JSON: {exc}"))
        return None
    problem = record_problem(obj)
    if problem is not None:
        invalid.append((offset, problem))
        return None
    return complete(obj)  # record_problem checked it is a dict


def last_records(
    path: str | os.PathLike[str],
    n: int,
    events: set[str] | None = None,
    *,
    end: int | None = None,
) -> tuple[list[Record], list[tuple[int, str]]]:
    """The newest ``n`` complete records (of ``events``, if given), oldest first, read
    backwards (from byte ``end``, if given): the cost follows ``n``, not the file. Also the
    invalid lines met on the way,
    as (byte offset, reason); a torn final fragment is not one (it may still be written)."""
    needles = [f'"{e}"'.encode() for e in events] if events else []
    found: list[Record] = []
    invalid: list[tuple[int, str]] = []
    for offset, line in lines_backwards(path, end=end):
        if isinstance(line, LongLine):  # unread, so it may be of any event: report it
            _record_or_note(line, offset, invalid)
            continue
        if not line.strip() or (needles and not any(x in line for x in needles)):
            continue
        obj = _record_or_note(line, offset, invalid)
        if obj is None or (events and obj["event"] not in events):
            continue
        found.append(obj)
        if len(found) >= n:
            break
    found.reverse()
    return found, invalid


def records_since_step(
    path: str | os.PathLike[str], since: int, events: set[str] | None = None
) -> tuple[list[Record], list[tuple[int, str]]]:
    """Every complete record at or after step ``since`` (of ``events``, if given), oldest
    first, as a forward scan finds them, read backwards: the cost follows what lies after
    step ``since``, not the file. Steps never decrease within an attempt, but a resumed
    attempt starts again from its checkpoint's step, so an earlier attempt may hold steps
    past ``since`` too: where an attempt falls below ``since``, a byte search finds its
    ``train_begin`` and the scan goes on with the attempt before. Also returns the invalid
    lines met, as (byte offset, reason)."""
    found: list[Record] = []
    invalid: list[tuple[int, str]] = []
    end: int | None = None
    while True:
        jump: int | None = None
        for offset, line in lines_backwards(path, end=end):
            if not line.strip() and not isinstance(line, LongLine):
                continue
            obj = _record_or_note(line, offset, invalid)
            if obj is None:
                continue
            if obj["step"] >= since:
                if not events or obj["event"] in events:
                    found.append(obj)
            elif obj["event"] != "train_begin":  # the rest of this attempt is older
                if _is_first_attempt(path, obj):
                    break  # nothing before it: no search through the file
                jump = _line_start_before(path, b'"event":"train_begin"', offset)
                break
        if jump is None:
            break
        end = jump  # go on with the line before that train_begin
    found.reverse()
    invalid.reverse()
    return found, invalid


def _is_first_attempt(path: str | os.PathLike[str], rec: Record) -> bool:
    """Whether ``rec`` belongs to the attempt the file starts with (its first line is of
    the same run and attempt): then no earlier attempt exists."""
    with open(path, "rb") as f:
        head = _record_or_note(f.readline(1 << 16), 0, [])
    return head is not None and (head["run_id"], head["attempt"]) == (rec["run_id"], rec["attempt"])


def _line_start_before(path: str | os.PathLike[str], needle: bytes, end: int) -> int | None:
    """Start offset of the last line before byte ``end`` that contains ``needle`` (None if
    no line does), found with a C-speed search backwards over the mapped file."""
    with open(path, "rb") as f:
        if not os.fstat(f.fileno()).st_size:  # emptied meanwhile (mmap maps no empty file)
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            hit = mm.rfind(needle, 0, end + len(needle) - 1)  # one that starts before ``end``
            return None if hit < 0 else mm.rfind(b"\n", 0, hit) + 1


def relaunch_coming(path: str | os.PathLike[str]) -> bool:
    """Whether the journal's last attempt ended ``failed`` with restarts left, as its
    ``train_end`` says (``restarts_left``, by its launcher's relaunch rule): its launcher
    launches it again (while it still holds the run dir)."""
    end = find_last(path, "train_end")
    data = end["data"] if end is not None else {}
    return data.get("status") == "failed" and (data.get("restarts_left") or 0) > 0


def find_first(path: str | os.PathLike[str], event: str) -> Record | None:
    """The oldest complete record of ``event``, or None."""
    return next(iter_events(path, {event}), None)  # parses only the lines naming it


def find_best(
    path: str | os.PathLike[str], goal: MetricGoal, *, run_id: str | None = None
) -> BestCheckpoint | None:
    """The best checkpoint not journaled as removed and still on disk, by ``goal`` (reports
    and evaluate); of run ``run_id`` only, when given (a journal holds every run of its
    dir)."""
    ledger = CheckpointLedger(Path(path).parent)
    for rec in iter_events(path, set(CheckpointLedger.EVENTS)):  # parses only those lines
        if run_id is None or rec["run_id"] == run_id:
            ledger.add(rec)
    return ledger.best(goal, Path(path).parent)


def get_field(record: Record, dotted: str) -> Any:
    """``data.checkpoint_path`` -> record["data"]["checkpoint_path"]; a path whose first
    name is not an envelope field is looked up in ``data`` (``metrics.accuracy``). Returns
    the ``_MISSING`` sentinel if absent."""
    parts = dotted.split(".")
    if parts[0] not in record:
        parts = ["data", *parts]
    cur: Any = record
    for part in parts:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return _MISSING
    return cur


def is_missing(value: Any) -> bool:
    return value is _MISSING
