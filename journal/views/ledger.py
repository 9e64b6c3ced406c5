"""Every checkpoint of a run and its fate, and which is the best by any metric: the
ledger a run's fold keeps (:mod:`journal.views.fold`; the trainer's ``--keep-best`` rotation
asks the fold its journal's writer keeps live), and ``query --best`` asks on its own.

A checkpoint is known by :func:`~journal.rundir.paths.checkpoint_key` (its ``step-NNNNNN``
name), so the same checkpoint journaled once with an absolute path (the trainer's save) and
once relative to another process's working directory (an old watcher's removal) is one
entry, shown at its canonical path (:func:`~journal.rundir.paths.canonical_checkpoint`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from journal.rundir.paths import canonical_checkpoint, checkpoint_key, in_run_dir
from journal.views.best import BestCheckpoint, MetricGoal, on_disk

#: How many reports one checkpoint keeps (the latest; the metrics keep every name's latest).
MAX_REPORTS_PER_CHECKPOINT = 50


def finite_number(v: Any) -> float | None:
    """``v`` as a float when it is a finite int or float, not a bool (the one number rule
    of the views: journal/views/fold.py), else None."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


@dataclass
class Removal:
    """How a checkpoint went: at which step of the run and when, why, and by whom (the
    record's ``by``: ``trainer``, ``watcher``, ``prune``...; None in older journals)."""

    step: int | None
    ts: float | None
    reason: str
    by: str | None
    after_end: bool = False  # removed after the run's train_end (a watcher or prune did)


@dataclass
class ReportSeen:
    """One report about a checkpoint, as journaled: its metrics, who sent it, and the step of
    the run at which it was journaled (``at_step``; after ``train_end``: ``after_end``)."""

    metrics: dict[str, Any]
    source: str | None
    at_step: int | None
    ts: float | None
    after_end: bool = False


@dataclass
class CheckpointFate:
    """One checkpoint of the run, from its save to its removal (or to now)."""

    key: str
    path: str  # canonical (absolute, inside the run dir when it lies there)
    step: int | None
    run_id: str | None = None
    attempt: int | None = None
    saved_ts: float | None = None
    trigger: Any = None
    saved: bool = False  # a save record named it (a report may name one never saved)
    removed: Removal | None = None
    kept: str | None = None  # a bridge kept it against its trainer's rotation (leased)
    #: each metric's latest value: the validation of its step, then its reports in order
    metrics: dict[str, float] = field(default_factory=dict)
    reports: list[ReportSeen] = field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return Path(self.path).name


class CheckpointLedger:
    """Every checkpoint of one run and its fate, and the best by any metric: the one rule
    of "which checkpoint is the best" (the trainer's ``--keep-best`` rotation, ``status``,
    ``query --best``, the exporters and ``backtest`` all ask it).

    Values come from ``report`` records (per checkpoint) and from ``evaluate`` records (a
    step's validation belongs to the checkpoint saved at that step). Checkpoints journaled as
    removed drop out of the best, and a report that comes for one afterwards does not bring
    it back (until a ``save`` writes a checkpoint of that name again)."""

    #: Records that can change a checkpoint's fate or which is the best.
    EVENTS = frozenset(
        {"evaluate", "save", "report", "checkpoint_removed", "checkpoint_kept", "job"}
    )

    def __init__(self, run_dir: str | os.PathLike[str] | None = None) -> None:
        self.run_dir = os.path.abspath(run_dir) if run_dir is not None else None
        self.run_id: str | None = None
        self.ended = False  # set by the owner: reports and removals after train_end say so
        self._fates: dict[str, CheckpointFate] = {}
        self._pending_eval: dict[int, dict[str, float]] = {}  # step -> its validation

    def add(self, rec: Mapping[str, Any]) -> None:
        """Fold one record (any event; only :attr:`EVENTS` matter). Not only a reader's
        :class:`~journal.record.record.Record`: the backtest folds what it simulates, so
        the envelope is read here as it may be (absent)."""
        event = rec.get("event")
        if event not in self.EVENTS:
            return
        data = rec.get("data")
        if not isinstance(data, Mapping):
            return
        step = int_or_none(rec.get("step"))
        if event == "save":
            return self._save(rec, data, step)
        if event == "evaluate":
            values = {k: v for k, x in data.items() if (v := finite_number(x)) is not None}
            if step is not None and values:
                self._pending_eval[step] = values
            return
        # the rest name a checkpoint, with its step (a removal: none; a keep: the record's)
        own = {"checkpoint_removed": None, "checkpoint_kept": step}
        fate = self._fate(
            data.get("checkpoint_path"), own.get(event, int_or_none(data.get("step")))
        )
        if fate is None:
            return
        if event == "report":
            self._report(fate, rec, data, step)
        elif event == "checkpoint_removed":
            fate.removed = Removal(
                step,
                finite_number(rec.get("ts")),
                str_or_none(data.get("reason")) or "removed",
                str_or_none(data.get("by")),
                self.ended,
            )
        elif event == "checkpoint_kept":
            fate.kept = str_or_none(data.get("reason")) or "kept"
        else:  # a scheduler job's state
            fate.jobs[str(data.get("job_id"))] = {
                k: data.get(k)
                for k in ("job_id", "scheduler", "state", "node", "exit_code", "hook", "log_path")
            }

    def new_run(self, run_id: str | None) -> None:
        """A ``train_begin`` of another run: its checkpoints are its own."""
        self.run_id = run_id
        self._fates = {}
        self._pending_eval = {}
        self.ended = False

    def _fate(self, path: Any, step: int | None) -> CheckpointFate | None:
        """The checkpoint a record names (created on first sight: a report or a removal may
        name one whose save this reader never saw, e.g. a journal rotated since)."""
        if not isinstance(path, str) or not path or self.outside(path):
            return None
        key = checkpoint_key(path)
        if key not in self._fates:
            self._fates[key] = CheckpointFate(
                key, canonical_checkpoint(self.run_dir, path), step, run_id=self.run_id
            )
        return self._fates[key]

    def outside(self, path: Any) -> bool:
        """Whether a record names a path outside the run dir (when known): no checkpoint
        of this run (a save naming ``/etc``), for every view."""
        run = self.run_dir
        return isinstance(path, str) and run is not None and not in_run_dir(run, path)

    def _save(self, rec: Mapping[str, Any], data: Mapping[str, Any], step: int | None) -> None:
        path = data.get("checkpoint_path")
        if step is None:
            return
        if isinstance(path, str) and path and not self.outside(path):
            key = checkpoint_key(path)
            # a fresh checkpoint of that name: what was known of an older one is not its own
            fate = self._fates[key] = CheckpointFate(
                key,
                canonical_checkpoint(self.run_dir, path),
                step,
                run_id=self.run_id,
                attempt=int_or_none(rec.get("attempt")),
                saved_ts=finite_number(rec.get("ts")),
                trigger=data.get("trigger"),
                saved=True,
            )
            if step in self._pending_eval:
                fate.metrics.update(self._pending_eval[step])
        # validations before this save belong to no checkpoint: forget them
        self._pending_eval = {s: v for s, v in self._pending_eval.items() if s > step}

    def _report(
        self,
        fate: CheckpointFate,
        rec: Mapping[str, Any],
        data: Mapping[str, Any],
        step: int | None,
    ) -> None:
        metrics = data.get("metrics")
        metrics = dict(metrics) if isinstance(metrics, Mapping) else {}
        if fate.removed is None:  # a report about a removed checkpoint does not bring it back
            fate.metrics.update(
                {k: v for k, x in metrics.items() if (v := finite_number(x)) is not None}
            )
        fate.reports.append(
            ReportSeen(
                metrics,
                str_or_none(data.get("source")),
                step,
                finite_number(rec.get("ts")),
                self.ended,
            )
        )
        if len(fate.reports) > MAX_REPORTS_PER_CHECKPOINT:
            del fate.reports[0]

    @property
    def fates(self) -> list[CheckpointFate]:
        """Every checkpoint of the run, in step order (the journal's, for equal steps)."""
        return sorted(self._fates.values(), key=lambda f: -1 if f.step is None else f.step)

    def fate(self, path: str) -> CheckpointFate | None:
        """The checkpoint a path (any spelling) names, if the run has it."""
        return self._fates.get(checkpoint_key(path))

    def reports(self) -> list[tuple[CheckpointFate, ReportSeen]]:
        """Every report of the run with its checkpoint, in the order they landed per
        checkpoint (checkpoints in step order)."""
        return [(f, r) for f in self.fates for r in f.reports]

    def best(
        self, goal: MetricGoal | str, run_dir: str | os.PathLike[str] | None = None
    ) -> BestCheckpoint | None:
        """The best checkpoint by ``goal`` (``accuracy:max``) among those not removed (and,
        with ``run_dir``, still on disk); among equal values the earliest saved."""
        goal = MetricGoal.parse(goal) if isinstance(goal, str) else goal
        ranked = [
            (v, f)
            for f in self.fates
            if f.removed is None and (v := f.metrics.get(goal.metric)) is not None
        ]
        ranked.sort(key=lambda e: e[0], reverse=goal.mode == "max")  # stable: earliest first
        for value, f in ranked:
            if run_dir is None or on_disk(run_dir, f.path):
                return BestCheckpoint(f.path, goal.metric, value, f.step)
        return None

    def to_state(self) -> dict[str, Any]:
        """What was folded, as JSON types (the journal index stores it)."""
        return {
            "run_id": self.run_id,
            "ended": self.ended,
            "fates": [asdict(f) for f in self._fates.values()],
            "pending_eval": {str(k): v for k, v in self._pending_eval.items()},
        }

    @classmethod
    def from_state(
        cls, state: dict[str, Any], run_dir: str | os.PathLike[str] | None = None
    ) -> CheckpointLedger:
        """The inverse of :meth:`to_state` (KeyError/TypeError on a foreign state)."""
        ledger = cls(run_dir)
        ledger.run_id, ledger.ended = state["run_id"], bool(state["ended"])
        for raw in state["fates"]:
            raw = dict(raw)
            removed, reports = raw.pop("removed"), raw.pop("reports")
            fate = CheckpointFate(**raw)
            fate.removed = Removal(**removed) if removed else None
            fate.reports = [ReportSeen(**r) for r in reports]
            ledger._fates[fate.key] = fate
        ledger._pending_eval = {int(k): dict(v) for k, v in state["pending_eval"].items()}
        return ledger
