"""A journal's backlog checked ahead of its reader, in a second process.

Reading a long journal costs a reader, per line, ``orjson.loads``, the record check
(journal/read/checks.py) and a split into lines; loading many complete lines as one JSON
array costs no more than loading them one by one, and neither the split nor the check.
That is only safe for lines known to hold one valid record each (journal/read/vouched.py).
So a checker process runs ahead of the reader over a big backlog, on another core, and
vouches for the pieces in which every line is a record the line path takes as it loads it
(:func:`vouchable`: the reader's own check, not a copy of its rules); the reader loads
those lines as arrays (:class:`~journal.read.reader.JournalReader`'s ``vouched``) and
checks the rest itself, as always. The checker never decides what is invalid and the
reader never waits for it: a checker slow to start, behind, killed or crashed only leaves
more for the reader to check, never a different result.

The checker reads the very file the reader holds (its descriptor is passed: a journal
replaced at the path meanwhile is not what gets vouched for), over ``[start, end)``: the
reader's offset and the end of the file's complete lines when the backlog was seen. It
says ``START END`` on its stdout for each vouched piece; the reader takes those in between
its chunks, never waiting (a thread woken for each would have the reader hand it the GIL,
and wait for it to be scheduled on a busy machine). The reader says on the checker's stdin
how far each read goes: a checker the reader overtook goes on well past it rather than
check what the reader reads by itself. The checker runs at the lowest priority (a spare
core's work, never taken from the reader or anyone else), and ends at ``end``, when killed
(:meth:`Precheck.close`), or by itself once its parent is gone (its stdin at an end, its
stdout broken, another parent), looked for at every piece.

Started only where it pays (:func:`start_precheck`): a backlog of :data:`MIN_BACKLOG` bytes
or more, and two CPU cores or more for this process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import weakref
from operator import itemgetter
from typing import Any

#: The smallest backlog given a checker: 16 MiB (about 30,000 records) takes the reader about
#: 0.1 s by itself, what the checker takes to start (an interpreter and its imports): under
#: that it would come too late to vouch for anything.
MIN_BACKLOG = 16 << 20
#: The checker's piece: vouched for as a whole, said in one line (256 KiB pieces had the
#: reader find 70-75 % of its 1 MiB chunks vouched for, 1 MiB ones 45-65 %).
PIECE_BYTES = 256 << 10
#: How far past the reader a checker the reader overtook goes on: the reader reads that much
#: by itself, meanwhile the checker gets ahead for a long stretch (a short lead has the two
#: meet again and again, and each meeting wastes a piece of checking).
LEAD_BYTES = 8 << 20
#: The checker's module, run by name (:func:`main`).
MODULE = "journal.read.precheck"
_VERSION = itemgetter("v")

_live: weakref.WeakSet[Precheck] = weakref.WeakSet()


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def start_precheck(fd: int, start: int, *, min_backlog: int = MIN_BACKLOG) -> Precheck | None:
    """A checker over the complete lines from ``start`` (a line start) to the end of the
    file open as ``fd``, when that backlog is ``min_backlog`` bytes or more and this
    process has a core to spare for it: one checker per core beyond the first (a page
    server following many big runs starts no more); else None (also when it cannot be
    started)."""
    min_backlog = max(min_backlog, 1)
    try:
        size = os.fstat(fd).st_size
        if size - start < min_backlog or len(_live) >= usable_cores() - 1:
            return None
        end = _last_line_end(fd, size)
    except OSError:
        return None
    if end - start < min_backlog:
        return None
    try:
        return Precheck(fd, start, end)
    except (OSError, ValueError):  # none to spare, no interpreter: the reader checks it all
        return None


def _last_line_end(fd: int, size: int, window: int = 1 << 20) -> int:
    """Just past the last newline before ``size``; ``size`` when there is none in the last
    ``window`` bytes (a torn line that long is never vouched for anyway)."""
    at = max(0, size - window)
    nl = os.pread(fd, size - at, at).rfind(b"\n")
    return at + nl + 1 if nl >= 0 else size


class Precheck:
    """A checker process over ``[start, end)`` of the file open as ``fd`` (module doc), and
    what it vouched for so far: a :class:`~journal.read.vouched.Vouched` for the reader.
    :meth:`close` it when done; it never blocks the reader."""

    def __init__(
        self,
        fd: int,
        start: int,
        end: int,
        *,
        piece: int = PIECE_BYTES,
        lead: int = LEAD_BYTES,
    ) -> None:
        import subprocess  # here, not at import: most readers never start one
        import threading

        self.start, self.end = start, end
        isolate = ["-P"] if sys.version_info >= (3, 11) else []  # not the cwd's modules
        self._proc = subprocess.Popen(  # no fork of this (threaded) process: a new interpreter
            [sys.executable, *isolate, "-m", MODULE, *map(str, (fd, start, end, piece, lead))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            pass_fds=(fd,),
            start_new_session=True,  # a Ctrl-C is the watcher's to handle, not the checker's
            bufsize=0,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._to, self._from = self._proc.stdin, self._proc.stdout
        os.set_blocking(self._to.fileno(), False)  # a hint never waits
        os.set_blocking(self._from.fileno(), False)  # nor does a look at the verdicts
        self._rest = b""  # the start of a verdict line not read whole yet
        self._spans: list[list[int]] = []  # vouched [s, e), merged, in file order
        self._last = start  # where the last verdict ended
        self._told = 0
        # Reaps the checker when it exits (no zombie, whoever reads or not); waiting in
        # waitpid, it takes no part in reading (the verdicts: module doc).
        threading.Thread(target=self._proc.wait, name="journal-precheck", daemon=True).start()
        _live.add(self)

    @property
    def pid(self) -> int:
        """The checker's process id."""
        return self._proc.pid

    @property
    def running(self) -> bool:
        """Whether the checker is still at work (it ends at ``end``)."""
        return self._proc.poll() is None

    def covers(self, start: int, end: int) -> bool:
        """Whether every line of ``[start, end)`` (line starts) has been vouched for.
        Asked with a ``start`` that never goes back: the spans before it are dropped."""
        spans = self._spans
        for hear in (False, True):  # the verdicts heard so far, most often enough
            if hear:
                self._hear()
            while spans and spans[0][1] <= start:
                del spans[0]
            if spans and spans[0][0] <= start and end <= spans[0][1]:
                return True
        return False

    def reading(self, limit: int) -> None:
        """Tell the checker the reader goes up to ``limit`` now (it skips past), unless
        it has vouched for that far already (a hint per read costs a write)."""
        if limit <= self._told or self._to.closed or self._last >= limit:
            return
        self._told = limit
        with contextlib.suppress(OSError):  # full (it is busy) or gone: only a hint
            os.write(self._to.fileno(), b"%d\n" % limit)

    def close(self) -> None:
        """Stop the checker (if still running) and let go of its pipes; no zombie left."""
        _live.discard(self)
        for pipe in (self._to, self._from):
            with contextlib.suppress(OSError):
                pipe.close()
        if self._proc.returncode is None:
            with contextlib.suppress(OSError):
                self._proc.kill()
            self._proc.wait()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _hear(self) -> None:
        """Take in the verdicts said since the last look, without waiting for any."""
        if self._from.closed:
            return
        said: list[bytes] = []
        try:
            while data := os.read(self._from.fileno(), 1 << 16):
                said.append(data)
            ended = True  # the checker is done (or gone)
        except BlockingIOError:
            ended = False
        except OSError:
            ended = True
        if said:
            *lines, self._rest = (self._rest + b"".join(said)).split(b"\n")
            spans = self._spans
            for line in lines:
                try:
                    s, e = map(int, line.split())
                except ValueError:
                    s = e = -1
                if not self._last <= s < e <= self.end:  # not the checker's words
                    spans.clear()  # believe none of them
                    ended = True
                    break
                if spans and spans[-1][1] == s:
                    spans[-1][1] = e
                else:
                    spans.append([s, e])
                self._last = e
        if ended:
            self._from.close()


@atexit.register
def _stop_all() -> None:
    """At interpreter exit: no checker outlives the process that started it."""
    for precheck in list(_live):
        with contextlib.suppress(Exception):
            precheck.close()


# -- the checker process ----------------------------------------------------------------


def vouchable(lines: list[bytes]) -> bool:
    """Whether the line path takes each of ``lines`` (complete, without their newlines) as
    exactly the record it loads to: all valid records by its own check
    (:func:`~journal.read.checks.load_checked`: no blank line, none over the limit), none
    lacking an envelope field (completed there) nor of a newer format version (noted
    there). What the checker vouches for: a reader may load such lines as one JSON array
    (journal/read/vouched.py)."""
    from journal.read.checks import load_checked
    from journal.record.events import SCHEMA_VERSION

    incomplete: list[dict[str, Any]] = []
    objs = load_checked(lines, sum(map(len, lines)) + len(lines), incomplete)
    if not objs or incomplete:
        return False
    # every envelope field present (none incomplete), ``v`` an int (records_ok)
    return max(map(_VERSION, objs)) <= SCHEMA_VERSION


def check(fd: int, start: int, end: int, piece: int = PIECE_BYTES, lead: int = LEAD_BYTES) -> None:
    """The checker: vouch for the pieces of ``[start, end)`` of ``fd`` whose lines all pass
    :func:`vouchable`, one ``START END`` line each on stdout; once the reader (it says on
    stdin how far it reads) is past, on from ``lead`` bytes beyond it. Returns once done,
    or once the parent is gone."""
    import gc

    gc.disable()  # acyclic records, freed piece by piece
    with contextlib.suppress(OSError):
        os.nice(19)  # a spare core's work: never taken from the reader or anyone else
    parent = os.getppid()
    os.set_blocking(0, False)
    heard, ahead = b"", 0
    pos, midline = start, False  # midline: ``pos`` is inside a line, on from its end
    while pos < end:  # a piece at a time: a parent gone is seen within one
        try:
            while news := os.read(0, 4096):
                heard += news
            return  # stdin at its end: the parent let go of us, or is gone
        except BlockingIOError:
            pass
        if os.getppid() != parent:
            return
        if b"\n" in heard:
            said, heard = heard.rsplit(b"\n", 1)
            with contextlib.suppress(ValueError):
                ahead = max(ahead, int(said.rsplit(b"\n", 1)[-1]))
        skip_to = min(ahead + lead, end) - 1
        if ahead > pos and skip_to > pos:  # the reader is past us: on well after it,
            pos, midline = skip_to, True  # from the first line start after ``skip_to``
            continue
        want = min(piece, end - pos)
        buf = os.pread(fd, want, pos)
        if len(buf) < want:
            return  # shorter than it was (truncated): vouch for nothing more
        if midline:
            nl = buf.find(b"\n")
            pos, midline = (pos + want, True) if nl < 0 else (pos + nl + 1, False)
            continue
        cut = buf.rfind(b"\n") + 1
        if not cut:  # a line longer than a piece: left to the reader
            pos, midline = pos + want, True
            continue
        lines = buf[:cut].split(b"\n")
        lines.pop()
        if vouchable(lines):
            try:
                os.write(1, b"%d %d\n" % (pos, pos + cut))
            except OSError:  # nobody reads us any more
                return
        pos += cut


def main(argv: list[str] | None = None) -> int:
    """``python -m journal.read.precheck FD START END [PIECE [LEAD]]``, as :class:`Precheck`
    starts it (its stdin and stdout the pipes to the reader)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        fd, start, end, *more = map(int, args)
        piece, lead = [*more, PIECE_BYTES, LEAD_BYTES][:2]
        if len(more) > 2 or not 0 <= start <= end or piece < 1 or lead < 0:
            raise ValueError
        os.fstat(fd)
    except (ValueError, OSError):
        print(
            "usage: python -m journal.read.precheck FD START END [PIECE [LEAD]]: FD an open "
            "journal, 0 <= START <= END byte offsets, PIECE > 0, LEAD >= 0 bytes",
            file=sys.stderr,
        )
        return 2
    with contextlib.suppress(OSError):  # the reader's side says what became of the journal
        check(fd, start, end, piece, lead)
    return 0


if __name__ == "__main__":
    sys.exit(main())
