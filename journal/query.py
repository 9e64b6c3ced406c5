"""Fast lookups for scripts: the first or last record of an event, and field extraction.

``last`` scans the file backwards in blocks and only parses lines that contain the event
name, so "newest checkpoint path" on a journal of millions of records costs milliseconds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from journal.reader import JournalReader

_BLOCK = 1 << 20
_MISSING = object()


def _match(line: bytes, needle: bytes, event: str) -> dict[str, Any] | None:
    if needle not in line:
        return None
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is dict and obj.get("event") == event and type(obj.get("seq")) is int:
        return obj
    return None


def _lines_backwards(path: Path) -> Iterator[bytes]:
    """Complete lines from the end of the file to its start (a torn tail is skipped)."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        partial = b""
        first_block = True
        while end > 0:
            start = max(0, end - _BLOCK)
            f.seek(start)
            buf = f.read(end - start) + partial
            lines = buf.split(b"\n")
            partial = lines[0] if start > 0 else b""
            body = lines[1:] if start > 0 else lines
            if first_block:
                body = body[:-1]  # text after the last newline: torn or empty
                first_block = False
            yield from reversed(body)
            end = start
        if partial:
            yield partial


def find_last(path: str | os.PathLike[str], event: str) -> dict[str, Any] | None:
    """The newest complete record of ``event``, or None."""
    needle = f'"{event}"'.encode()
    for line in _lines_backwards(Path(path)):
        rec = _match(line, needle, event)
        if rec is not None:
            return rec
    return None


def find_first(path: str | os.PathLike[str], event: str) -> dict[str, Any] | None:
    """The oldest complete record of ``event``, or None."""
    reader = JournalReader(path)
    while True:
        before = reader.offset
        batch = reader.read(max_bytes=_BLOCK * 4)
        for rec in batch.records:
            if rec.get("event") == event:
                return rec
        if reader.offset == before:
            return None


def get_field(record: dict[str, Any], dotted: str) -> Any:
    """``data.checkpoint_path`` -> record["data"]["checkpoint_path"]; a bare name is looked
    up in the envelope first, then in ``data``. Returns ``_MISSING`` sentinel if absent."""
    parts = dotted.split(".")
    if len(parts) == 1 and parts[0] not in record:
        parts = ["data", parts[0]]
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
