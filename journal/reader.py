"""Crash-tolerant journal reader.

Reads complete lines from a byte offset. A final fragment without ``\\n`` is a record still
being written: the reader stops before it and reports the offset to resume from, unless the
caller says the file is finished (then the fragment is reported as an invalid line). Invalid
lines are reported with their line number and skipped; reading never stops on them.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from journal.events import SCHEMA_VERSION

CHUNK_SIZE = 4 * 1024 * 1024
_SNIPPET = 80
_EMPTY: dict[str, Any] = {}


@dataclass(frozen=True, slots=True)
class InvalidLine:
    """A line that is not a valid record: skipped, and reported."""

    line_no: int  # 1-based, counted from the offset/line the reader started at
    offset: int  # byte offset of the line's start
    reason: str
    snippet: bytes


@dataclass(slots=True)
class ReadBatch:
    """What one :meth:`JournalReader.read` call found."""

    records: list[dict[str, Any]] = field(default_factory=list)
    invalid: list[InvalidLine] = field(default_factory=list)
    offset: int = 0  # resume here next time (just past the last complete line)
    line_no: int = 0  # lines consumed so far (complete lines up to ``offset``)
    torn_tail: bool = False  # bytes after ``offset`` that are not yet a complete line


def record_problem(obj: Any) -> str | None:
    """Cheap envelope check: the reason an object is not a record, or None when it is."""
    if type(obj) is not dict:
        return "not a JSON object"
    seq = obj.get("seq")
    if type(seq) is not int or seq < 0:
        return "missing or invalid 'seq'"
    if type(obj.get("event")) is not str:
        return "missing or invalid 'event'"
    if type(obj.get("data", {})) is not dict:
        return "'data' is not an object"
    return None


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


def parse_lines(
    buf: bytes, offset: int, line_no: int, batch: ReadBatch, *, newer_version: list[int]
) -> None:
    """Parse the complete lines of ``buf`` (which must end with ``\\n``) into ``batch``."""
    lines = buf.split(b"\n")
    lines.pop()  # the empty piece after the final newline
    # Fast path: parse every line in C; fall back to line-by-line only for a chunk that has
    # a bad line, so clean journals pay no per-line Python overhead for error handling.
    try:
        objs = list(map(orjson.loads, lines))
    except orjson.JSONDecodeError:
        objs = None
    if objs is not None and _all_records(objs):
        if objs:
            _note_version(objs[0], newer_version)
            _note_version(objs[-1], newer_version)
        batch.records.extend(objs)
        batch.offset = offset + len(buf)
        batch.line_no = line_no + len(lines)
        return
    _parse_slow(lines, offset, line_no, batch, newer_version)


def _all_records(objs: list[Any]) -> bool:
    """Whether :func:`record_problem` finds nothing in any of ``objs`` (inlined: this runs
    for every record of every scan)."""
    for o in objs:
        if not (
            type(o) is dict
            and type(o.get("seq")) is int
            and o["seq"] >= 0
            and type(o.get("event")) is str
            and type(o.get("data", _EMPTY)) is dict
        ):
            return False
    return True


def _note_version(obj: dict[str, Any], newer_version: list[int]) -> None:
    v = obj.get("v", 1)
    if type(v) is int and v > SCHEMA_VERSION:
        newer_version.append(v)


def _parse_slow(
    lines: list[bytes], offset: int, line_no: int, batch: ReadBatch, newer_version: list[int]
) -> None:
    pos = offset
    for line in lines:
        line_no += 1
        start = pos
        pos += len(line) + 1
        if not line or line.isspace():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            batch.invalid.append(
                InvalidLine(line_no, start, f"invalid JSON: {exc}", line[:_SNIPPET])
            )
            continue
        reason = record_problem(obj)
        if reason is None:
            _note_version(obj, newer_version)
            batch.records.append(obj)
        else:
            batch.invalid.append(InvalidLine(line_no, start, reason, line[:_SNIPPET]))
    batch.offset = pos
    batch.line_no = line_no


def lines_backwards(
    path: str | os.PathLike[str],
    *,
    block: int = 1 << 20,
    include_tail: bool = False,
    end: int | None = None,
) -> Iterator[tuple[int, bytes]]:
    """``(offset, line)`` for each line from the end of the file (or from byte ``end``)
    towards its start, without the newline. Text after the last newline (a torn tail) is
    yielded only with ``include_tail``. Reads ``block`` bytes at a time, so stopping early
    costs O(what was read), not O(file). A missing file yields nothing."""
    try:
        f = open(path, "rb")  # noqa: SIM115 (a generator: closed by the with below)
    except FileNotFoundError:
        return
    with f:
        size = f.seek(0, os.SEEK_END)
        end = size if end is None else min(end, size)
        carry = b""  # the start of a line whose beginning lies in an earlier block
        tail_pending = True  # the piece that ends at the end of the file is still ahead
        while end > 0:
            start = max(0, end - block)
            f.seek(start)
            buf = f.read(end - start) + carry
            pieces = buf.split(b"\n")
            carry = pieces.pop(0) if start > 0 else b""
            pos = start + len(carry) + 1 if start > 0 else 0
            offsets = []
            for piece in pieces:
                offsets.append(pos)
                pos += len(piece) + 1
            for i in range(len(pieces) - 1, -1, -1):
                if tail_pending:
                    tail_pending = False
                    if include_tail and pieces[i]:
                        yield offsets[i], pieces[i]
                    continue
                yield offsets[i], pieces[i]
            end = start


def last_record(
    path: str | os.PathLike[str], *, include_tail: bool = False
) -> dict[str, Any] | None:
    """The last parseable record, read backwards (O(1) in the file's size). With
    ``include_tail`` a torn final fragment counts if it parses (the writer terminates it and
    must not repeat its seq)."""
    for _, line in lines_backwards(path, block=64 * 1024, include_tail=include_tail):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("seq"), int):
            return obj
    return None


def iter_events(path: str | os.PathLike[str], events: set[str]) -> Iterator[dict[str, Any]]:
    """Complete records of ``events``, in file order, in bounded memory: a line is parsed
    only when it contains one of the event names (a byte test), so scanning a journal for
    its rare records costs little more than reading it."""
    needles = [f'"{e}"'.encode() for e in events]
    try:
        f = open(path, "rb")  # noqa: SIM115 (a generator: closed by the with below)
    except FileNotFoundError:
        return
    with f:
        carry = b""
        while chunk := f.read(CHUNK_SIZE):
            buf = carry + chunk
            cut = buf.rfind(b"\n") + 1
            carry = buf[cut:]
            for start in _lines_with(buf, cut, needles):
                line = buf[start : buf.index(b"\n", start)]
                try:
                    obj = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if type(obj) is dict and obj.get("event") in events and record_problem(obj) is None:
                    yield obj


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
        return offset + len(line) + 1
    return 0


class JournalReader:
    """Incremental reader: call :meth:`read` repeatedly to follow a growing journal.

    The state to persist for resuming is ``(offset, line_no)``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        offset: int = 0,
        line_no: int = 0,
        *,
        chunk_size: int = CHUNK_SIZE,
    ) -> None:
        self.path = Path(path)
        self.offset = offset
        self.line_no = line_no
        self.chunk_size = chunk_size
        self.newer_versions: list[int] = []
        self._warned_version = False

    def read(self, *, final: bool = False, max_bytes: int | None = None) -> ReadBatch:
        """Read complete records from the current offset and advance past them.

        ``final=True`` means the writer is done: a trailing fragment is reported as an
        invalid line and consumed instead of waited for.
        """
        batch = ReadBatch(offset=self.offset, line_no=self.line_no)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return batch
        try:
            with no_cyclic_gc():
                size = os.fstat(fd).st_size
                limit = size if max_bytes is None else min(size, self.offset + max_bytes)
                pos = self.offset
                carry = b""
                # Past ``limit`` keep reading only until one complete line has been consumed.
                while pos < size and (pos < limit or batch.offset == self.offset):
                    end = limit if pos < limit else size  # never past max_bytes unless stuck
                    chunk = os.pread(fd, min(self.chunk_size, end - pos), pos)
                    if not chunk:
                        break
                    pos += len(chunk)
                    buf = carry + chunk if carry else chunk
                    cut = buf.rfind(b"\n") + 1
                    if cut:
                        parse_lines(
                            buf[:cut],
                            batch.offset,
                            batch.line_no,
                            batch,
                            newer_version=self.newer_versions,
                        )
                    carry = buf[cut:]
        finally:
            os.close(fd)
        if carry and pos >= size:
            if final:
                batch.line_no += 1
                batch.invalid.append(
                    InvalidLine(
                        batch.line_no,
                        batch.offset,
                        "torn final line (no newline)",
                        carry[:_SNIPPET],
                    )
                )
                batch.offset += len(carry)
            else:
                batch.torn_tail = True
        self.offset, self.line_no = batch.offset, batch.line_no
        if self.newer_versions and not self._warned_version:
            self._warned_version = True
            warnings.warn(
                f"{self.path}: records of format version {max(self.newer_versions)} "
                f"(this reader knows {SCHEMA_VERSION}); unknown fields are ignored",
                stacklevel=2,
            )
        return batch


def iter_batches(
    path: str | os.PathLike[str],
    *,
    final: bool = True,
    start: int = 0,
    end: int | None = None,
    max_bytes: int = CHUNK_SIZE,
) -> Iterator[ReadBatch]:
    """Read a whole journal, or the lines in ``[start, end)`` (both line starts), batch by
    batch in bounded memory. Line numbers count from ``start``. With ``final=False`` a file
    that ends in a fragment gives a last batch with only ``torn_tail`` set."""
    reader = JournalReader(path, offset=start)
    while end is None or reader.offset < end:
        before = reader.offset
        room = max_bytes if end is None else min(max_bytes, end - before)
        batch = reader.read(final=final, max_bytes=room)
        if reader.offset == before:
            if batch.torn_tail:
                yield batch
            return
        yield batch


def read_all(path: str | os.PathLike[str], *, final: bool = True) -> ReadBatch:
    """Read a whole journal at once: all records and all invalid lines."""
    return JournalReader(path).read(final=final)


def iter_records(path: str | os.PathLike[str], *, final: bool = True) -> Iterator[dict[str, Any]]:
    """Yield every valid record of a journal, in file order."""
    for batch in iter_batches(path, final=final):
        yield from batch.records
