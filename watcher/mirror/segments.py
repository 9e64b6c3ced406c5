"""The local journal as segments: what has been uploaded (from the store's listing) and
the byte ranges beyond it, uploaded as they are (the records in them are read through
journal/store.py)."""

from __future__ import annotations

import os
from pathlib import Path

from journal.remote.layout import JOURNAL_PREFIX, MAX_SEGMENT_BYTES, segment_key, segments
from journal.remote.store import Store


class JournalMismatch(Exception):
    """The store holds another journal than the local one (one line)."""


def uploaded_end(store: Store, journal: Path) -> int:
    """How much of ``journal`` the store's segments hold. Raises :class:`JournalMismatch`
    when their first bytes are not the local journal's (another run's mirror) or they
    hold more than the local file."""
    found = segments(store.listing(JOURNAL_PREFIX))
    if not found:
        return 0
    end = found[-1].end
    first = found[0]
    head = store.head(first.key, 4096)
    local = read_range(journal, 0, len(head))
    if local != head or end > _size(journal):
        raise JournalMismatch(
            f"{store.url(JOURNAL_PREFIX)} holds another journal than {journal} "
            f"({end} bytes there); give the mirror a new URI"
        )
    return end


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def read_range(path: Path, start: int, end: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(max(0, end - start))
    except FileNotFoundError:
        return b""


def upload_segment(store: Store, journal: Path, start: int, end: int) -> int:
    """Upload ``[start, end)`` (cut at the last line end within MAX_SEGMENT_BYTES: a store
    back after an outage is caught up in pieces of that size) as one segment; returns its
    end."""
    data = read_range(journal, start, min(end, start + MAX_SEGMENT_BYTES))
    if end - start > MAX_SEGMENT_BYTES:
        data = data[: data.rfind(b"\n") + 1]
    if not data:
        return start
    stop = start + len(data)
    store.put_bytes(segment_key(start, stop), data)
    return stop


def is_replaced(journal: Path, uploaded: int) -> bool:
    """The local journal shrank below what was uploaded (replaced or truncated)."""
    return os.path.exists(journal) and _size(journal) < uploaded
