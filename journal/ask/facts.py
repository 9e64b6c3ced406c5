"""The facts ``ilab-journal check`` compares: the run's summary (the one ``status`` folds)
and, for the metrics an expression names, their values in journal order."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal.read.reader import iter_events
from journal.record.record import Record
from journal.views.fold import METRIC_KINDS, RunFold, metric_points, of_other_run
from journal.views.summary import RunSummary


def default_mode(metric: str, keep_best: str | None) -> str:
    """``best(M)``'s direction: the run's ``keep_best`` for its metric, else ``min`` for a
    loss (a name with ``loss``, ``perplexity`` or ``error`` in it), else ``max``."""
    if keep_best and keep_best.rpartition(":")[0] == metric:
        return keep_best.rpartition(":")[2]
    return "min" if any(w in metric for w in ("loss", "perplexity", "error")) else "max"


@dataclass
class MetricValues:
    """One metric's values in journal order and how many reports carried it."""

    values: list[float] = field(default_factory=list)
    reports: int = 0


class FactFolder:
    """Folds records (incrementally) into the summary and the named metrics' values."""

    def __init__(self, metrics: set[str], run_dir: Path | None = None) -> None:
        self.fold = RunFold(run_dir)
        self.metrics = metrics
        self.values: dict[str, MetricValues] = {m: MetricValues() for m in metrics}
        self._run: str | None = None

    def add_batch(self, records: list[Record]) -> None:
        add, metrics = self.fold.add, self.metrics
        for rec in records:
            if add(rec) and metrics:  # the fold's rule: a record of another run counts not
                self.add_values(rec)

    def add_values(self, rec: Record) -> None:
        """Fold one record's values of the named metrics (the summary is not touched): the
        fold's metric points (journal/views/fold.py: finite numbers, not bools)."""
        event = rec["event"]
        if event == "train_begin" and rec["run_id"] != self._run:
            self._run = rec["run_id"]  # a new run: its metrics only (a resume keeps them)
            self.values = {m: MetricValues() for m in self.metrics}
        got = metric_points(event, rec["step"], rec["data"])
        if got is None:
            return
        for m, mv in self.values.items():
            if (v := got[2].get(m)) is not None:
                mv.values.append(v)
                mv.reports += got[0] == "report"

    def facts(self, s: RunSummary, names: list[str]) -> dict[str, Any]:
        """Every fact by name, and each metric function in ``names`` (``best(accuracy)``)."""
        out: dict[str, Any] = {
            "status": s.state,
            "steps": s.last_step,
            "max_steps": s.total_steps,
            "epoch": s.epoch,
            "samples": s.samples_seen,
            "records": s.records,
            "invalid_lines": s.invalid_lines,
            "reports": s.reports,
            "refused_reports": s.refused_reports,
            "unapplied_commands": s.unapplied_commands,
            "stop_source": s.stop_source,
            "stopped_by": s.stopped_by,
            "stop_reason": s.reason,
            "run_id": s.run_id,
            "attempt": s.attempt,
            "alerts": s.alerts,
        }
        for name in names:
            fn, _, rest = name.partition("(")
            if not rest:
                continue
            metric, _, mode = rest[:-1].partition(":")
            mv = self.values.get(metric, MetricValues())
            out[name] = _apply(fn, mv, mode or default_mode(metric, s.keep_best))
        return out


def known_metrics(path: Path, keep_best: str | None = None) -> set[str]:
    """Every metric the journal's current run has: a metric point's name (what
    :class:`FactFolder` would find by name), plus the
    metric the run keeps the best by (named by the run, even before its first report).

    Reads the whole journal: ``check`` asks only when a named metric has no value, to tell a
    misspelt metric from one that has not come yet."""
    names: set[str] = set()
    run: str | None = None
    for rec in iter_events(path, {"train_begin", *METRIC_KINDS}):
        if rec["event"] == "train_begin":
            if rec["run_id"] != run:  # a new run: its metrics only, as FactFolder
                run, names = rec["run_id"], set()
        elif not of_other_run(rec, run):
            got = metric_points(rec["event"], rec["step"], rec["data"])
            names.update(got[2] if got else ())
    if keep_best and ":" in keep_best:
        names.add(keep_best.rpartition(":")[0])
    return names


def _apply(fn: str, mv: MetricValues, mode: str) -> float | int | None:
    vals = mv.values
    if fn == "reports":
        return mv.reports
    if fn == "count":
        return len(vals)
    if not vals:
        return None
    if fn == "best":
        return max(vals) if mode == "max" else min(vals)
    return {"last": vals[-1], "first": vals[0], "min": min(vals), "max": max(vals)}[fn]
