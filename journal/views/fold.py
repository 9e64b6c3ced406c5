"""One fold of a run: what every view says about it.

``status``, ``query --best``, ``check``, ``serve``, ``plot``, the exporters' stories and
``backtest``'s retention all read a :class:`RunFold` instead of folding raw records on their
own, so they cannot disagree with each other. It is built incrementally (``add`` one record
at a time, in journal order), so a long-lived reader such as ``serve`` keeps one and feeds it
what the journal gained.

What it holds, for the journal's current run (its last ``run_id``) and every attempt of it:

- the status fields of :class:`~journal.views.summary.RunSummary` (state, progress, who
  stopped it), through the summarizer it owns;
- every checkpoint with its fate (:class:`CheckpointFate`): saved when and at which step,
  removed (when, why, by whom) or not, the reports about it as they land (after
  ``train_end`` too) and the scheduler jobs that evaluated it;
- the best checkpoint by any metric, taken from the reports and validations of the
  checkpoints that are still there, never from a snapshot some record carries;
- the control commands with their verdicts and senders, and the attempts.

What the disk says at the moment of asking (leases held, a checkpoint deleted by hand) is
added by :meth:`RunFold.checkpoints` and :meth:`RunFold.best`, given the run dir.

A checkpoint is known by :func:`~journal.rundir.paths.checkpoint_key` (its ``step-NNNNNN``
name), so the same checkpoint journaled once with an absolute path (the trainer's save) and
once relative to another process's working directory (an old watcher's removal) is one row,
shown at its canonical path (:func:`~journal.rundir.paths.canonical_checkpoint`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from journal.rundir.paths import canonical_checkpoint, checkpoint_key
from journal.views.best import BestCheckpoint, MetricGoal, on_disk
from journal.views.summary import RunSummary, Summarizer

#: How many commands the fold keeps (a flood of refused commands must not grow a reader
#: without bound); the count of all of them is kept.
MAX_COMMANDS = 1000
#: How many reports one checkpoint keeps (the latest; the metrics keep every name's latest).
MAX_REPORTS_PER_CHECKPOINT = 50


def _number(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _text(v: Any) -> str | None:
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


@dataclass
class CommandSeen:
    """A control command's verdict: applied at which step, or refused and why; who sent it."""

    id: str
    command: str
    accepted: bool
    applied_at_step: int | None
    source: str | None
    reason: str | None
    error: str | None
    step: int | None  # the step of the record that journaled the verdict
    ts: float | None


@dataclass
class Attempt:
    """One attempt of the run: where it began, what it resumed from, how it ended."""

    attempt: int | None
    run_id: str | None
    step: int
    ts: float | None
    resumed_from: str | None
    status: str | None = None  # its train_end's status (None: no train_end yet)
    reason: str | None = None


@dataclass
class CheckpointView:
    """A checkpoint as the views show it now: the fold's fate plus what the disk says."""

    fate: CheckpointFate
    on_disk: bool
    best: bool  # the run's best by its keep_best goal (rotation keeps it)
    leases: list[dict[str, Any]]  # unexpired leases on it: holder, expires

    @property
    def state(self) -> str:
        """One word: ``removed``, ``leased``, ``on_disk`` or ``missing`` (gone from disk
        without a removal record: deleted by hand, or never written)."""
        if self.fate.removed is not None:
            return "removed"
        if not self.on_disk:
            return "missing"
        return "leased" if self.leases else "on_disk"

    def to_dict(self) -> dict[str, Any]:
        f = self.fate
        return {
            "key": f.key,
            "path": f.path,
            "name": f.name,
            "step": f.step,
            "run_id": f.run_id,
            "attempt": f.attempt,
            "saved_ts": f.saved_ts,
            "trigger": f.trigger,
            "saved": f.saved,
            "state": self.state,
            "on_disk": self.on_disk,
            "best": self.best,
            "removed": asdict(f.removed) if f.removed is not None else None,
            "kept": f.kept,
            "leases": self.leases,
            "metrics": dict(f.metrics),
            "reports": [asdict(r) for r in f.reports],
            "jobs": list(f.jobs.values()),
        }


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
        """Fold one record (any event; only :attr:`EVENTS` matter)."""
        event = rec.get("event")
        if event not in self.EVENTS:
            return
        data = rec.get("data")
        if not isinstance(data, Mapping):
            return
        step = _int(rec.get("step"))
        if event == "save":
            self._save(rec, data, step)
        elif event == "evaluate":
            values = {k: v for k, x in data.items() if (v := _number(x)) is not None}
            if step is not None and values:
                self._pending_eval[step] = values
        elif event == "report":
            self._report(rec, data, step)
        elif event == "checkpoint_removed":
            self._removed(rec, data, step)
        elif event == "checkpoint_kept":
            fate = self._fate(data.get("checkpoint_path"), step)
            if fate is not None:
                fate.kept = _text(data.get("reason")) or "kept"
        elif event == "job":
            self._job(data)

    def new_run(self, run_id: str | None) -> None:
        """A ``train_begin`` of another run: its checkpoints are its own."""
        self.run_id = run_id
        self._fates = {}
        self._pending_eval = {}
        self.ended = False

    def _fate(self, path: Any, step: int | None) -> CheckpointFate | None:
        """The checkpoint a record names (created on first sight: a report or a removal may
        name one whose save this reader never saw, e.g. a journal rotated since)."""
        if not isinstance(path, str) or not path:
            return None
        key = checkpoint_key(path)
        fate = self._fates.get(key)
        if fate is None:
            fate = self._fates[key] = CheckpointFate(
                key, canonical_checkpoint(self.run_dir, path), step, run_id=self.run_id
            )
        return fate

    def _save(self, rec: Mapping[str, Any], data: Mapping[str, Any], step: int | None) -> None:
        path = data.get("checkpoint_path")
        if step is None:
            return
        if isinstance(path, str) and path:
            key = checkpoint_key(path)
            # a fresh checkpoint of that name: what was known of an older one is not its own
            fate = self._fates[key] = CheckpointFate(
                key,
                canonical_checkpoint(self.run_dir, path),
                step,
                run_id=self.run_id,
                attempt=_int(rec.get("attempt")),
                saved_ts=_number(rec.get("ts")),
                trigger=data.get("trigger"),
                saved=True,
            )
            if step in self._pending_eval:
                fate.metrics.update(self._pending_eval[step])
        # validations before this save belong to no checkpoint: forget them
        self._pending_eval = {s: v for s, v in self._pending_eval.items() if s > step}

    def _report(self, rec: Mapping[str, Any], data: Mapping[str, Any], step: int | None) -> None:
        fate = self._fate(data.get("checkpoint_path"), _int(data.get("step")))
        if fate is None:
            return
        metrics = data.get("metrics")
        metrics = dict(metrics) if isinstance(metrics, Mapping) else {}
        if fate.removed is None:  # a report about a removed checkpoint does not bring it back
            fate.metrics.update({k: v for k, x in metrics.items() if (v := _number(x)) is not None})
        fate.reports.append(
            ReportSeen(metrics, _text(data.get("source")), step, _number(rec.get("ts")), self.ended)
        )
        if len(fate.reports) > MAX_REPORTS_PER_CHECKPOINT:
            del fate.reports[0]

    def _removed(self, rec: Mapping[str, Any], data: Mapping[str, Any], step: int | None) -> None:
        fate = self._fate(data.get("checkpoint_path"), None)
        if fate is None:
            return
        fate.removed = Removal(
            step,
            _number(rec.get("ts")),
            _text(data.get("reason")) or "removed",
            _text(data.get("by")),
            self.ended,
        )

    def _job(self, data: Mapping[str, Any]) -> None:
        fate = self._fate(data.get("checkpoint_path"), _int(data.get("step")))
        if fate is None:
            return
        job_id = str(data.get("job_id"))
        fate.jobs[job_id] = {
            k: data.get(k)
            for k in ("job_id", "scheduler", "state", "node", "exit_code", "hook", "log_path")
        }

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
            removed = raw.pop("removed")
            reports = raw.pop("reports")
            fate = CheckpointFate(**raw)
            fate.removed = Removal(**removed) if removed else None
            fate.reports = [ReportSeen(**r) for r in reports]
            ledger._fates[fate.key] = fate
        ledger._pending_eval = {int(k): dict(v) for k, v in state["pending_eval"].items()}
        return ledger


class RunFold:
    """The one fold of a run (see the module's docstring). Feed it records in journal order
    with :meth:`add`; ask it with :meth:`summary`, :meth:`checkpoints`, :meth:`best`,
    :attr:`commands`, :attr:`attempts` and :meth:`reports`.

    ``run_dir``: the run's directory, for canonical checkpoint paths and for what the disk
    says (None: the paths as journaled, normalized; nothing looked up on disk)."""

    #: Events beyond the ledger's that this fold looks at (the rest go to the summarizer).
    _OWN = frozenset({"train_begin", "train_end", "control"})

    def __init__(self, run_dir: str | os.PathLike[str] | None = None) -> None:
        self.run_dir = os.path.abspath(run_dir) if run_dir is not None else None
        self.summarizer = Summarizer()
        self.ledger = CheckpointLedger(run_dir)
        self.commands: list[CommandSeen] = []
        self.command_count = 0
        self.attempts: list[Attempt] = []

    @property
    def run_id(self) -> str | None:
        return self.ledger.run_id

    @property
    def ended(self) -> bool:
        return self.ledger.ended

    # -- folding ----------------------------------------------------------------------------

    def add(self, rec: Mapping[str, Any]) -> None:
        """Fold one record (any event), in journal order."""
        self.summarizer.add(rec)  # type: ignore[arg-type]
        event = rec.get("event")
        if event in CheckpointLedger.EVENTS:
            self.ledger.add(rec)
        elif event in self._OWN:
            data = rec.get("data")
            data = data if isinstance(data, Mapping) else {}
            if event == "control":
                self._control(rec, data)
            elif event == "train_begin":
                self._begin(rec, data)
            else:  # train_end
                self.ledger.ended = True
                if self.attempts:
                    self.attempts[-1].status = _text(data.get("status")) or "failed"
                    self.attempts[-1].reason = _text(data.get("reason"))

    def add_batch(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            self.add(rec)

    def _begin(self, rec: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        run_id = _text(rec.get("run_id"))
        if run_id != self.ledger.run_id or not self.attempts:
            self.ledger.new_run(run_id)
            self.commands, self.command_count, self.attempts = [], 0, []
        self.ledger.ended = False
        self.attempts.append(
            Attempt(
                _int(rec.get("attempt")),
                run_id,
                _int(rec.get("step")) or 0,
                _number(rec.get("ts")),
                _text(data.get("resumed_from")),
            )
        )

    def _control(self, rec: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        command = data.get("command")
        if not isinstance(command, str):  # a refused inbox file: the summarizer counts it
            return
        self.command_count += 1
        self.commands.append(
            CommandSeen(
                str(data.get("id")),
                command,
                data.get("accepted") is not False,
                _int(data.get("applied_at_step")),
                _text(data.get("source")),
                _text(data.get("reason")),
                _text(data.get("error")),
                _int(rec.get("step")),
                _number(rec.get("ts")),
            )
        )
        if len(self.commands) > MAX_COMMANDS:
            del self.commands[0]

    # -- asking -----------------------------------------------------------------------------

    @property
    def fates(self) -> list[CheckpointFate]:
        """Every checkpoint of the run, in step order."""
        return self.ledger.fates

    def reports(self) -> list[tuple[CheckpointFate, ReportSeen]]:
        return self.ledger.reports()

    def best(
        self, goal: MetricGoal | str, run_dir: str | os.PathLike[str] | None = None
    ) -> BestCheckpoint | None:
        """The best checkpoint by ``goal`` (see :meth:`CheckpointLedger.best`); ``run_dir``
        defaults to the fold's."""
        return self.ledger.best(goal, run_dir if run_dir is not None else self.run_dir)

    def keep_best(self) -> MetricGoal | None:
        """The run's own ``--keep-best`` goal (train_begin's config), if it has one."""
        text = self.summarizer.summary.keep_best
        try:
            return MetricGoal.parse(text) if text else None
        except ValueError:
            return None

    def checkpoints(
        self, run_dir: str | os.PathLike[str] | None = None, now: float | None = None
    ) -> list[CheckpointView]:
        """Every checkpoint as it stands now: the fold's fates, and with a run dir (the
        fold's by default) what the disk says: on disk or gone, the leases held on it."""
        from journal.checkpoints import leases

        run_dir = run_dir if run_dir is not None else self.run_dir
        goal = self.keep_best()
        best = self.ledger.best(goal, run_dir) if goal else None
        held: dict[str, list[dict[str, Any]]] = {}
        if run_dir is not None:
            for lease in leases.active(run_dir, now=time.time() if now is None else now):
                held.setdefault(checkpoint_key(lease.checkpoint), []).append(
                    {"holder": lease.holder, "expires": lease.expires, "id": lease.id}
                )
        out = []
        for f in self.fates:
            there = f.removed is None and (run_dir is None or on_disk(run_dir, f.path))
            is_best = best is not None and checkpoint_key(best.checkpoint_path) == f.key
            out.append(CheckpointView(f, there, is_best, held.get(f.key, []) if there else []))
        return out

    def summary(
        self,
        *,
        stale_after: float | None = None,
        now: float | None = None,
        run_dir: str | os.PathLike[str] | None = None,
    ) -> RunSummary:
        """``status``'s answer: the summarizer's, with the best checkpoint by the run's
        ``keep_best`` from this fold's ledger (a copy: asking changes nothing)."""
        run_dir = run_dir if run_dir is not None else self.run_dir
        s = self.summarizer.result(stale_after=stale_after, now=now)
        goal = self.keep_best()
        best = self.ledger.best(goal, run_dir) if goal else None
        return replace(s, best_checkpoint=best.to_dict() if best else None)

    def to_state(self) -> dict[str, Any]:
        """Everything folded so far, as JSON types (the journal index stores it)."""
        return {
            "summarizer": self.summarizer.to_state(),
            "ledger": self.ledger.to_state(),
            "commands": [asdict(c) for c in self.commands],
            "command_count": self.command_count,
            "attempts": [asdict(a) for a in self.attempts],
        }

    @classmethod
    def from_state(
        cls, state: dict[str, Any], run_dir: str | os.PathLike[str] | None = None
    ) -> RunFold:
        """The inverse of :meth:`to_state` (KeyError/TypeError on a foreign state)."""
        fold = cls(run_dir)
        fold.summarizer = Summarizer.from_state(state["summarizer"])
        fold.ledger = CheckpointLedger.from_state(state["ledger"], run_dir)
        fold.commands = [CommandSeen(**c) for c in state["commands"]]
        fold.command_count = int(state["command_count"])
        fold.attempts = [Attempt(**a) for a in state["attempts"]]
        return fold
