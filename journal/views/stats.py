"""What a journal's records add up to: counts per event, time per phase and throughput
(``ilab-journal stats``), scanned in parts by several processes for a large journal. Apart
from the run's summary (journal/views/summary.py), which ``status`` reads on every call."""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from journal.read.reader import iter_batches
from journal.record.record import Record
from journal.views.ledger import finite_number


@dataclass
class PhaseStats:
    """Time spent in one phase. ``count``: records that say how long they took;
    ``unmeasured``: records of the phase that do not (the HF, Accelerate and Lightning
    bridges' saves carry ``duration: null``), left out of the time rather than taken as 0 s."""

    count: int = 0
    total_s: float = 0.0
    unmeasured: int = 0

    @property
    def mean_s(self) -> float | None:
        """None when nothing was measured: no time is known, which is not 0 s."""
        return self.total_s / self.count if self.count else None

    def to_dict(self) -> dict[str, Any]:
        # no time is known when nothing was measured (not 0 s)
        return {
            **asdict(self),
            "total_s": self.total_s if self.count else None,
            "mean_s": self.mean_s,
        }


_PHASE_EVENTS = frozenset({"log", "evaluate", "save"})
_EVENT = operator.itemgetter("event")


@dataclass
class JournalStats:
    """Counts per event, time per phase and throughput (``ilab-journal stats``)."""

    counts: Counter[str] = field(default_factory=Counter)
    phases: dict[str, PhaseStats] = field(
        default_factory=lambda: {k: PhaseStats() for k in ("step", "evaluate", "save")}
    )
    tokens: int = 0
    samples: int = 0
    log_time_s: float = 0.0
    first_ts: float | None = None
    last_ts: float | None = None

    def add_batch(self, records: list[Record]) -> None:
        """Add records in file order. Counting runs in C; Python touches only the first and
        last timestamps and the log/evaluate/save records (about 1 in 5)."""
        events = list(map(_EVENT, records))
        self.counts.update(events)
        if self.first_ts is None:
            self.first_ts = next((r["ts"] for r in records if r["ts"] is not None), None)
        self.last_ts = next(
            (r["ts"] for r in reversed(records) if r["ts"] is not None), self.last_ts
        )
        for r, ev in zip(records, events, strict=True):
            if ev in _PHASE_EVENTS:
                self._add_phase(ev, r["data"])

    def merge(self, later: JournalStats) -> None:
        """Fold in the stats of records that come after these in the file."""
        self.counts.update(later.counts)
        for name, phase in later.phases.items():
            self.phases[name].count += phase.count
            self.phases[name].total_s += phase.total_s
            self.phases[name].unmeasured += phase.unmeasured
        self.tokens += later.tokens
        self.samples += later.samples
        self.log_time_s += later.log_time_s
        if self.first_ts is None:
            self.first_ts = later.first_ts
        if later.last_ts is not None:
            self.last_ts = later.last_ts

    def _add_phase(self, ev: str, data: dict[str, Any]) -> None:
        if ev == "log":
            t = data.get("elapsed_time")
            if isinstance(t, (int, float)):
                self.phases["step"].count += 1
                self.phases["step"].total_s += t
                self.log_time_s += t
                bm = data.get("batch_metrics") or {}
                self.tokens += _count(bm.get("total_length"))
                self.samples += _count(bm.get("total_samples"))
        else:
            d = finite_number(data.get("duration"))
            if d is not None:
                self.phases[ev].count += 1
                self.phases[ev].total_s += d
            else:  # no duration recorded (a bridge's save): not known, so not 0 s
                self.phases[ev].unmeasured += 1

    def to_dict(self) -> dict[str, Any]:
        wall = (
            self.last_ts - self.first_ts
            if self.first_ts is not None and self.last_ts is not None
            else 0.0
        )
        return {
            "counts": dict(self.counts),
            "phases": {k: v.to_dict() for k, v in self.phases.items()},
            "wall_s": wall,
            "tokens_per_s": self.tokens / self.log_time_s if self.log_time_s else None,
            "samples_per_s": self.samples / self.log_time_s if self.log_time_s else None,
        }


def _count(v: Any) -> int:
    """A count from a record: numbers only (bridges may write anything there)."""
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def scan_stats(path: Path, start: int = 0, end: int | None = None) -> tuple[JournalStats, int]:
    """Stats of the lines in ``[start, end)`` (the whole file by default) and how many of
    them are invalid."""
    from journal.read.parallel import SCAN_BYTES

    st, invalid = JournalStats(), 0
    for batch in iter_batches(path, final=True, start=start, end=end, max_bytes=SCAN_BYTES):
        invalid += len(batch.invalid)
        st.add_batch(batch.records)
    return st, invalid


def journal_stats(path: Path, jobs: int | None = None) -> tuple[JournalStats, int]:
    """Stats of a whole journal and its number of invalid lines; a large journal is scanned
    in parts by ``jobs`` processes (see :mod:`journal.read.parallel`)."""
    from journal.read.parallel import map_ranges

    st, invalid = JournalStats(), 0
    for part, bad in map_ranges(scan_stats, path, jobs):
        st.merge(part)
        invalid += bad
    return st, invalid
