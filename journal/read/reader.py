"""Crash-tolerant journal reader.

Reads complete lines from a byte offset. A final fragment without ``\\n`` is a record still
being written: the reader stops before it and reports the offset to resume from, unless the
caller says the file is finished (then the fragment is reported as an invalid line). Invalid
lines (not JSON, not a record, fields of the wrong type: journal/record/fields.py, longer than
:data:`~journal.read.lines.MAX_LINE_BYTES`) are reported with their line number and skipped;
reading never stops on them, and costs time linear in the bytes read. Records come out complete
(journal/record/record.py: an envelope field left out has its default), unless ``as_written``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from journal.read.cursor import Cursor
from journal.read.lines import (
    MAX_LINE_BYTES,
    SNIPPET,
    Carry,
    LongLine,
    lines_backwards,
    open_for_reading,
    too_long_reason,
)
from journal.read.precheck import start_precheck
from journal.read.vouched import Vouched, vouched_lines
from journal.record.events import SCHEMA_VERSION
from journal.record.fields import record_problem
from journal.record.record import Record, complete

CHUNK_SIZE = 4 * 1024 * 1024
#: Bytes of lines parsed and checked together (:func:`parse_lines`).
SLICE_BYTES = 256 * 1024
#: A full scan's batch (:func:`iter_batches`): about 5,000 records in memory at a time
#: (4 MiB batches scanned 4 % slower: the records are cold by the time the caller uses them).
BATCH_BYTES = 1 << 20


class InvalidLine(NamedTuple):
    """A line that is not a valid record: skipped, and reported. (A named tuple, not a
    dataclass: a quarter of the cost to define, which ``status`` pays at every start.)"""

    line_no: int  # 1-based, counted from the offset/line the reader started at
    offset: int  # byte offset of the line's start
    reason: str
    snippet: bytes


@dataclass(slots=True)
class ReadBatch:
    """What one :meth:`JournalReader.read` call found."""

    records: list[Record] = field(default_factory=list)  # checked; complete unless as_written
    invalid: list[InvalidLine] = field(default_factory=list)
    offset: int = 0  # resume here next time (just past the last complete line)
    line_no: int = 0  # lines consumed so far (complete lines up to ``offset``)
    torn_tail: bool = False  # bytes after ``offset`` that are not yet a complete line
    tail_bytes: int = 0  # how many, when ``torn_tail``
    as_written: bool = False  # the records as the writer wrote them (JournalReader's doc)
    #: some record may have lacked an envelope field (filled with its default, None for a
    #: run id or a time): False promises every record was written whole
    patched: bool = False

    @property
    def cursor(self) -> Cursor:
        """Where the next read starts: just past this batch's last complete line."""
        return Cursor(self.offset, self.line_no)


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic GC while building many records: they are acyclic dicts, and the
    collections triggered by allocating them walk the growing batch (a third of scan time)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def parse_lines(lines: list[bytes], batch: ReadBatch, *, newer_version: list[int]) -> None:
    """Parse complete ``lines`` (without their newlines), the ones from ``batch``'s offset
    and line number on, into ``batch``."""
    n = len(lines)
    if not n:
        return
    # Parsed and checked a slice at a time: the records just built are still in the CPU's
    # cache when they are checked (a whole 4 MiB chunk at once ran 15-25 % slower).
    step = max(1, SLICE_BYTES * n // (sum(map(len, lines)) + n))
    for i in range(0, n, step):
        _parse_part(lines[i : i + step] if step < n else lines, batch, newer_version)


def _parse_part(lines: list[bytes], batch: ReadBatch, newer_version: list[int]) -> None:
    """Parse ``lines`` into ``batch``: all in C, checked at once (journal/read/checks.py);
    line by line only for a slice that has a bad line, so clean journals pay no per-line
    Python overhead for error handling."""
    from journal.read.checks import load_checked  # not imported by a status with nothing to read

    size = sum(map(len, lines)) + len(lines)  # its bytes, newlines included
    incomplete: list[dict[str, Any]] = []
    objs = load_checked(lines, size, incomplete)
    if objs is not None:
        for obj in () if batch.as_written else incomplete:  # rare: envelope fields left out
            complete(obj)
        batch.patched = batch.patched or bool(incomplete)
        _note_version(objs[0], newer_version)
        _note_version(objs[-1], newer_version)
        batch.records += objs
        batch.offset += size
        batch.line_no += len(lines)
        return
    _parse_slow(lines, batch, newer_version)


def _note_version(obj: dict[str, Any], newer_version: list[int]) -> None:
    v = obj.get("v", 1)
    if type(v) is int and v > SCHEMA_VERSION:
        newer_version.append(v)


def _parse_slow(lines: list[bytes], batch: ReadBatch, newer_version: list[int]) -> None:
    pos, line_no = batch.offset, batch.line_no
    batch.patched = True  # records are completed one by one here: not told apart
    for line in lines:
        line_no += 1
        start = pos
        pos += len(line) + 1
        if not line or line.isspace():
            continue
        if len(line) > MAX_LINE_BYTES:
            reason = too_long_reason(len(line))
        else:
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                reason = f"invalid JSON: {exc}"
            else:
                problem = record_problem(obj)
                if problem is None:
                    _note_version(obj, newer_version)
                    batch.records.append(obj if batch.as_written else complete(obj))
                    continue
                reason = problem
        batch.invalid.append(InvalidLine(line_no, start, reason, line[:SNIPPET]))
    batch.offset = pos
    batch.line_no = line_no


def iter_events(
    path: str | os.PathLike[str],
    events: set[str],
    *,
    holding: tuple[str, ...] = (),
    end: int | None = None,
) -> Iterator[Record]:
    """Complete records of ``events``, in file order, in bounded memory: a line is parsed
    only when it contains one of the event names (a byte test), so scanning a journal for
    its rare records costs little more than reading it. Lines over the limit are skipped
    unread. ``holding``: also the records whose line holds one of these keys (a metric's
    name, ``"accuracy"``), whatever their event; ``end``: only the lines before that byte
    offset (a line start)."""
    needles = [f'"{e}"'.encode() for e in (*events, *holding)]
    try:
        fd = open_for_reading(path)
    except FileNotFoundError:
        return
    try:
        carry, pos = Carry(), 0
        while chunk := os.pread(fd, CHUNK_SIZE if end is None else min(CHUNK_SIZE, end - pos), pos):
            pos += len(chunk)
            _, buf = carry.feed(chunk)
            for start in _lines_with(buf, len(buf), needles):
                stop = buf.index(b"\n", start)
                if stop - start > MAX_LINE_BYTES:
                    continue
                try:
                    obj = orjson.loads(buf[start:stop])
                except orjson.JSONDecodeError:
                    continue
                if (
                    type(obj) is dict
                    and (holding or obj.get("event") in events)
                    and record_problem(obj) is None
                ):
                    yield complete(obj)
    finally:
        os.close(fd)


def _lines_with(buf: bytes, end: int, needles: list[bytes]) -> list[int]:
    """Start offsets (sorted) of the lines of ``buf[:end]`` holding any needle: the search
    runs in C (``bytes.find``), Python only touches the matching lines."""
    starts: set[int] = set()
    for needle in needles:
        i = buf.find(needle, 0, end)
        while i != -1:
            line_start = buf.rfind(b"\n", 0, i) + 1
            starts.add(line_start)
            i = buf.find(needle, buf.index(b"\n", i) + 1, end)
    return sorted(starts)


def end_of_complete_lines(path: str | os.PathLike[str]) -> int:
    """Byte offset just past the last ``\\n`` (0 if none or no file): where a reader that
    wants only new records starts. Reads backwards from the end, not the whole file."""
    for offset, line in lines_backwards(path, block=64 * 1024):
        return offset + (line.length if isinstance(line, LongLine) else len(line)) + 1
    return 0


class JournalReader:
    """Incremental reader: call :meth:`read` repeatedly to follow a growing journal.

    The state to persist for resuming is its :attr:`cursor`. ``as_written``: the records
    without the envelope defaults filled in (``validate`` reports what a writer left out).
    ``vouched``: lines checked ahead, loaded as arrays (journal/read/vouched.py), the same.
    ``held``: a descriptor of the file to read, whatever the path leads to now (a follower
    across rotation, a scan checked ahead: the file the checker checks).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        offset: int = 0,
        line_no: int = 0,
        *,
        chunk_size: int = CHUNK_SIZE,
        as_written: bool = False,
        vouched: Vouched | None = None,
        held: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.held = held
        self.as_written = as_written
        self.vouched = vouched  # a checker (journal/read/precheck.py) on a big backlog
        self.offset = offset
        self.line_no = line_no
        self.chunk_size = chunk_size
        self.newer_versions: list[int] = []
        self._warned_version = False
        # A torn tail over the limit, as (its offset, bytes measured, first bytes): the next
        # read goes on measuring from there instead of reading it all again.
        self._long_tail: tuple[int, int, bytes] | None = None

    @property
    def cursor(self) -> Cursor:
        """Where the next :meth:`read` starts."""
        return Cursor(self.offset, self.line_no)

    def read(self, *, final: bool = False, max_bytes: int | None = None) -> ReadBatch:
        """Read complete records from the current offset and advance past them.

        ``final=True`` means the writer is done: a trailing fragment is reported as an
        invalid line and consumed instead of waited for. A line over the limit is reported
        as an invalid line without being loaded.
        """
        batch = ReadBatch(offset=self.offset, line_no=self.line_no, as_written=self.as_written)
        try:
            fd = self._open()
        except FileNotFoundError:
            return batch
        carry = Carry()
        vouched = self.vouched
        try:
            with no_cyclic_gc():
                size = os.fstat(fd).st_size
                limit = size if max_bytes is None else min(size, self.offset + max_bytes)
                if vouched is not None:
                    vouched.reading(limit)
                pos = self._resume_long_tail(carry, size)
                # Past ``limit`` keep reading only until one complete line has been consumed.
                while pos < size and (pos < limit or batch.offset == self.offset):
                    end = limit if pos < limit else size  # never past max_bytes unless stuck
                    chunk = os.pread(fd, min(self.chunk_size, end - pos), pos)
                    if not chunk:
                        break
                    pos += len(chunk)
                    took = vouched and vouched_lines(vouched, chunk, pos, carry, batch.offset)
                    if took:  # one record per line, none to complete: as the line path's
                        batch.records += took[0]
                        batch.offset, batch.line_no = took[1], batch.line_no + len(took[0])
                        continue
                    long, lines = carry.split(chunk)
                    if long is not None:
                        _skip(batch, long.length, too_long_reason(long.length), long.head)
                    parse_lines(lines, batch, newer_version=self.newer_versions)
        finally:
            os.close(fd)
        if carry.size and pos >= size:
            self._torn_tail(batch, carry, pos, final=final)
        self.offset, self.line_no = batch.offset, batch.line_no
        if self.newer_versions and not self._warned_version:
            self._warned_version = True
            warnings.warn(
                f"{self.path}: records of format version {max(self.newer_versions)} "
                f"(this reader knows {SCHEMA_VERSION}); unknown fields are ignored",
                stacklevel=2,
            )
        return batch

    def _open(self) -> int:
        """A descriptor of the file to read (closed after each read): the held one's copy."""
        return open_for_reading(self.path) if self.held is None else os.dup(self.held)

    def _resume_long_tail(self, carry: Carry, size: int) -> int:
        """Where to start reading: past what an earlier read measured of a torn tail over
        the limit that is still where it was, else the offset."""
        hint, self._long_tail = self._long_tail, None
        if hint is None or hint[0] != self.offset or size < hint[1]:
            return self.offset
        carry.size, carry.head = hint[1] - hint[0], hint[2]
        return hint[1]

    def _torn_tail(self, batch: ReadBatch, carry: Carry, pos: int, *, final: bool) -> None:
        """The bytes after the last newline: an invalid line once the writer is done, else
        a record still being written (remembered, when over the limit, to read on later)."""
        if final:
            reason = "torn final line (no newline)"
            if carry.too_long:
                reason = f"{reason}, {too_long_reason(carry.size)}"
            _skip(batch, carry.size - 1, reason, carry.head)  # -1: it has no newline
        else:
            batch.torn_tail, batch.tail_bytes = True, carry.size
            if carry.too_long:
                self._long_tail = (batch.offset, pos, carry.head)


def _skip(batch: ReadBatch, length: int, reason: str, head: bytes) -> None:
    """Report the ``length``-byte line at the batch's offset (and its newline) as invalid
    and move past it."""
    batch.line_no += 1
    batch.invalid.append(InvalidLine(batch.line_no, batch.offset, reason, head))
    batch.offset += length + 1


def iter_batches(
    path: str | os.PathLike[str],
    *,
    final: bool = True,
    start: int = 0,
    end: int | None = None,
    max_bytes: int = BATCH_BYTES,
    as_written: bool = False,
) -> Iterator[ReadBatch]:
    """Read a whole journal, or the lines in ``[start, end)`` (both line starts), batch by
    batch in bounded memory. Line numbers count from ``start``. With ``final=False`` a file
    that ends in a fragment gives a last batch with only ``torn_tail`` set (``as_written``:
    :class:`JournalReader`'s). A whole journal's scan is checked ahead on a spare core when
    it is big (:func:`_checked_ahead`); one of a range, maybe one of several in parallel
    (journal/read/parallel.py), is not."""
    reader = JournalReader(path, offset=start, as_written=as_written)
    with _checked_ahead(reader) if start == 0 and end is None else contextlib.nullcontext():
        while end is None or reader.offset < end:
            before = reader.offset
            room = max_bytes if end is None else min(max_bytes, end - before)
            batch = reader.read(final=final, max_bytes=room)
            if reader.offset == before:
                if batch.torn_tail:
                    yield batch
                return
            yield batch


@contextlib.contextmanager
def _checked_ahead(reader: JournalReader) -> Iterator[None]:
    """A checker process over a big backlog ahead of ``reader`` (journal/read/precheck.py,
    as a follower's), which meanwhile reads the very file it checks, held open."""
    held = checker = None
    with contextlib.suppress(OSError):  # none there: the reader says so, as always
        held = open_for_reading(reader.path)
        checker = start_precheck(held, reader.offset)
    if checker is not None:  # else the path is opened at each read, as always
        reader.held, reader.vouched = held, checker
    try:
        yield
    finally:
        if checker is not None:
            checker.close()
        if held is not None:
            os.close(held)


def read_all(path: str | os.PathLike[str], *, final: bool = True) -> ReadBatch:
    """Read a whole journal at once: all records and all invalid lines."""
    return JournalReader(path).read(final=final)


def iter_records(path: str | os.PathLike[str], *, final: bool = True) -> Iterator[Record]:
    """Yield every valid record of a journal, in file order."""
    for batch in iter_batches(path, final=final):
        yield from batch.records
