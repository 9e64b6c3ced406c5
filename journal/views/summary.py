"""Fold a journal into what people and scripts ask about: state, progress, phases."""

from __future__ import annotations

import math
import operator
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from journal.read.reader import iter_batches
from journal.record.record import Record
from journal.rundir.inbox import refused_file
from journal.rundir.paths import REPORTS_DIR_NAME
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
_DERIVED = frozenset({"best_checkpoint", "holder", "prunable_checkpoints", "expired_leases"})


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
            keep_best = config.get("keep_best")
            s.keep_best = keep_best if isinstance(keep_best, str) else None
            n = config.get("keep_last_n")
            s.keep_last_n = n if isinstance(n, int) and not isinstance(n, bool) else None
            self.ended = False
            s.state, s.reason, s.error = "running", None, None
            s.stop_source = s.stopped_by = None
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
            refused = refused_file(data)  # a report file refused: its metrics are lost
            if refused is not None and refused.inbox == REPORTS_DIR_NAME:
                s.refused_reports += 1
        elif event == "control" and data.get("accepted") and data.get("command") in _ENDERS:
            src = data.get("source")
            self._enders[str(data.get("id"))] = src if isinstance(src, str) else None
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
    ) -> RunSummary:
        """The summary so far, without the best checkpoint (the run's fold adds it).

        A copy: judging a quiet run stale must not stick to the summary this keeps folding
        (a long-lived reader, such as ``serve``, sees the run running again when it writes)."""
        s = replace(self.summary)
        if s.state == "running" and s.last_ts is not None:
            now = time.time() if now is None else now
            if stale_after is not None and now - s.last_ts > stale_after:
                s.state, s.reason = (
                    "stale",
                    f"no record for {now - s.last_ts:.0f}s and no train_end",
                )
            elif _pid_gone(s.hostname, s.pid):
                s.state, s.reason = (
                    "stale",
                    f"trainer process {s.pid} is gone and wrote no train_end",
                )
        return s


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
        total = self.total_s if self.count else None
        return {
            "count": self.count,
            "total_s": total,
            "mean_s": self.mean_s,
            "unmeasured": self.unmeasured,
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

    def add(self, rec: Record) -> None:
        self.add_batch([rec])

    def add_batch(self, records: list[Record]) -> None:
        """Add records in file order. Counting runs in C; Python touches only the first and
        last timestamps and the log/evaluate/save records (about 1 in 5)."""
        events = list(map(_EVENT, records))
        self.counts.update(events)
        for r in records:
            ts = r["ts"]
            if ts is not None:
                self.first_ts = ts if self.first_ts is None else self.first_ts
                break
        for r in reversed(records):
            ts = r["ts"]
            if ts is not None:
                self.last_ts = ts
                break
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
            d = data.get("duration")
            if isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d):
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
