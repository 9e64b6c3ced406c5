"""Where a mirrored run's parts live in its store, relative to the mirror's URI.

- ``journal/<start>-<end>.jsonl``: the journal as immutable segments, each the bytes
  ``[start, end)`` of the local ``journal.jsonl`` (whole lines; 16-digit offsets, so the
  names sort in journal order). The segments, concatenated in name order, are the journal
  byte for byte. A segment whose size is not ``end - start`` (an upload cut short on a
  store without atomic writes) is not one.
- ``checkpoints/<name>/...``: a checkpoint's files, as in the run dir, and
  ``checkpoints/<name>/.upload_complete`` (JSON: its files and sizes) written last: a
  checkpoint without that marker is incomplete and never used.
- ``reports/``, ``control/``: report and command files written by remote watchers, which
  the mirroring watcher moves into the run dir's inboxes.
- ``leases/<name>/<id>.json``: a remote watcher's hold on a checkpoint (``expires``): the
  mirror keeps it in the store while held.
- ``owner.json``: whose mirror this is (the run's id and a hash of its journal's first
  line), written by the mirror's first write: every later write and delete checks it.

Every object is read with a cap on its size (a file of the inboxes: the local inboxes'
:data:`journal.rundir.inbox.MAX_FILE_BYTES`; a segment, a marker: the sizes below), so a huge
object in the store is refused unread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

JOURNAL_PREFIX = "journal/"
CHECKPOINTS_PREFIX = "checkpoints/"
REPORTS_PREFIX = "reports/"
CONTROL_PREFIX = "control/"
LEASES_PREFIX = "leases/"
MARKER_NAME = ".upload_complete"
OWNER_KEY = "owner.json"

#: One segment holds at most this much (the mirror cuts bigger ranges; a reader refuses a
#: bigger object).
MAX_SEGMENT_BYTES = 16 << 20
#: A marker lists a checkpoint's files: thousands of them fit.
MAX_MARKER_BYTES = 16 << 20

_SEGMENT = re.compile(r"^journal/(\d{16})-(\d{16})\.jsonl$")


@dataclass(frozen=True)
class Segment:
    """One uploaded piece of the journal: bytes ``[start, end)``."""

    start: int
    end: int

    @property
    def key(self) -> str:
        return segment_key(self.start, self.end)


def segment_key(start: int, end: int) -> str:
    return f"{JOURNAL_PREFIX}{start:016d}-{end:016d}.jsonl"


def segments(listing: dict[str, int]) -> list[Segment]:
    """The journal's segments from a listing (key -> size): the contiguous run from byte 0,
    in order. Keys that are not segments, or whose size is wrong (or over
    MAX_SEGMENT_BYTES), are left out; so is all after a gap (nothing past it can be read in
    order)."""
    found: dict[int, Segment] = {}
    for key, size in listing.items():
        m = _SEGMENT.match(key)
        if m:
            seg = Segment(int(m.group(1)), int(m.group(2)))
            if 0 < seg.end - seg.start == size <= MAX_SEGMENT_BYTES:
                found.setdefault(seg.start, seg)
    out: list[Segment] = []
    pos = 0
    while pos in found:
        out.append(found[pos])
        pos = found[pos].end
    return out


def checkpoint_prefix(name: str) -> str:
    """``checkpoints/step-000010/`` for the run dir's ``checkpoints/step-000010``."""
    return f"{name.strip('/')}/"


def marker_key(name: str) -> str:
    return checkpoint_prefix(name) + MARKER_NAME


def marked_checkpoints(listing: dict[str, int]) -> set[str]:
    """The checkpoint names (``checkpoints/step-000010``) whose marker is in a listing."""
    tail = "/" + MARKER_NAME
    return {k[: -len(tail)] for k in listing if k.endswith(tail)}
