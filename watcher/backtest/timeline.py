"""One pass over a journal: the step boundaries of its current run a stop can fall on, the
values of the metrics the policies judge by and when each was known, the records that
decide the best checkpoint and retention; the run's one fold (:class:`RunFold`: its status,
who stopped it, its checkpoints' fates); each record of the run handed to the replay as it
is read.

Memory is bounded by what the policies need, not by the journal: a step boundary is four
numbers in arrays, a ``log`` record is kept only as the values of the metrics asked for;
only ``evaluate``, ``report``, ``save``, ``checkpoint_removed``, ``train_begin`` and
``train_end`` records (one per eval, save, removal or attempt) are kept whole.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal import store
from journal.record.record import Record
from journal.views.fold import RunFold, metric_points, of_other_run
from journal.views.ledger import finite_number

#: Records kept whole: what the best checkpoint, reported metrics and retention come from.
_KEPT = frozenset({"evaluate", "report", "save", "checkpoint_removed"})


class Boundaries:
    """Step boundaries as ``(ts, seq, step, samples)``, in four arrays (32 bytes each, not
    a tuple of four objects: a 1M-record journal has a third of a million). A logged
    metric's values are kept the same way, the value in ``samples`` (``kind`` "d")."""

    def __init__(self, kind: str = "q") -> None:
        self.ts = array("d")
        self.seq = array("q")
        self.step = array("q")
        self.samples: array[Any] = array(kind)

    def add(self, ts: float, seq: int, step: int, samples: float) -> None:
        self.ts.append(ts)
        self.seq.append(seq)
        self.step.append(step)
        self.samples.append(samples)

    def __len__(self) -> int:
        return len(self.ts)

    def sort(self) -> None:
        """In ``(ts, seq)`` order (journal order already, unless clocks went back)."""
        ts, seq = self.ts, self.seq
        if all(
            ts[i] < ts[i + 1] or (ts[i] == ts[i + 1] and seq[i] <= seq[i + 1])
            for i in range(len(ts) - 1)
        ):
            return
        rows = sorted(zip(ts, seq, self.step, self.samples, strict=True))
        self.ts = array("d", (r[0] for r in rows))
        self.seq = array("q", (r[1] for r in rows))
        self.step = array("q", (r[2] for r in rows))
        self.samples = array(self.samples.typecode, (r[3] for r in rows))


@dataclass
class Timeline:
    """What one pass over a journal's current run gathers for every policy."""

    run_id: str | None = None
    boundaries: Boundaries = field(default_factory=Boundaries)
    tokens_per_step: float | None = None
    end_ts: float | None = None
    end_samples: int = 0
    last_step: int = 0
    status: str = "running"  # the fold's state of the run (status's)
    stop_source: str | None = None  # the fold's: who stopped it
    keep_best: str | None = None
    keep_last_n: int | None = None
    #: the records kept whole, in journal order (evaluate, report, save, checkpoint_removed,
    #: train_begin, train_end)
    metric_records: list[Record] = field(default_factory=list)
    #: the run as it happened, folded as every view folds it (status, checkpoints, best)
    fold: RunFold = field(default_factory=RunFold)
    #: the metrics gathered from ``log`` records (see :func:`read_run`)
    log_metrics: set[str] = field(default_factory=set)
    _logged: dict[str, Boundaries] = field(default_factory=dict)  # (ts, seq, step, value)
    _series: dict[str, list[tuple[int, float, float, int, int]]] = field(default_factory=dict)

    def applied(self, t: float, after_step: int) -> tuple[int, int, float] | None:
        """(step, samples, ts) at the end of the first step after ``after_step`` that ends
        after time ``t`` (a command is read at a step boundary: one that answers a record
        of step s applies at s + 1 at the earliest); None when no step does."""
        b = self.boundaries
        for i in range(bisect.bisect_right(b.ts, t), len(b)):
            if b.step[i] > after_step and b.ts[i] > t:
                return b.step[i], b.samples[i], b.ts[i]
        return None


def read_run(
    journal: Path,
    metrics: Iterable[str] = (),
    on_record: Callable[[Record], None] | None = None,
) -> Timeline:
    """The journal read once, its current run (from the first record of the last
    ``run_id``, all its attempts) folded: step boundaries, the end, the run's retention,
    ``metrics`` (and each ``keep_best`` metric of the run) from ``log`` records, the
    ``evaluate``/``report``/``save`` records. ``on_record`` gets each record of the run in
    journal order as it is read (the replay's deliveries): none is kept for later."""
    # the current run's, known before the one forward pass so that each of its records can
    # be replayed as it is read (no record: None, and none is replayed)
    run_id = store.tail(journal).run_id
    tl = Timeline(run_id=run_id, fold=RunFold(journal.parent))
    fold = tl.fold
    wanted = tl.log_metrics
    wanted.update(metrics)
    logged = tl._logged
    logs = Boundaries()  # a bridge's journal without step_end: its log records
    tokens, n_logged = 0, 0
    kept, ends = tl.metric_records, tl.boundaries
    last = 0
    started = False
    for batch in store.iter_batches(journal, final=True):
        for rec in batch.records:  # once per record: one dict lookup for most of them
            if not started:
                if rec["run_id"] != run_id:
                    continue
                started = True
            if of_other_run(rec, run_id):  # the fold's rule: no view counts it
                continue
            fold.add(rec)  # every record: the state (hung included) is status's, to the step
            ev = rec["event"]
            if ev == "step_end":
                ends.add(_ts(rec), rec["seq"], rec["step"], rec["samples_seen"])
            elif ev == "log":
                step, ts, seq = rec["step"], _ts(rec), rec["seq"]
                logs.add(ts, seq, step, rec["samples_seen"])
                last = max(last, step)
                data = rec["data"]
                bm = data.get("batch_metrics") or {}
                if isinstance(bm.get("total_length"), int):
                    tokens, n_logged = tokens + bm["total_length"], n_logged + 1
                values = metric_points(ev, step, data)[2] if wanted else {}  # type: ignore[index]
                for name in wanted:
                    if (v := values.get(name)) is not None:
                        col = logged.get(name) or logged.setdefault(name, Boundaries("d"))
                        col.add(ts, seq, step, v)
            elif ev in _KEPT:
                if not fold.ledger.outside(rec["data"].get("checkpoint_path")):
                    kept.append(rec)
                    if ev not in ("report", "checkpoint_removed") and rec["step"] > last:
                        last = rec["step"]
            elif ev == "train_begin":
                kept.append(rec)
                goal = fold.keep_best()
                if goal is not None:  # the run's own goal: its log values from here on
                    wanted.add(goal.metric)
            elif ev == "train_end":
                kept.append(rec)
                tl.end_ts = rec["ts"]
                last = max(last, rec["step"])
            if on_record is not None:
                on_record(rec)
    s = fold.summary()  # status's answer: the state, who stopped it, the run's retention
    tl.status, tl.stop_source = s.state, s.stop_source
    tl.keep_best, tl.keep_last_n = s.keep_best, s.keep_last_n
    if not tl.boundaries:
        tl.boundaries = logs
    tl.boundaries.sort()
    b = tl.boundaries
    tl.last_step = max(last, b.step[-1] if len(b) else 0)
    tl.end_samples = max(b.samples, default=0)
    tl.tokens_per_step = tokens / n_logged if n_logged else None
    return tl


def _ts(rec: Record) -> float:
    """A record's time as a number: a record that says none (a writer left ``ts`` out)
    counts as at 0, before every other."""
    ts = rec["ts"]
    return 0.0 if ts is None else float(ts)


def metric_series(tl: Timeline, metric: str) -> list[tuple[int, float, float, int, int]]:
    """``(step, value, ts, seq, after)`` of a metric in journal order, made once per
    metric: reports by their checkpoint's step, evaluate and log fields by their record's
    (log fields only of the metrics :func:`read_run` gathered). ``after``: a stop decided
    with this value (the eval's own target) applies at a step after it: a report is read at
    the step boundary that journaled it, where a command sent with it is read too; an
    evaluate or log record is journaled after its step's boundary."""
    if metric in tl._series:
        return tl._series[metric]
    out: list[tuple[int, float, float, int, int]] = []
    for rec in tl.metric_records:
        at = rec["step"]
        got = metric_points(rec["event"], at, rec["data"])  # the views' one number rule
        if got is None or (v := got[2].get(metric)) is None:
            continue
        kind, step, _ = got
        ts, after = _ts(rec), at
        if kind == "report":
            after = at - 1
            # the value was known when the report was written, which may be before the
            # trainer journaled it (or after its end, by the watcher that drained it)
            sent = finite_number(rec["data"].get("reported_at"))
            if sent is not None and sent < ts:
                ts = sent
        out.append((step, v, ts, rec["seq"], after))
    logged = tl._logged.get(metric)
    if logged:  # merged into journal order by seq
        out += zip(logged.step, logged.samples, logged.ts, logged.seq, logged.step, strict=True)
        out.sort(key=lambda row: row[3])
    tl._series[metric] = out
    return out
