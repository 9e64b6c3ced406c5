"""Reading a run for ``ilab-journal check``, and with ``--wait`` waiting until it settled:
``train_end`` journaled, then nothing pending (no scheduler job in flight by the journal's
``job`` records, no lease held on a checkpoint: an eval still at work) and no report for the
quiet period. The journal is read once and then only what it gained (a
:class:`~journal.read.tailing.RotatingReader` from its offset), never again from its start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from journal.ask.facts import FactFolder
from journal.channels.jobs import FINAL_JOB_STATES
from journal.checkpoints.leases import expiries
from journal.read.reader import iter_events
from journal.read.tailing import RotatingReader
from journal.rundir.lock import run_holder
from journal.store import follow
from journal.views.index import Folded, fold, load

#: How often --wait reads what the journal gained (a few bytes: it goes on from its offset).
POLL_S = 0.2


@dataclass
class RunReading:
    """A journal read so far, with what is still pending in the run."""

    path: Path
    folder: FactFolder
    reader: RotatingReader = field(init=False)
    invalid: int = 0

    def __post_init__(self) -> None:
        self.reader = follow(self.path)

    def read(self, *, final: bool) -> int:
        """Fold everything the journal gained; returns the records read."""
        n = 0
        while True:
            batch = self.reader.read(final=final, max_bytes=8 << 20)
            if not batch.records and not batch.invalid:
                return n
            n += len(batch.records)
            self.invalid += len(batch.invalid)
            self.folder.add_batch(batch.records)

    def from_index(self, index: Folded, *, final: bool) -> None:
        """Start where ``status`` does: the journal ``index`` (the run's fold, its jobs and
        checkpoints included) plus what came after it; the records holding a named metric
        found by a byte search (:func:`iter_events`) up to where the index got, not every
        record parsed."""
        folded = fold(self.path, index, final=final)
        self.folder.fold, self.invalid = folded.fold, folded.invalid
        self.reader.seek(folded.cursor)
        metrics = tuple(sorted(self.folder.metrics))
        if metrics:  # train_begin: a new run's metrics start afresh (FactFolder.add_values)
            found = iter_events(
                self.path, {"train_begin"}, holding=metrics, end=folded.cursor.offset
            )
            for rec in found:
                self.folder.add_values(rec)

    def pending(self, quiet: float, now: float) -> list[str]:
        """What the run is still waiting for, each in a few words (empty: settled)."""
        out = []
        run = self.folder.fold
        flying = [k for k, state in run.jobs.items() if state not in FINAL_JOB_STATES]
        if flying:
            out.append(f"{len(flying)} scheduler job(s) in flight ({', '.join(flying[:3])})")
        held = [
            name
            for name, ends in expiries(self.path.parent, {f.name for f in run.fates}).items()
            if any(end > now for end in ends)
        ]
        if held:
            out.append(f"checkpoint(s) leased by a consumer still at work ({', '.join(held[:3])})")
        last = run.summarizer.summary.last_ts or 0.0  # any record: reports too
        if now - last < quiet:
            out.append(f"a record {now - last:.1f}s ago (quiet period {quiet:g}s)")
        return out


def wait_for_journal(path: Path, deadline: float) -> bool:
    """Wait until the journal at ``path`` exists (its run dir may not exist yet, or a
    launcher may hold it with no record yet), at most until ``deadline`` (monotonic);
    returns whether it exists."""
    while not path.exists():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(POLL_S, left))  # a poll: nothing to wake us on a dir not there yet
    return True


def read_run(
    path: Path, folder: FactFolder, *, wait: float | None, quiet: float
) -> tuple[RunReading, list[str]]:
    """The run read once (``wait`` None), or read until it settled or ``wait`` seconds
    passed; returns it and what is still pending (empty when settled or not waited for)."""
    reading = RunReading(path, folder)
    final = run_holder(path.parent) is None
    index = load(path)
    if index is None:  # no index (a copied journal): the whole journal, once
        reading.read(final=final)
    else:  # the summary from the index (as status), the rest by a byte search
        reading.from_index(index, final=final)
    if wait is None:
        return reading, []
    deadline = time.monotonic() + wait
    while True:
        ended = folder.fold.summarizer.ended
        pending = reading.pending(quiet, time.time()) if ended else ["train_end"]
        if not pending or time.monotonic() >= deadline:
            return reading, pending
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        reading.read(final=run_holder(path.parent) is None)
