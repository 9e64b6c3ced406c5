"""The journal index: what ``status`` needs, folded up to a byte offset, so a reader folds
only the records written since (O(new records), not O(file)).

``<ckpt_dir>/journal.index.json`` holds the :class:`~journal.views.fold.RunFold` state up to
``offset`` (records, invalid lines, the latest attempt, the best checkpoint, ...) and a
fingerprint of the journal's first line. The journal's writer refreshes it after each durable
record (save, train_end, control, report, checkpoint_removed, journal_gap) and train_begin:
it keeps the fold in memory and folds what was written since the last refresh
(:func:`advance`: a few hundred records at most for a typical save interval), then replaces
the file atomically (:func:`save`); the trainer's ``--keep-best`` asks that same live fold.
Readers trust the file only when the fingerprint matches and the offset lies on a line
boundary inside the file; otherwise they scan everything, as before. The index is a cache: deleting it loses nothing.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from journal.read.cursor import START, Cursor
from journal.read.lines import first_line_fingerprint, open_for_reading
from journal.read.reader import CHUNK_SIZE, JournalReader
from journal.rundir.files import atomic_write
from journal.rundir.paths import INDEX_NAME
from journal.views.fold import RunFold

#: 2: folded only records of the right field types (journal/record/fields.py); 3: a new run
#: forgets the last run's checkpoint; 4: refused reports are counted; 5: the run's whole fold
#: (checkpoints with their fates, commands, attempts); 6: and every scheduler job's state;
#: 7: and the alerts (journal/channels/alerts.py); 8: no record of another run amid the run's,
#: no checkpoint outside the run dir (journal/views/fold.py)
VERSION = 8
MAX_INDEX_BYTES = 16 << 20  # a real index is a few KB; anything else is not ours


@dataclass
class Folded:
    """A run's fold and how far it has read."""

    fold: RunFold
    cursor: Cursor = START  # where the fold got to (a line start)
    invalid: int = 0
    fingerprint: str | None = None  # of the journal's first line when it was folded


def index_path(journal: Path) -> Path:
    return journal.with_name(INDEX_NAME)


def load(journal: Path) -> Folded | None:
    """The index of ``journal`` if it can be trusted, else None."""
    try:
        raw: Any = orjson.loads(_read_small(index_path(journal)))
        offset, fp = int(raw["offset"]), raw.get("fingerprint")
        if raw.get("version") != VERSION or not _holds(journal, fp, offset):
            return None
        return Folded(
            RunFold.from_state(raw["state"], journal.parent),
            Cursor(offset, int(raw["line_no"])),
            int(raw["invalid"]),
            fp,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError, orjson.JSONDecodeError):
        return None


def _holds(journal: Path, fingerprint: Any, offset: int) -> bool:
    """Whether a fold of ``journal`` up to ``offset``, made when its first line had
    ``fingerprint``, is a fold of the file there now: the same first line (None: a symlink,
    no first line: never), and ``offset`` a line start inside it (not truncated, rotated or
    recreated since)."""
    if fingerprint is None or first_line_fingerprint(journal) != fingerprint:
        return False
    fd = open_for_reading(journal)
    try:
        size = os.fstat(fd).st_size
        return offset <= size and (not offset or os.pread(fd, 1, offset - 1) == b"\n")
    finally:
        os.close(fd)


def _read_small(path: Path) -> bytes:
    """A regular file's bytes, if it is small; never blocks (a FIFO there is refused)."""
    fd = open_for_reading(path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_INDEX_BYTES:
            raise ValueError(f"{path}: not an index")
        return os.pread(fd, MAX_INDEX_BYTES, 0)
    finally:
        os.close(fd)


def fold(journal: Path, folded: Folded, *, final: bool) -> Folded:
    """Read on from ``folded.cursor`` to the end (in bounded chunks)."""
    reader = JournalReader(journal, folded.cursor.offset, folded.cursor.line_no)
    while True:
        before = reader.offset
        batch = reader.read(final=final, max_bytes=CHUNK_SIZE)
        for rec in batch.records:
            folded.fold.add(rec)
        folded.invalid += len(batch.invalid)
        if reader.offset == before:
            break
    folded.cursor = reader.cursor
    return folded


def advance(journal: Path, folded: Folded | None) -> Folded:
    """``folded`` (the writer's live fold) read on to the end of ``journal``; when it is no
    fold of the file there now (none yet; truncated, rotated or recreated since), the index's
    or a fold from byte 0 instead. A torn tail is left for next time."""
    if folded is None or not _holds(journal, folded.fingerprint, folded.cursor.offset):
        folded = load(journal) or Folded(RunFold(journal.parent))
    fold(journal, folded, final=False)
    folded.fingerprint = first_line_fingerprint(journal)
    return folded


def save(journal: Path, folded: Folded) -> None:
    """Write ``folded`` as the index of ``journal`` (atomically; not without a first line)."""
    if folded.fingerprint is None:
        return
    body = {
        "version": VERSION,
        "fingerprint": folded.fingerprint,
        "offset": folded.cursor.offset,
        "line_no": folded.cursor.line_no,
        "invalid": folded.invalid,
        "state": folded.fold.to_state(),
    }
    atomic_write(index_path(journal), orjson.dumps(body), root=journal.parent, durable=False)


def summarize(journal: Path, *, use_index: bool = True) -> Folded:
    """The whole journal folded: from the index when it can be trusted (and ``use_index``),
    else from byte 0. A torn final fragment counts as an invalid line, as in a full scan."""
    start = load(journal) if use_index else None
    return fold(journal, start or Folded(RunFold(journal.parent)), final=True)
