"""Single-writer, append-only journal (the format: docs/journal-format.md).

One ``os.write`` of one orjson-encoded line per record on an ``O_APPEND`` descriptor: a record
is either wholly in the file or (after a crash mid-write) a torn final fragment that readers
skip. Only durable events are fsynced, so the hot path costs about one syscall.

The journal is opened without following a symlink, in a directory only its owner can write
(:mod:`journal.rundir.safety`). A journal deleted or replaced during the run is noticed and started
again (:mod:`journal.write.recreate`).
"""

from __future__ import annotations

import errno
import logging
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import orjson

from journal.read.lines import Tail, read_tail
from journal.record.events import DURABLE_EVENTS, SCHEMA_VERSION
from journal.rundir.paths import RESERVE_NAME, resolve_journal
from journal.rundir.safety import CREATE, open_no_follow
from journal.views import index
from journal.views.fold import RunFold
from journal.write.recreate import RecreatesJournal, first_seq, identity

log = logging.getLogger(__name__)

ErrorPolicy = Literal["warn", "raise"]
# orjson writes NaN/Inf as null (valid JSON); the trainer also sends an explicit flag for
# non-finite losses so consumers can tell "diverged" from "not measured".
_DUMPS_OPTS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY


class JournalWriteError(OSError):
    """Raised by a writer with ``on_error="raise"`` when a record cannot be written."""


def _default(obj: Any) -> Any:
    """Fallback encoder: paths, sets and anything with a sensible ``str``."""
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if hasattr(obj, "item") and callable(obj.item):  # 0-d tensors / numpy scalars
        return obj.item()
    return str(obj)


def _ends_clean(path: Path) -> bool:
    """Whether the file is empty or ends with a newline (no torn fragment)."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        return size == 0 or os.pread(f.fileno(), 1, size - 1) == b"\n"


class JournalWriter(RecreatesJournal):
    """Append lifecycle records to ``<ckpt_dir>/journal.jsonl``.

    Args:
        path: a checkpoint directory (``journal.jsonl`` inside it, created as needed), or a
            file path (an existing file, or a new one ending in ``.jsonl``).
        resume: continue the ``run_id`` of the last record with ``attempt + 1``; otherwise a
            new run id and attempt 1. ``seq`` always continues over the whole file.
        join: append to the last record's attempt (same ``run_id`` and ``attempt``): for
            records written after an attempt's writer is gone (reports after training,
            the launcher's fallback ``train_end``). Needs an existing record.
        run_id: force a run id (for tests and external orchestration).
        on_error: ``"warn"`` keeps training alive on I/O errors (warn once, count dropped
            records, write a ``journal_gap`` record once writing works again);
            ``"raise"`` raises :class:`JournalWriteError`.
        durable_events: events followed by ``fsync``.
        tail: the journal's :class:`~journal.read.lines.Tail` read with ``torn`` by the
            caller holding the lock (the store's ``open_attempt``), so it is not read again.
        reserve_bytes: keep this much disk in ``journal.reserve`` while open; when the disk
            fills up, it is released so the last records (``train_end``) still land. Any
            writer releases a reserve it finds (one a killed trainer left, too).

    Raises :class:`~journal.rundir.safety.UnsafeRunDir` when the journal is a symlink, not a
    regular file (a character device such as ``/dev/null`` is accepted), or someone else's,
    or its directory could be steered by someone else.

    Not thread-safe: one writer per file, in one thread (rank 0 of the trainer).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        resume: bool = False,
        join: bool = False,
        run_id: str | None = None,
        on_error: ErrorPolicy = "warn",
        durable_events: frozenset[str] = DURABLE_EVENTS,
        mode: int = 0o640,
        reserve_bytes: int = 0,
        tail: Tail | None = None,
    ) -> None:
        self.path = resolve_journal(path, must_exist=False)
        self.on_error = on_error
        self.durable_events = durable_events
        self.dropped = 0
        self._gap: tuple[int, int, str] | None = None  # first seq, last seq, error text
        self._torn = False
        self._pending: list[tuple[Any, ...]] = []
        self._folded: index.Folded | None = None  # the live fold (see live_fold)
        #: the live folds of the files this writer wrote before the journal was cut under it
        #: (copytruncate, a recreated file): what they knew, ``--keep-best`` still knows
        self.folds_before_cut: list[RunFold] = []
        self._mode = mode
        self._fd = self._open()
        self._ident = identity(self._fd)
        self._next_check = 0.0
        self._reopen_failed = False
        self._reserve = self.path.with_name(RESERVE_NAME)
        self._own_reserve = False
        self._make_reserve(reserve_bytes)
        self._init_from_tail(resume, join, run_id, tail)
        self._first_seq = first_seq(self.path, self.seq)

    def _adopt_tail(self, tail: Tail | None = None) -> dict[str, Any] | None:
        """The file's last record (``tail``, or read now: a recreated journal's too); a
        torn final fragment (a crash mid-write) is terminated so readers skip it as one
        bad line."""
        last = (tail or read_tail(self.path, torn=True)).last
        if not _ends_clean(self.path):
            self._write_bytes(b"\n")
        return last

    def _init_from_tail(
        self, resume: bool, join: bool, run_id: str | None, tail: Tail | None
    ) -> None:
        """Go on from the file's last record (``tail``: read already, under the lock)."""
        last = self._adopt_tail(tail)
        # The envelope position of the last record (for records written out of band).
        self._last_position = tuple(
            v if last and isinstance(v := last.get(k), int) else 0
            for k in ("step", "epoch", "samples_seen")
        )
        self.seq = last["seq"] + 1 if last else 0
        if (resume or join) and last and isinstance(last.get("run_id"), str):
            self.run_id = run_id or last["run_id"]
            self.attempt = int(last.get("attempt", 1)) + (0 if join else 1)
        else:
            self.run_id = run_id or uuid.uuid4().hex[:12]
            self.attempt = 1

    # -- public API ---------------------------------------------------------------------

    def append(
        self,
        event: str,
        data: Mapping[str, Any] | None = None,
        *,
        step: int = 0,
        epoch: int = 0,
        samples_seen: int = 0,
        ts: float | None = None,
        defer: bool = False,
    ) -> int | None:
        """Append one record; return its ``seq``, or ``None`` if it was dropped.

        ``defer=True`` keeps the record in memory (seq and ts fixed now) until the next
        non-deferred append or :meth:`flush`, which writes everything in one ``os.write``.
        The trainer defers intra-step records so a step costs one cold write path, not
        five; ``data`` must not be mutated after a deferred append. Durable events are never
        deferred.
        """
        now = time.time()
        if ts is None:
            ts = now
        durable = event in self.durable_events
        if durable or (not defer and now >= self._next_check):
            self._check_path(now, step, epoch, samples_seen)
        seq = self.seq
        self.seq = seq + 1
        if not self._pending and not defer and self._gap is None and not self._torn:
            # Fast path (nothing pending, no earlier failure): one dumps, one write.
            line = self._encode(seq, ts, event, step, epoch, samples_seen, data)
            try:
                try:
                    n = os.write(self._fd, line)
                except OSError:
                    n = 0
                if n != len(line):  # disk full (or a quota): the slow path, reserve included
                    self._write_bytes(line[n:], continuing=True)
                if durable:
                    os.fsync(self._fd)
            except OSError as exc:
                self._torn = True  # part of the line may be on disk
                self._dropped(seq, exc)
                return None
            if durable or event == "train_begin":
                self.live_fold(save=True)
            return seq
        rec = (seq, ts, event, step, epoch, samples_seen, data)
        self._pending.append(rec)
        if defer and not durable:
            return seq
        if not self._write_pending(durable=durable):
            return None
        if durable or event == "train_begin":
            self.live_fold(save=True)
        return seq

    def append_at_last_position(self, event: str, data: Mapping[str, Any]) -> int | None:
        """Append with the step/epoch/samples_seen of the file's last record: for records
        written after the loop's writer is gone (``join=True``)."""
        step, epoch, samples_seen = self._last_position
        return self.append(event, data, step=step, epoch=epoch, samples_seen=samples_seen)

    def _encode(
        self,
        seq: int,
        ts: float,
        event: str,
        step: int,
        epoch: int,
        samples_seen: int,
        data: Mapping[str, Any] | None,
    ) -> bytes:
        """One record as a JSON line (the only place the envelope is built)."""
        return orjson.dumps(
            {
                "v": SCHEMA_VERSION,
                "seq": seq,
                "run_id": self.run_id,
                "attempt": self.attempt,
                "ts": ts,
                "event": event,
                "step": step,
                "epoch": epoch,
                "samples_seen": samples_seen,
                "data": data if data is not None else {},
            },
            default=_default,
            option=_DUMPS_OPTS,
        )

    def _write_pending(self, *, durable: bool) -> bool:
        """One write for every pending record (plus a journal_gap record after a failure)."""
        pending, self._pending = self._pending, []
        if not pending:
            return True
        gap = self._gap
        if gap is not None:
            # Recovering from failed writes: the gap record follows the records it precedes
            # in time, so seq stays strictly increasing; it names the lost range.
            first, last, err = gap
            gap_data = {
                "dropped": last - first + 1,
                "first_seq": first,
                "last_seq": last,
                "error": err,
            }
            pending.append((self.seq, time.time(), "journal_gap", 0, 0, 0, gap_data))
            durable = True  # its seq is taken only once it is written (below)
        payload = b"".join(self._encode(*rec) for rec in pending)
        try:
            self._write_bytes(payload)
            if durable:
                os.fsync(self._fd)
        except OSError as exc:
            for rec in pending:
                if rec[2] != "journal_gap":
                    self._dropped(rec[0], exc)
            return False
        if gap is not None:
            self._gap = None
            self.seq += 1
            log.warning(
                "journal %s: writing again after %d dropped records", self.path, gap[1] - gap[0] + 1
            )
        return True

    def flush(self) -> None:
        """Write deferred records and fsync everything written so far."""
        self._write_pending(durable=False)
        try:
            os.fsync(self._fd)
        except OSError as exc:
            if self.on_error == "raise":
                raise JournalWriteError(exc.errno, f"fsync {self.path}: {exc.strerror}") from exc

    def close(self) -> None:
        """fsync and close. Safe to call twice."""
        if self._fd < 0:
            return
        self.flush()
        os.close(self._fd)
        self._fd = -1
        if self._own_reserve:
            self._reserve.unlink(missing_ok=True)

    def __enter__(self) -> JournalWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------

    def _write_bytes(self, payload: bytes, *, continuing: bool = False) -> None:
        """Write all of ``payload`` (``continuing``: the rest of a line already begun). On
        a full disk the reserve is given up once, so the final records still land."""
        if self._torn and not continuing:
            # A previous write may have left a partial line: start on a fresh line.
            payload = b"\n" + payload
        view = memoryview(payload)
        while view:
            try:
                n = os.write(self._fd, view)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT) and self._release_reserve():
                    continue
                self._torn = True
                raise
            view = view[n:]
            if view:
                self._torn = True  # a short write: the disk or quota is full; go on
        self._torn = False

    def live_fold(self, *, save: bool = False) -> RunFold | None:
        """The journal's fold (the one ``status`` reads), kept in memory and read on to the
        file's end (:func:`journal.views.index.advance`); None when the journal cannot be
        read now. ``save``: write ``journal.index.json`` too, so readers fold only what came
        since: after each durable record and train_begin (a cache: a failure there costs
        readers time, never training)."""
        folded, self._folded = self._folded, None  # an error part way: start again
        try:
            self._folded = index.advance(self.path, folded)
            if folded is not None and self._folded is not folded:  # the journal was cut
                self.folds_before_cut.append(folded.fold)
            if save:
                index.save(self.path, self._folded)
        except Exception as exc:  # never let a cache stop training
            log.debug("journal index not refreshed: %s", exc)
        return self._folded.fold if self._folded is not None else None

    def _make_reserve(self, size: int) -> None:
        """Hold ``size`` bytes of disk for the last records (train_end) of a full disk."""
        if size <= 0 or self._reserve.exists():
            return
        try:
            fd = open_no_follow(self._reserve, CREATE, root=self.path.parent)
        except OSError:
            return
        try:
            os.posix_fallocate(fd, 0, size)
        except (OSError, AttributeError):
            os.close(fd)
            self._reserve.unlink(missing_ok=True)  # no room for it now: go without
            return
        os.close(fd)
        self._own_reserve = True

    def _release_reserve(self) -> bool:
        """Delete the reserve file (ours or one a killed writer left); False if none."""
        try:
            self._reserve.unlink()
        except FileNotFoundError:
            return False
        log.warning("journal %s: disk full; released the reserve for the last records", self.path)
        return True

    def _dropped(self, seq: int, exc: OSError | None) -> None:
        if self.on_error == "raise":
            err = exc.errno if exc else errno.EIO
            raise JournalWriteError(err, f"cannot write journal {self.path}: {exc}") from exc
        self.dropped += 1
        if self._gap is None:
            text = f"{type(exc).__name__}: {exc}" if exc else "earlier write failed"
            log.warning(
                "journal %s: cannot write (%s); training continues, records are counted and "
                "a journal_gap record will mark the loss",
                self.path,
                text,
            )
            self._gap = (seq, seq, text)
        else:
            self._gap = (self._gap[0], seq, self._gap[2])
        return None
