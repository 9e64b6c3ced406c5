"""Lines vouched for, loaded as JSON arrays: the reader's fast path over a backlog checked
ahead (journal/read/precheck.py).

Loading many complete lines as one JSON array (``[`` + the lines joined with commas +
``]``) costs no more than loading them one by one, and needs neither a split into lines
nor the record check (journal/read/checks.py) when every line was already checked, by the
reader's own rules, to be a record the line path takes as it loads it. Only then: joined
with commas, two invalid lines can load as one valid object (``{"a":[{}`` then ``{}]}``)
and one as two (``{...},{...}``); lines that each hold one object give exactly their
records. The reader (journal/read/reader.py) asks :class:`Vouched` about each chunk it
reads, and takes a chunk this way only when all of it was vouched for: the line path sees
the same chunks, and so says the same things, with or without a checker.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from journal.read.lines import Carry

#: Bytes of lines loaded as one array: 32-64 KiB pieces loaded a 1M-record journal 5-15 %
#: faster than 256 KiB or 1 MiB ones (the piece and its records stay in the CPU's cache).
ARRAY_BYTES = 64 * 1024


class Vouched(Protocol):
    """Byte ranges of a journal whose lines were checked ahead (journal/read/precheck.py)."""

    def covers(self, start: int, end: int) -> bool:
        """Whether every line of ``[start, end)`` (both line starts) is vouched for."""

    def reading(self, limit: int) -> None:
        """The reader is about to read up to byte ``limit`` by itself (a hint)."""


def vouched_lines(
    vouched: Vouched, chunk: bytes, pos: int, carry: Carry, offset: int
) -> tuple[list[Any], int] | None:
    """The records of the complete lines of ``chunk`` (read up to byte ``pos``; ``carry``
    holds the line begun before it, at ``offset``), and the offset past them, when all of
    them are vouched for; ``carry`` then holds what follows the last newline. None, with
    nothing changed, when not: the caller reads the chunk line by line."""
    cut = chunk.rfind(b"\n") + 1
    at = pos - len(chunk)  # the chunk's offset
    if not cut or carry.too_long or at - carry.size != offset:
        return None
    if not vouched.covers(offset, at + cut):
        return None
    first, start = None, 0
    if carry.size:  # the line begun in an earlier chunk
        start = chunk.index(b"\n") + 1
        first = b"".join([*carry.parts, chunk[: start - 1]])
    records = _load(chunk, start, cut, first)
    if records is None:
        return None
    carry.reset()
    carry.add(chunk[cut:])
    return records, at + cut


def _load(chunk: bytes, start: int, end: int, first: bytes | None) -> list[Any] | None:
    """The records of the lines ``chunk[start:end]`` (``end`` just past a newline), after
    the one in ``first``, loaded :data:`ARRAY_BYTES` at a time. None if they do not load
    (changed since they were checked)."""
    try:
        records = [] if first is None else [orjson.loads(first)]
        while start < end:
            cut = end
            if end - start > ARRAY_BYTES:
                cut = chunk.rfind(b"\n", start, start + ARRAY_BYTES) + 1
                if cut <= start:  # one line longer than a piece
                    cut = chunk.index(b"\n", start) + 1
            # two copies of the piece, not four: each one streams through the CPU's cache
            piece = b"".join((b"[", memoryview(chunk)[start : cut - 1], b"]"))
            records += orjson.loads(piece.replace(b"\n", b","))
            start = cut
    except orjson.JSONDecodeError:
        return None
    return records
