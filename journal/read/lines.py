"""Splitting a journal into lines, forwards and backwards, in time linear in the bytes read
and in memory bounded by :data:`MAX_LINE_BYTES`.

A line is built from the blocks it spans by one join when it is complete, never by growing
a buffer block after block (which copies the line again for every block: a 50 MB torn tail
cost 20 s that way). A line longer than the limit (a runaway record, a file full of NUL
bytes) is never held in memory, only measured; readers report it as invalid.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from journal.record.events import AFTER_END_EVENTS

try:  # CPython's own SHA-1, the same digest: hashlib loads OpenSSL (2-3 ms of `status`)
    from _sha1 import sha1
except ImportError:  # an interpreter built without it
    from hashlib import sha1

#: A line longer than this is invalid and is not loaded (records are a few KB at most).
MAX_LINE_BYTES = 16 << 20
SNIPPET = 80  # bytes of an invalid line kept to show it
_MEASURE_BLOCK = 4 << 20  # read size while only measuring a line over the limit
#: A journal's first line (its train_begin) is well under this; a longer one gives no identity.
FINGERPRINT_BYTES = 4096


def open_for_reading(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor that never blocks on open: a FIFO (or device) planted where a
    journal should be reads as empty instead of hanging the reader."""
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)


def first_line_fingerprint(path: str | os.PathLike[str]) -> str | None:
    """Which journal is at ``path``: 16 hex digits of the sha1 of its first line, so a reader
    tells a journal replaced since it last looked (the index, the watcher's cursor) from the
    same one grown. None when there is no complete first line in its first
    :data:`FINGERPRINT_BYTES`, when it cannot be opened, or is not a regular file: a symlink
    is never followed (the writer refuses a symlinked journal, so one is never ours) and a
    FIFO never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # missing, unreadable, or a symlink (ELOOP)
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        first = os.pread(fd, FINGERPRINT_BYTES, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    nl = first.find(b"\n")
    return sha1(first[: nl + 1]).hexdigest()[:16] if nl >= 0 else None


def too_long_reason(length: int) -> str:
    """Why a line over the limit is invalid (the same words from every reader)."""
    return f"line too long ({length} bytes, limit {MAX_LINE_BYTES >> 20} MiB): not read"


class LongLine(bytes):
    """Stands in for a line over the limit in :func:`lines_backwards`: empty bytes, so a
    caller that skips blank lines skips it, with the line's ``length`` and first bytes."""

    length: int
    head: bytes

    def __new__(cls, length: int, head: bytes) -> LongLine:
        obj = super().__new__(cls, b"")
        obj.length, obj.head = length, head
        return obj


class Carry:
    """The start of a line that continues in a later block, kept as pieces (joined once,
    when the line is complete) and dropped once it is over ``limit`` bytes: then only its
    length and first bytes are kept."""

    __slots__ = ("head", "limit", "parts", "size")

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.head = b""

    @property
    def too_long(self) -> bool:
        return self.size > self.limit

    def add(self, piece: bytes) -> None:
        if not piece:
            return
        if len(self.head) < SNIPPET:
            self.head = (self.head + piece[:SNIPPET])[:SNIPPET]
        self.size += len(piece)
        if self.size > self.limit:
            self.parts = []  # measured from now on, never loaded
        else:
            self.parts.append(piece)

    def feed(self, chunk: bytes) -> tuple[LongLine | None, bytes]:
        """Take the next ``chunk`` of the file. Returns the line over the limit that ended
        in it, if one did, and the complete lines that follow (one buffer ending with a
        newline, the line carried so far first; empty when the chunk held no newline). What
        comes after the chunk's last newline is kept for the next call."""
        cut = chunk.rfind(b"\n") + 1
        if not cut:
            self.add(chunk)
            return None, b""
        long = None
        if not self.size:
            buf = chunk[:cut] if cut < len(chunk) else chunk
        else:
            nl = chunk.index(b"\n")
            if self.size + nl > self.limit:
                long = LongLine(self.size + nl, (self.head + chunk[:SNIPPET])[:SNIPPET])
                self.reset()
                buf = chunk[nl + 1 : cut]
            else:
                buf = self.take(chunk[:cut])
        self.add(chunk[cut:])
        return long, buf

    def split(self, chunk: bytes) -> tuple[LongLine | None, list[bytes]]:
        """:meth:`feed`, with the complete lines handed out as a list (without their
        newlines): one ``bytes.split`` of the chunk, which is never copied whole (a reader
        that parses every line needs them apart anyway)."""
        lines = chunk.split(b"\n")
        rest = lines.pop()  # after the last newline: the start of a line to come
        long = None
        if lines and self.size:
            first = lines[0]
            if self.size + len(first) > self.limit:
                long = LongLine(self.size + len(first), (self.head + first[:SNIPPET])[:SNIPPET])
                self.reset()
                del lines[0]
            else:
                lines[0] = self.take(first)
        self.add(rest)
        return long, lines

    def take(self, rest: bytes = b"") -> bytes:
        """The line so far followed by ``rest``, and start a new one (not for a line that
        is too long)."""
        out = b"".join([*self.parts, rest]) if self.parts else rest
        self.reset()
        return out

    def reset(self) -> None:
        self.parts, self.size, self.head = [], 0, b""


def lines_backwards(
    path: str | os.PathLike[str],
    *,
    block: int = 1 << 20,
    include_tail: bool = False,
    end: int | None = None,
    max_line: int = MAX_LINE_BYTES,
) -> Iterator[tuple[int, bytes]]:
    """``(offset, line)`` for each line from the end of the file (or from byte ``end``)
    towards its start, without the newline. Text after the last newline (a torn tail) is
    yielded only with ``include_tail``. A line over ``max_line`` bytes comes as a
    :class:`LongLine`. Reads ``block`` bytes at a time, so stopping early costs O(what was
    read), not O(file), and each byte is read once. A missing file yields nothing."""
    try:
        fd = open_for_reading(path)
    except FileNotFoundError:
        return
    try:
        size = os.fstat(fd).st_size
        end = size if end is None else min(end, size)
        later: list[bytes] = []  # pieces of the line being read, from its end backwards
        held = 0  # bytes of that line met so far
        head = b""  # its first bytes so far
        tail_pending = True  # the piece that ends at ``end`` is still ahead
        pos = end
        while pos > 0:
            # inside a line over the limit only its start is wanted: read in big blocks
            start = max(0, pos - (block if held <= max_line else max(block, _MEASURE_BLOCK)))
            buf = os.pread(fd, pos - start, start)
            if len(buf) < pos - start:  # the file shrank under us: stop where it ends
                return
            if start > 0 and b"\n" not in buf:  # all of it inside one line (memchr: fast)
                held += len(buf)
                head = (buf[:SNIPPET] + head)[:SNIPPET]
                if held > max_line:
                    later = []  # measured from now on, never loaded
                else:
                    later.append(buf)
                pos = start
                continue
            # pieces[-1] completes the line held so far; pieces[0] ends one that begins in
            # an earlier block (unless this block starts the file); the rest are whole.
            pieces = buf.split(b"\n")
            at = pos - len(pieces[-1])
            done = [(at, _line(pieces[-1], later, held, head, max_line))]
            for piece in reversed(pieces[1:-1] if start > 0 else pieces[:-1]):
                at -= len(piece) + 1
                done.append((at, _line(piece, [], 0, b"", max_line)))
            later, held, head = [], 0, b""
            if start > 0:
                later, held, head = [pieces[0]], len(pieces[0]), pieces[0][:SNIPPET]
            for offset, line in done:
                if tail_pending:
                    tail_pending = False
                    if not include_tail or not (line or isinstance(line, LongLine)):
                        continue
                yield offset, line
            pos = start
    finally:
        os.close(fd)


def _line(first: bytes, later: list[bytes], held: int, head: bytes, max_line: int) -> bytes:
    """A complete line from its first piece and the ``later`` ones (kept last first)."""
    length = len(first) + held
    if length > max_line:
        return LongLine(length, (first[:SNIPPET] + head)[:SNIPPET])
    return first + b"".join(reversed(later)) if later else first


def next_line_start(fd: int, pos: int, size: int, block: int = 1 << 20) -> int:
    """The offset just past the first newline at or after ``pos`` (``size`` if none),
    found in bounded memory."""
    while pos < size:
        buf = os.pread(fd, min(block, size - pos), pos)
        if not buf:
            break
        nl = buf.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(buf)
    return size


@dataclass(frozen=True)
class Tail:
    """The end of a journal, read backwards once by one rule: a record is a line that
    parses as an object with an integer ``seq`` (as written: unchecked, not completed).

    ``last``: the last record (the writer's next ``seq`` and position, the journal's run);
    ``trainer``: the last one that is not one of :data:`AFTER_END_EVENTS` (late reports and
    the like do not make an ended run a running one)."""

    last: dict[str, Any] | None = None
    trainer: dict[str, Any] | None = None

    @property
    def run_id(self) -> str | None:
        """The run the journal is about now: its last record's (None: no record)."""
        run_id = self.last.get("run_id") if self.last else None
        return run_id if isinstance(run_id, str) else None

    @property
    def ended(self) -> bool:
        """Whether the journal's last attempt ended: its last trainer record is ``train_end``."""
        return self.trainer is not None and self.trainer.get("event") == "train_end"


def read_tail(path: str | os.PathLike[str], *, torn: bool = False, end: int | None = None) -> Tail:
    """The :class:`Tail` of a journal (empty when there is none), read backwards until
    both are found: the cost follows the late records, not the journal. ``torn``: a torn
    final fragment counts if it parses (for the writer, which terminates it and must not
    repeat its ``seq``). ``end``: the journal as it was up to that byte."""
    last = None
    for _, line in lines_backwards(path, block=64 * 1024, include_tail=torn, end=end):
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # an invalid line, or blank: the readers skip it too
        if not isinstance(obj, dict) or not isinstance(obj.get("seq"), int):
            continue
        last = last or obj
        if obj.get("event") not in AFTER_END_EVENTS:
            return Tail(last, obj)
    return Tail(last)
