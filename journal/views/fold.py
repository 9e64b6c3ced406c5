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
- the control commands with their verdicts and senders, and the attempts;
- the alerts a watcher raised (``alert`` records, joined by id with their ``alert_told``:
  which ``--notify`` targets were told), of every attempt of the run; a ``recovered`` one
  resolves a hang (it is no alert of its own in the count).

What the disk says at the moment of asking (a checkpoint deleted by hand, the leases held,
the alerts raised that the journal has not got yet and the guards watching the run: the
alert ledger, journal/rundir/ledger.py) is added by :meth:`RunFold.checkpoints`,
:meth:`RunFold.best` and :meth:`RunFold.summary`, given the run dir.

A checkpoint is known by :func:`~journal.rundir.paths.checkpoint_key` (its ``step-NNNNNN``
name), so the same checkpoint journaled once with an absolute path (the trainer's save) and
once relative to another process's working directory (an old watcher's removal) is one row,
shown at its canonical path (:func:`~journal.rundir.paths.canonical_checkpoint`).

The metric points of a record (:func:`metric_points`) are read by ``check``, ``backtest``,
``serve`` and every exporter, with one number rule: a finite int or float, not a bool. NaN
and infinities are no point (a journal never holds them: its reader refuses them; a record
a bridge hands an exporter may); a NaN loss is told by its own record (``loss`` null,
``loss_finite`` false), which the divergence detector and the alerts read.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from journal.record.fields import accepted
from journal.record.record import Record
from journal.rundir.ledger import claims, guards
from journal.rundir.paths import checkpoint_key
from journal.views.best import BestCheckpoint, MetricGoal, on_disk
from journal.views.ledger import (
    CheckpointFate,
    CheckpointLedger,
    ReportSeen,
    finite_number,
    int_or_none,
    str_or_none,
)
from journal.views.summary import RunSummary, Summarizer

#: Numbers of a ``log`` or ``evaluate`` record that are no metric: counters, a flag, a
#: token count and the record's own timing (a bridge's other numbers are metrics; GPU
#: memory is one: what a run is sized by, charted and exported).
NOT_METRICS = frozenset({"samples_seen", "loss_finite", "duration", "val_num_tokens"})
#: The series each metric record adds to: ``train/*``, ``eval/*``, ``report/*``.
METRIC_KINDS = {"log": "train", "evaluate": "eval", "report": "report"}

#: How many commands the fold keeps (a flood of refused commands must not grow a reader
#: without bound); the count of all of them is kept. The same for alerts.
MAX_COMMANDS = 1000
MAX_ALERTS = 1000


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
class AlertSeen:
    """An ``alert`` record, with what its ``alert_told`` said once it came: ``told``, the
    targets that took it; ``failed``, those given up (``{target, tries, error}``);
    ``targets``, every target it was sent to (None in ``told``: no outcome journaled yet);
    ``resolves``: a recovery's hang; ``journaled``: False for one only the ledger holds yet."""

    id: str
    kind: str
    step: int | None
    attempt: int | None
    message: str
    evidence: list[str]
    missing: list[str]
    condition: str | None
    targets: list[str]
    ts: float | None
    told: list[str] | None = None
    failed: list[dict[str, Any]] = field(default_factory=list)
    resolves: str | None = None
    journaled: bool = True

    @classmethod
    def of(cls, data: Mapping[str, Any], ts: Any, kind: Any) -> AlertSeen | None:
        """An ``alert`` record's payload (or a ledger claim's) as seen; None without an id."""
        aid = data.get("id")
        if not isinstance(aid, str):
            return None
        return cls(
            aid,
            str_or_none(kind) or "?",
            int_or_none(data.get("step")),
            int_or_none(data.get("attempt")),
            str_or_none(data.get("message")) or "",
            _texts(data.get("evidence")),
            _texts(data.get("missing")),
            str_or_none(data.get("condition")),
            _texts(data.get("targets")),
            finite_number(ts),
            resolves=str_or_none(data.get("resolves")),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
        return {
            **asdict(self.fate),  # its removal and reports as dicts too
            "name": self.fate.name,
            "jobs": list(self.fate.jobs.values()),
            "state": self.state,
            "on_disk": self.on_disk,
            "best": self.best,
            "leases": self.leases,
        }


class RunFold:
    """The one fold of a run (see the module's docstring). Feed it records in journal order
    with :meth:`add`; ask it with :meth:`summary`, :meth:`checkpoints`, :meth:`best`,
    :attr:`commands`, :attr:`attempts` and :meth:`reports`.

    ``run_dir``: the run's directory, for canonical checkpoint paths and for what the disk
    says (None: the paths as journaled, normalized; nothing looked up on disk)."""

    #: Events beyond the ledger's that this fold looks at (the rest go to the summarizer).
    _OWN = frozenset({"train_begin", "train_end", "control", "alert", "alert_told"})

    def __init__(self, run_dir: str | os.PathLike[str] | None = None) -> None:
        self.run_dir = os.path.abspath(run_dir) if run_dir is not None else None
        self.summarizer = Summarizer()
        self.ledger = CheckpointLedger(run_dir)
        self.commands: list[CommandSeen] = []
        self.command_count = 0
        self.attempts: list[Attempt] = []
        #: every scheduler job of the run, ``scheduler:job_id`` -> its latest state (one
        #: with no checkpoint too: the ledger keeps a checkpoint's own)
        self.jobs: dict[str, str] = {}
        #: the run's alerts, oldest first (the newest MAX_ALERTS), and how many in all
        self.alerts: list[AlertSeen] = []
        self.alert_count = 0

    @property
    def run_id(self) -> str | None:
        return self.ledger.run_id

    @property
    def ended(self) -> bool:
        return self.ledger.ended

    # -- folding ----------------------------------------------------------------------------

    def add(self, rec: Record) -> bool:
        """Fold one record (any event), in journal order; False for a record of another run
        amid this one's (see :func:`of_other_run`): no view folds it (it is only counted)."""
        if of_other_run(rec, self.summarizer.summary.run_id):
            self.summarizer.summary.records += 1
            return False
        self.summarizer.add(rec)
        event = rec["event"]
        if event in CheckpointLedger.EVENTS:
            self.ledger.add(rec)
            if event == "job":
                data = rec["data"]
                self.jobs[f"{data.get('scheduler')}:{data.get('job_id')}"] = str(data.get("state"))
        elif event in self._OWN:
            data = rec["data"]
            if event == "control":
                self._control(rec, data)
            elif event == "alert":
                self._alert(rec, data)
            elif event == "alert_told":
                self._told(data)
            elif event == "train_begin":
                self._begin(rec, data)
            else:  # train_end
                self.ledger.ended = True
                if self.attempts:
                    self.attempts[-1].status = str_or_none(data.get("status")) or "failed"
                    self.attempts[-1].reason = str_or_none(data.get("reason"))
        return True

    def add_batch(self, records: list[Record]) -> None:
        for rec in records:
            self.add(rec)

    def _begin(self, rec: Record, data: Mapping[str, Any]) -> None:
        run_id = rec["run_id"]
        if run_id != self.ledger.run_id or not self.attempts:
            self.ledger.new_run(run_id)
            self.commands, self.command_count, self.attempts = [], 0, []
            self.jobs = {}
            self.alerts, self.alert_count = [], 0
        self.ledger.ended = False
        self.attempts.append(
            Attempt(
                rec["attempt"],
                run_id,
                rec["step"],
                finite_number(rec["ts"]),
                str_or_none(data.get("resumed_from")),
            )
        )

    def _control(self, rec: Record, data: Mapping[str, Any]) -> None:
        command = data.get("command")
        if not isinstance(command, str):  # a refused inbox file: the summarizer counts it
            return
        self.command_count += 1
        self.commands.append(
            CommandSeen(
                str(data.get("id")),
                command,
                accepted(data),
                int_or_none(data.get("applied_at_step")),
                str_or_none(data.get("source")),
                str_or_none(data.get("reason")),
                str_or_none(data.get("error")),
                rec["step"],
                finite_number(rec["ts"]),
            )
        )
        if len(self.commands) > MAX_COMMANDS:
            del self.commands[0]

    def _alert(self, rec: Record, data: Mapping[str, Any]) -> None:
        seen = AlertSeen.of(data, rec["ts"], data.get("kind"))
        if seen is None or any(a.id == seen.id for a in self.alerts[-8:]):
            return  # a file journaled twice (a crash before it was archived): one alert
        self.alert_count += seen.kind != "recovered"  # a recovery resolves its hang
        self.alerts.append(seen)
        if len(self.alerts) > MAX_ALERTS:
            del self.alerts[0]

    def _told(self, data: Mapping[str, Any]) -> None:
        aid = data.get("id")
        seen = next((a for a in reversed(self.alerts) if a.id == aid), None)
        if seen is None:
            return
        seen.told = _texts(data.get("told"))
        failed = data.get("failed")
        seen.failed = [f for f in failed if isinstance(f, dict)] if isinstance(failed, list) else []

    # -- asking -----------------------------------------------------------------------------

    @property
    def fates(self) -> list[CheckpointFate]:
        """Every checkpoint of the run, in step order."""
        return self.ledger.fates

    @property
    def last_checkpoint(self) -> str | None:
        """The newest checkpoint saved and not removed (its canonical path): the run's last
        checkpoint in MLflow, TensorBoard and W&B alike."""
        return next((f.path for f in reversed(self.fates) if f.saved and f.removed is None), None)

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
        self, run_dir: str | os.PathLike[str] | None = None, leases: Iterable[Any] = ()
    ) -> list[CheckpointView]:
        """Every checkpoint as it stands now: the fold's fates, and with a run dir (the
        fold's by default) what the disk says: on disk or gone; ``leases``: the unexpired
        leases of the run (``journal.checkpoints.leases.active``), shown on theirs."""
        run_dir = run_dir if run_dir is not None else self.run_dir
        goal = self.keep_best()
        best = self.ledger.best(goal, run_dir) if goal else None
        held: dict[str, list[dict[str, Any]]] = {}
        for lease in leases:
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
        ``keep_best`` from this fold's ledger, and the alerts and guards with what the alert
        ledger holds now: a running run with a hang alert and no step since is ``hung``
        (a copy: asking changes nothing)."""
        return self.judged(stale_after=stale_after, now=now, run_dir=run_dir)[0]

    def judged(
        self,
        *,
        stale_after: float | None = None,
        now: float | None = None,
        run_dir: str | os.PathLike[str] | None = None,
    ) -> tuple[RunSummary, list[AlertSeen]]:
        """:meth:`summary`, with the alerts it judged from (:meth:`alerts_now`: the ledger
        read once for both)."""
        run_dir = run_dir if run_dir is not None else self.run_dir
        now = time.time() if now is None else now
        alerts, count = self.alerts_now(run_dir, now)
        problems = [a for a in alerts if a.kind != "recovered"]
        over = {a.resolves: a.ts for a in alerts if a.resolves}
        step, attempt = self.summarizer.summary.last_step, self.summarizer.summary.attempt
        hang = next((a for a in reversed(problems) if a.kind == "hang"), None)
        hung = None  # its attempt's, not recovered, and no step has ended since
        if hang and hang.attempt == attempt and hang.id not in over and (hang.step or 0) >= step:
            hung = f"still running, but a hang alert at step {hang.step} and no step since"
        s = self.summarizer.result(stale_after=stale_after, now=now, hung=hung)
        goal = self.keep_best()
        best = self.ledger.best(goal, run_dir) if goal else None
        last = problems[-1].to_dict() if problems else None
        judged = replace(
            s,
            best_checkpoint=best.to_dict() if best else None,
            alerts=count,
            last_alert=last and {**last, "recovered_at": over.get(last["id"])},
            guards=guards(run_dir, s.run_id) if run_dir is not None else [],
        )
        return judged, alerts

    def alerts_now(
        self, run_dir: str | os.PathLike[str] | None, now: float
    ) -> tuple[list[AlertSeen], int]:
        """The run's alerts and their count with those raised by ``now`` that the journal
        has not got yet (journaled=False): a trainer hung holding the journal journals
        nothing while its hang lasts; the alert ledger (journal/rundir/ledger.py) holds them."""
        if run_dir is None or self.run_id is None:
            return self.alerts, self.alert_count
        known = {a.id for a in self.alerts}
        pending = [
            replace(seen, journaled=False)
            for c in claims(run_dir, self.run_id)
            if (c.get("raised_at") or 0.0) <= now and c.get("id") not in known
            if (seen := AlertSeen.of(c, c.get("raised_at"), c.get("alert"))) is not None
        ]
        return self.alerts + pending, self.alert_count + sum(a.kind != "recovered" for a in pending)

    def to_state(self) -> dict[str, Any]:
        """Everything folded so far, as JSON types (the journal index stores it)."""
        return {
            "summarizer": self.summarizer.to_state(),
            "ledger": self.ledger.to_state(),
            "commands": [asdict(c) for c in self.commands],
            "command_count": self.command_count,
            "attempts": [asdict(a) for a in self.attempts],
            "jobs": self.jobs,
            "alerts": [a.to_dict() for a in self.alerts],
            "alert_count": self.alert_count,
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
        fold.jobs = {str(k): str(v) for k, v in state["jobs"].items()}
        fold.alerts = [AlertSeen(**a) for a in state["alerts"]]
        fold.alert_count = int(state["alert_count"])
        return fold


def metric_points(
    event: str, step: int, data: Mapping[str, Any]
) -> tuple[str, int, dict[str, float]] | None:
    """The metric points a record (its ``event``, ``step`` and ``data``) adds, by the
    module's number rule, as ``(kind, step, {name: value})``: ``train`` for a ``log`` at its
    step, ``eval`` for an ``evaluate``, ``report`` for a report's metrics at its
    checkpoint's step (the record's when it names none); None for any other record.
    :data:`NOT_METRICS` are left out of a ``log`` or ``evaluate``; a report's metrics are
    all the reporter's."""
    kind = METRIC_KINDS.get(event)
    if kind is None:
        return None
    skip: frozenset[str] = NOT_METRICS
    if kind == "report":
        at, got = data.get("step"), data.get("metrics")
        step = at if type(at) is int else step
        data, skip = (got if isinstance(got, dict) else {}), frozenset()
    # inline, not finite_number(): the hot loop of serve and of a replay's exports
    return (
        kind,
        step,
        {
            k: float(v)
            for k, v in data.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in skip
            if math.isfinite(v)
        },
    )


def of_other_run(rec: Record, run_id: str | None) -> bool:
    """Whether ``rec`` is a record of another run amid the run ``run_id``'s: not a
    ``train_begin`` (which starts a run) and naming another run id. Every writer of a run
    (its attempts, the guests that join them) journals under its id: such a record was put
    there by hand or by a foreign writer, and counts for no view (``check`` reads the fold's
    rule too)."""
    other = rec["run_id"]
    return other != run_id and None not in (other, run_id) and rec["event"] != "train_begin"


def _texts(value: Any) -> list[str]:
    """A list of strings from a record (anything else in it dropped: a reader never trips)."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
