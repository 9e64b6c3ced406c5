"""One pass over a journal: the records of its current run, the step boundaries a stop
can fall on, a metric's values and when each was known."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal.read.reader import iter_batches
from journal.views.stops import ending

_ENDS = ("stop", "abort")
_METRIC_EVENTS = ("evaluate", "log")
_KEPT = frozenset({"evaluate", "log", "report", "save"})


@dataclass
class Timeline:
    """What one pass over a journal's current run gathers for every policy."""

    records: list[dict[str, Any]]
    boundaries: list[tuple[float, int, int, int]] = field(
        default_factory=list
    )  # ts, seq, step, samples
    tokens_per_step: float | None = None
    end_ts: float | None = None
    end_samples: int = 0
    last_step: int = 0
    status: str = "running"
    stop_source: str | None = None
    keep_best: str | None = None
    keep_last_n: int | None = None
    #: the records that carry metrics or checkpoints (evaluate, log, report, save)
    metric_records: list[dict[str, Any]] = field(default_factory=list)
    _series: dict[str, list[tuple[int, float, float, int, int]]] = field(default_factory=dict)

    def applied(self, t: float, after_step: int) -> tuple[int, int, float] | None:
        """(step, samples, ts) at the end of the first step after ``after_step`` that ends
        after time ``t`` (a command is read at a step boundary: one that answers a record
        of step s applies at s + 1 at the earliest); None when no step does."""
        i = bisect.bisect_right(self.boundaries, (t, float("inf")))
        for ts, _, step, samples in self.boundaries[i:]:
            if step > after_step and ts > t:
                return step, samples, ts
        return None


def read_run(journal: Path) -> Timeline:
    """The journal read once: the records of its current run (the last ``run_id``, all its
    attempts) and the step boundaries a stop can fall on."""
    records: list[dict[str, Any]] = []
    for batch in iter_batches(journal, final=True):
        records.extend(batch.records)
    run_id = records[-1].get("run_id") if records else None
    first = next((i for i, r in enumerate(records) if r.get("run_id") == run_id), 0)
    tl = Timeline(records[first:])
    logs: list[tuple[float, int, int, int]] = []
    tokens, logged = 0, 0
    enders: dict[str, str | None] = {}
    kept, ends = tl.metric_records, tl.boundaries
    last = 0
    for rec in tl.records:  # once per record: one dict lookup for most of them
        ev = rec.get("event")
        if ev == "step_end":
            ends.append(
                (rec.get("ts", 0.0), rec["seq"], rec.get("step", 0), rec.get("samples_seen", 0))
            )
            continue
        if ev in _KEPT:
            kept.append(rec)
            if ev == "log":
                logs.append(
                    (rec.get("ts", 0.0), rec["seq"], rec.get("step", 0), rec.get("samples_seen", 0))
                )
                bm = (rec.get("data") or {}).get("batch_metrics") or {}
                if isinstance(bm.get("total_length"), int):
                    tokens, logged = tokens + bm["total_length"], logged + 1
            elif ev != "report" and rec.get("step", 0) > last:
                last = rec.get("step", 0)
        elif ev == "train_begin":
            config = (rec.get("data") or {}).get("config") or {}
            tl.keep_best = (
                config.get("keep_best") if isinstance(config.get("keep_best"), str) else None
            )
            n = config.get("keep_last_n")
            tl.keep_last_n = n if isinstance(n, int) and not isinstance(n, bool) else None
        elif ev == "control":
            data = rec.get("data") or {}
            if data.get("accepted") and data.get("command") in _ENDS:
                enders[str(data.get("id"))] = data.get("source")
        elif ev == "train_end":
            data = rec.get("data") or {}
            tl.status = str(data.get("status"))
            tl.stop_source = ending(data, enders)[0]
            tl.end_ts = rec.get("ts")
            last = max(last, rec.get("step", 0))
    if not tl.boundaries:  # a bridge's journal without step_end: its log records
        tl.boundaries = logs
    tl.boundaries.sort()
    tl.last_step = max([last, *(b[2] for b in tl.boundaries[-1:])])
    tl.end_samples = max((b[3] for b in tl.boundaries), default=0)
    tl.tokens_per_step = tokens / logged if logged else None
    return tl


def metric_series(tl: Timeline, metric: str) -> list[tuple[int, float, float, int, int]]:
    """``(step, value, ts, seq, after)`` of a metric, made once per metric: reports by
    their checkpoint's step, evaluate and log fields by their record's. ``after``: a stop
    decided with this value (the eval's own target) applies at a step after it: a report
    is read at the step boundary that journaled it, where a command sent with it is read
    too; an evaluate or log record is journaled after its step's boundary."""
    if metric in tl._series:
        return tl._series[metric]
    out: list[tuple[int, float, float, int, int]] = tl._series.setdefault(metric, [])
    for rec in tl.metric_records:
        ev, data = rec.get("event"), rec.get("data") or {}
        at = rec.get("step", 0)
        if ev == "report":
            v = (data.get("metrics") or {}).get(metric)
            step = data.get("step") if isinstance(data.get("step"), int) else at
            after = at - 1
        elif ev in _METRIC_EVENTS:
            v, step, after = data.get(metric), at, at
        else:
            continue
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:
            out.append((int(step or 0), float(v), float(rec.get("ts", 0.0)), rec["seq"], after))
    return out
