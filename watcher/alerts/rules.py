"""The alerts a watcher raises from the journal's records: a run that failed, diverged or
was stopped, a ``--notify-when`` condition that holds; a completed run when asked.

:class:`AlertRules` is a callback object the watcher delivers records to, in journal order,
on a queue of its own (a slow target never holds other hooks back: the rules only hand
alerts to their sink, which returns at once). It reads every record (none coalesced away),
so a NaN loss between two log records is never missed.

- ``failed``: a ``train_end`` with status ``failed`` (its error in one line, what follows
  it as its launcher's relaunch rule says, and for workers that ended without one, the
  last lines of the log of the rank that ended first: the log is its evidence), unless
  the guard's ``hang`` or ``died`` alert of that attempt said it first. The last failure
  of a launch that relaunched its run (``max_restarts``) and relaunches it no more is
  always said, with each of the launch's attempts' causes.
- ``stopped``: a ``train_end`` with status ``stopped``, naming who stopped it (``status``'s
  ``stop_source`` and the command's sender).
- ``diverged``: the :class:`~watcher.builtin.steering.DivergenceDetector` fired on a ``log``
  record (a NaN/Inf loss at once); the settings of ``--divergence`` when given (the same
  detector that steers then alerts), its defaults otherwise. Its state starts over with
  each attempt, so an attempt resumed after a divergence is judged on its own losses.
- ``completed``: a ``train_end`` with status ``completed``, only when asked.
- ``condition``: a ``--notify-when`` expression in ``ilab-journal check``'s grammar holds for
  the run's fold (journal/ask/: the same facts and metric functions), checked after each
  batch of records the watcher reads together (live: every few records), and at each
  attempt's ``train_end`` and before the next attempt's ``train_begin``, so every attempt
  is judged on its own however a replay batches them.

One alert per condition per attempt: the sink drops repeats (their identities are claimed
in the run's ledger, journal/rundir/ledger.py, by whichever process raised them first). On
a restart the records before the watcher's cursor only rebuild state; the last attempt's
state is then judged once, so an alert the previous watcher never raised is raised now and
one it raised is not raised again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from journal.ask.expect import Expectation
from journal.ask.facts import FactFolder
from journal.record.events import EVENTS
from journal.record.record import Record
from journal.rundir.paths import resolve_journal
from watcher.alerts.alert import Alert, AlertSink
from watcher.builtin.steering import DivergenceDetector, record_metrics
from watcher.hooks.callbacks import Event

log = logging.getLogger("watcher")

#: The kinds ``--notify-on`` chooses from, and those on by default (all but completed: a
#: run that ends well is news only to whoever asks for it). ``recovered`` (a hang cleared)
#: and ``guard_stopped`` are raised by the guard: without them, journaled but not told.
NOTIFY_KINDS: tuple[str, ...] = (
    "hang",
    "recovered",
    "died",
    "failed",
    "diverged",
    "stopped",
    "completed",
    "guard_stopped",
)
DEFAULT_KINDS: frozenset[str] = frozenset(NOTIFY_KINDS) - {"completed"}
#: What the rules read without ``--notify-when`` (with it: every event, for its facts).
_RULE_EVENTS = ("train_begin", "log", "evaluate", "report", "control", "train_end", "alert")


class AlertRules:
    """The watcher's alert rules (see the module's docstring), as a callback object.

    Args:
        sink: where the alerts go (an :class:`~watcher.alerts.sink.AlertDispatcher`).
        conditions: parsed ``--notify-when`` expressions.
        kinds: the kinds to raise (``--notify-on``); ``condition`` is raised whenever
            ``conditions`` are given.
        divergence: the detector of ``--divergence``'s settings (None: its defaults).
        run_dir: the run's directory (the fold's checkpoints and best metrics).
    """

    #: its name in cursors and results
    callback_label = "watcher.alerts.AlertRules"
    deliver_every_record = True  # a NaN between two log records is never coalesced away

    def __init__(
        self,
        sink: AlertSink,
        *,
        conditions: Sequence[Expectation] = (),
        kinds: Collection[str] = DEFAULT_KINDS,
        divergence: DivergenceDetector | None = None,
        run_dir: Path | None = None,
    ) -> None:
        self.sink = sink
        self.conditions = list(conditions)
        self.kinds = frozenset(kinds)
        self.detector = divergence if divergence is not None else DivergenceDetector()
        self.steers = divergence is not None
        self.folder = FactFolder(set().union(*(c.metrics for c in self.conditions)), run_dir)
        self.subscribed_events: tuple[str, ...] = EVENTS if self.conditions else _RULE_EVENTS
        # left out of ilab-watch's default cursor name: adding --notify to a watcher must
        # not start it over under a new name (its hooks would deliver everything again)
        self.context_events = self.subscribed_events
        self._warned_metrics: set[str] = set()
        self._reason = ""  # the detector's last reason (a divergence found in the history)
        self._begun: tuple[Any, Any] | None = None  # (run id, attempt) of the last train_begin
        self._causes: list[tuple[Any, str]] = []  # (attempt, error) per failure of a launch

    # -- the callback object's hooks ------------------------------------------------------

    def on_train_begin(self, event: Event, **data: Any) -> None:
        if (event.run_id, event.attempt) != self._begun:
            self._conditions()  # the attempt before, as it stood at its last record
        self._fold(event.record)

    def _measured(self, event: Event, **data: Any) -> None:
        """A ``log``, ``evaluate`` or ``report`` record: the detector's, if of its event
        (``--divergence metric=<a reported metric>`` watches reports)."""
        self._fold(event.record)
        if self.detector.event == event.name:
            self._diverged(event.record, live=True)

    on_log = on_evaluate = on_report = _measured

    def on_train_end(self, event: Event, **data: Any) -> None:
        self._fold(event.record)
        self._ended(event.record)
        self._conditions()  # each attempt is judged at its end, however records were batched
        self._warn_unknown_metrics()

    def _any(self, event: Event, **data: Any) -> None:
        self._fold(event.record)

    def after_deliveries(self) -> None:
        """After each batch of records: the ``--notify-when`` conditions."""
        self._conditions()

    def restore_state(self, records: list[Record]) -> None:
        """The records before the watcher's start: folded, then the last attempt judged once
        (its end, its divergence, the conditions); the sink drops what alerted already."""
        end: Record | None = None
        diverged: Record | None = None
        for rec in records:
            self._fold(rec)
            event = rec.get("event")
            if event == "train_begin":
                end = diverged = None
            elif event == "train_end":
                end = rec
            elif event == self.detector.event and self._diverged(rec, live=False):
                diverged = rec
        if diverged is not None:
            self._raise_diverged(diverged, self._reason)
        if end is not None:
            self._ended(end)
        self._conditions()

    # -- the rules --------------------------------------------------------------------------

    def _fold(self, rec: Record) -> None:
        event, data = rec.get("event"), rec.get("data") or {}
        if event == "train_begin":
            begun = (rec.get("run_id"), rec.get("attempt"))
            if begun != self._begun:  # a new attempt: its own losses judge it
                self._begun = begun
                self.detector.reset()
        self.folder.add_batch([rec])
        if event == "train_end" and data.get("status") == "failed":
            if not data.get("restart"):  # a launch's first attempt (or one never relaunched)
                self._causes = []
            error = self.folder.fold.summary().error or data.get("reason") or "no error recorded"
            self._causes.append((rec.get("attempt"), _one_line(str(error))))

    def _diverged(self, rec: Record, *, live: bool) -> bool:
        """Feed the detector; True (and, live, an alert) when it fires."""
        if "diverged" not in self.kinds:
            return False
        data = rec.get("data") or {}
        reason = self.detector.observe(record_metrics(rec.get("event"), data))
        if reason is None:
            return False
        self._reason = reason
        if live:
            self._raise_diverged(rec, reason)
        return True

    def _raise_diverged(self, rec: Record, reason: str) -> None:
        ends = f"--divergence ends the run (action={self.detector.action})"  # its detector acts
        goes_on = "training goes on: an alert stops nothing (ilab-watch --divergence would)"
        what = f"{reason.removeprefix('divergence: ')}; {ends if self.steers else goes_on}"
        self._raise("diverged", rec, what)

    def _ended(self, rec: Record) -> None:
        data = rec.get("data") or {}
        status = data.get("status")
        if status not in ("failed", "stopped", "completed") or status not in self.kinds:
            return
        restarts, follows = data.get("restart"), data.get("relaunch")  # the launcher's rule
        gave_up = status == "failed" and bool(restarts) and data.get("restarts_left") == 0
        if status == "failed" and not gave_up and self._said_already(rec, data):
            return
        first = data.get("first_failure")  # the rank that ended first: its log's last lines
        log = first.get("log") if status == "failed" and isinstance(first, dict) else None
        quoted = isinstance(log, str)
        if gave_up:
            causes = "; ".join(f"attempt {a}: {error}" for a, error in self._causes)
            message = f"the run failed after {restarts} restart(s); {follows}: {causes}"
        elif status == "failed":
            message = f"the run failed: {self._causes[-1][1]}"
            if data.get("written_by") == "launcher" and not quoted:
                message += " (its workers wrote no train_end: the launcher did)"
            message += f"; {follows}" if follows else ""
        elif status == "stopped":
            summary = self.folder.fold.summary()
            who = summary.stop_source or "unknown"
            if summary.stopped_by:
                who += f" ({summary.stopped_by})"
            message = f"the run was stopped by {who}"
            if data.get("reason"):
                message += f": {_one_line(str(data['reason']))}"
        else:
            message = f"the run completed at step {rec['step']}"
            if data.get("final_checkpoint"):
                message += f"; final checkpoint {data['final_checkpoint']}"
        if quoted:
            lines = str(data.get("error_message") or "").partition("\n")[2]
            message = f"{message}\n{lines}".rstrip()
        self._raise(str(status), rec, message, (log,) if isinstance(log, str) else ())

    def _said_already(self, rec: Record, data: dict[str, Any]) -> bool:
        """A failed end the guard's alert said first: an attempt it aborted as hung, or one
        whose processes it found dead or hung (the launcher's ``train_end`` follows its
        alert); a hang that recovered said nothing of this end."""
        if data.get("aborted_for") == "hang":
            return True
        fold = self.folder.fold  # journaled, or claimed by any guard and not journaled yet
        seen = fold.alerts_now(fold.run_dir, time.time())[0]
        over = {a.resolves for a in seen}
        return any(
            a.kind in ("hang", "died") and a.attempt == rec["attempt"] and a.id not in over
            for a in seen
        )

    def _conditions(self) -> None:
        if not self.conditions or self._begun is None:
            return  # no attempt yet: a run that has not begun holds nothing
        fold = self.folder.fold
        summary = fold.summary()
        names = [r.name for c in self.conditions for r in c.refs]
        facts = self.folder.facts(summary, names)
        for cond in self.conditions:
            if not cond.holds(facts):
                continue
            values = ", ".join(f"{k} = {_show(v)}" for k, v in cond.values(facts).items())
            report = summary.last_report or {}  # the checkpoint its metrics are about
            if cond.metrics & set(report.get("metrics") or {}):
                where = f"reported for checkpoint {report.get('checkpoint_path')}"
            else:
                where = f"newest checkpoint {summary.last_checkpoint or '(none yet)'}"
            alert = Alert(
                kind="condition",
                message=f"{cond.text} holds ({values}); {where}",
                step=summary.last_step,
                attempt=summary.attempt,
                condition=cond.text,
                run_id=summary.run_id,
            )
            self.sink.raise_alert(alert)

    def _raise(self, kind: Any, rec: Record, message: str, evidence: tuple[str, ...] = ()) -> None:
        alert = Alert(
            kind, message, rec["step"], rec["attempt"], run_id=rec["run_id"], evidence=evidence
        )
        self.sink.raise_alert(alert)

    def _warn_unknown_metrics(self) -> None:
        """At the run's end: a ``--notify-when`` metric it never had is likely a typo (one
        line naming the closest metric it has, as ``check`` would refuse it)."""
        from journal.ask.facts import known_metrics
        from journal.ask.names import unknown_metric

        values = self.folder.values
        missing = {m for m in self.folder.metrics if not values[m].values} - self._warned_metrics
        run_dir = self.folder.fold.run_dir
        if not missing or run_dir is None:
            return
        self._warned_metrics |= missing
        keep_best = self.folder.fold.summarizer.summary.keep_best
        try:
            known = known_metrics(resolve_journal(run_dir), keep_best)
        except (OSError, ValueError):
            return
        for metric in sorted(missing - known):
            cond, ref = next(
                (c.text, r.name)
                for c in self.conditions
                for r in c.refs
                if r.metric and r.metric.metric.partition(":")[0] == metric
            )
            log.warning("--notify-when %r: %s", cond, unknown_metric(ref, metric, known))


# With --notify-when every event is read (its facts: steps, records, ...): the events with
# no rule of their own are folded only.
for _event in EVENTS:
    if not hasattr(AlertRules, f"on_{_event}"):
        setattr(AlertRules, f"on_{_event}", AlertRules._any)


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[-1] if lines and lines[0].startswith("Traceback") else (lines[0] if lines else "")
    return line if len(line) <= 500 else line[:499] + "…"


def _show(v: object) -> str:
    if v is None:
        return "none"
    return f"{v:.6g}" if isinstance(v, float) else str(v)
