"""Fold a journal into what people and scripts ask about: state, progress, phases."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from journal.record.fields import accepted
from journal.record.record import Record
from journal.views.ledger import int_or_none, str_or_none
from journal.views.stops import ending

#: Exit codes of ``ilab-journal status``, one per state (documented in docs/cli.md).
STATE_EXIT_CODES: dict[str, int] = {
    "completed": 0,
    "failed": 1,
    # 2 is reserved for usage errors (click's convention).
    "running": 3,
    "starting": 3,  # the launcher holds the directory, no record yet: running soon
    "stopped": 4,
    "interrupted": 5,
    "stale": 6,
    "empty": 7,
    "hung": 8,  # running, but a hang alert and no step since (docs/alerts.md)
}


@dataclass
class RunSummary:
    """The state of the latest attempt in a journal."""

    run_id: str | None = None
    attempt: int | None = None
    state: str = "empty"
    reason: str | None = None
    last_step: int = 0
    total_steps: int | None = None
    epoch: int = 0
    samples_seen: int = 0
    last_checkpoint: str | None = None
    last_loss: float | None = None
    last_lr: float | None = None
    last_val_loss: float | None = None
    last_ts: float | None = None
    started_ts: float | None = None
    records: int = 0
    invalid_lines: int = 0
    hostname: str | None = None
    pid: int | None = None
    error: str | None = None
    keep_best: str | None = None  # the run's METRIC:max|min, when it keeps the best
    keep_last_n: int | None = None  # the run's rotation (train_begin's config)
    #: by keep_best, from reports/evaluate: filled by the run's fold (journal/views/fold.py)
    best_checkpoint: dict[str, Any] | None = None
    reports: int = 0
    last_report: dict[str, Any] | None = None  # checkpoint_path, step, metrics
    holder: dict[str, Any] | None = None  # the launcher holding the directory now
    unapplied_commands: int = 0  # command files in control/ after train_end: never applied
    #: an ended run's checkpoints beyond keep_last_n that no lease holds any more (their
    #: holders died): ``ilab-journal prune`` removes them; and the expired leases on them
    prunable_checkpoints: list[str] = field(default_factory=list)
    expired_leases: int = 0
    refused_reports: int = 0  # report files refused when journaled (journal.channels.reports)
    #: who ended the run: a word of journal.views.stops.STOP_KINDS (eval, operator, ...) and
    #: the ending command's source string (None: no command ended it)
    stop_source: str | None = None
    stopped_by: str | None = None
    #: the run's alerts (``alert`` records, every attempt) and the newest one: id, kind,
    #: step, message, evidence, told, ... (filled by the run's fold, journal/views/fold.py)
    alerts: int = 0
    last_alert: dict[str, Any] | None = None
    #: the guards watching the run (their heartbeats: journal/rundir/ledger.py)
    guards: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pid_gone(hostname: str | None, pid: int | None) -> bool:
    """True only when we can tell for sure: same host and no such process."""
    if not hostname or not pid or pid < 0 or hostname != os.uname().nodename:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):  # not ours, or no pid at all
        return False
    return False


#: Commands that end a run (their source says who stopped it).
_ENDERS = frozenset({"stop", "abort"})
#: RunSummary fields computed when a result is asked for, never folded.
_DERIVED = frozenset(
    {"best_checkpoint", "holder", "prunable_checkpoints", "expired_leases", "alerts", "last_alert"}
    | {"guards"}
)


class Summarizer:
    """Incrementally folds records into a :class:`RunSummary`: the status part of a run's
    fold (:class:`journal.views.fold.RunFold` owns one and adds the best checkpoint)."""

    def __init__(self) -> None:
        self.summary = RunSummary()
        self.ended = False
        #: applied stop/abort commands' id -> source, for a train_end without command_source
        self._enders: dict[str, str | None] = {}

    def add(self, rec: Record) -> None:
        s = self.summary
        s.records += 1
        event = rec["event"]
        data = rec["data"]
        if rec["ts"] is not None:
            s.last_ts = rec["ts"]
        step = rec["step"]
        if step >= s.last_step:
            s.last_step = step
        s.epoch = rec["epoch"]
        s.samples_seen = rec["samples_seen"]
        if event == "train_begin" and rec["run_id"] != s.run_id:
            s.last_checkpoint = None  # a new run: the run before's checkpoints are not its own
        if event == "train_begin" or s.run_id is None:
            s.run_id, s.attempt = rec["run_id"], rec["attempt"]
        if event == "train_begin":
            config = data.get("config") or {}
            s.keep_best = str_or_none(config.get("keep_best"))
            s.keep_last_n = int_or_none(config.get("keep_last_n"))
            self.ended = False
            s.state, s.reason, s.error = "running", None, None
            s.stop_source = s.stopped_by = None
            self._enders.clear()  # an attempt is ended by its own commands
            s.total_steps = data.get("total_steps", s.total_steps)
            s.started_ts = rec["ts"]
            s.hostname, s.pid = data.get("hostname"), data.get("pid")
            s.last_step = step
        elif event == "log":
            s.last_loss = data.get("loss", s.last_loss)
            s.last_lr = data.get("lr", s.last_lr)
        elif event == "evaluate":
            s.last_val_loss = data.get("val_loss", s.last_val_loss)
        elif event == "save":
            s.last_checkpoint = data.get("checkpoint_path", s.last_checkpoint)
        elif event == "report":
            s.reports += 1
            s.last_report = {
                k: data.get(k) for k in ("checkpoint_path", "step", "metrics", "source")
            }
        elif event == "control" and data.get("command") is None:
            from journal.rundir.inbox import refused_report  # rare: not at every start

            if refused_report(data) is not None:  # a report file refused: its metrics are lost
                s.refused_reports += 1
        elif event == "control" and accepted(data) and data.get("command") in _ENDERS:
            self._enders[str(data.get("id"))] = str_or_none(data.get("source"))
            if len(self._enders) > 64:  # a flood of stops: the ending one is among the last
                self._enders.pop(next(iter(self._enders)))
        elif event == "train_end":
            self.ended = True
            s.state = str(data.get("status") or "failed")
            s.reason = data.get("reason")
            if data.get("final_checkpoint"):
                s.last_checkpoint = data["final_checkpoint"]
            if data.get("error_type"):
                s.error = f"{data['error_type']}: {data.get('error_message', '')}"
            s.stop_source, s.stopped_by = ending(data, self._enders)
        if s.state == "empty":  # any record (a journal rotated mid-run starts with a log)
            s.state = "running"

    def to_state(self) -> dict[str, Any]:
        """Everything folded so far, as JSON types (the journal index stores it)."""
        s = {k: v for k, v in self.summary.to_dict().items() if k not in _DERIVED}
        return {"summary": s, "ended": self.ended, "enders": self._enders}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Summarizer:
        summ = cls()
        for key in ("keep_last_n", "stop_source"):
            if key not in state["summary"]:
                # folded before that field was: not to be trusted (the index reads it again)
                raise KeyError(key)
        summ.summary = RunSummary(**state["summary"])
        summ.ended = bool(state["ended"])
        summ._enders = dict(state.get("enders") or {})
        return summ

    def result(
        self,
        *,
        stale_after: float | None = None,
        now: float | None = None,
        hung: str | None = None,
    ) -> RunSummary:
        """The summary so far, without the best checkpoint (the run's fold adds it).
        ``hung``: why a running run is hung (a hang alert and no step since), which a quiet
        run's staleness does not hide (a trainer process gone does).

        A copy: judging a quiet run stale must not stick to the summary this keeps folding
        (a long-lived reader, such as ``serve``, sees the run running again when it writes)."""
        s = replace(self.summary)
        if s.state == "running" and s.last_ts is not None:
            now = time.time() if now is None else now
            if hung is not None and not _pid_gone(s.hostname, s.pid):
                s.state, s.reason = "hung", hung
            elif stale_after is not None and now - s.last_ts > stale_after:
                s.state = "stale"
                s.reason = f"no record for {now - s.last_ts:.0f}s and no train_end"
            elif _pid_gone(s.hostname, s.pid):
                s.state = "stale"
                s.reason = f"trainer process {s.pid} is gone and wrote no train_end"
        return s
