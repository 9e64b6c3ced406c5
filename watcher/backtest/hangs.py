"""``ilab-journal backtest RUN --hang-after SECONDS|auto``: the hang alarms the live guard
would have raised on a past journal.

The same rule as the live guard's (:func:`watcher.alerts.hang.check`), asked at the
moments a watcher would have looked: just before each record that brings progress to a
reader (one of the trainer's own, or any other the records ``ilab-train`` holds back
arrive with: a hang alert journaled mid-step brings the step's records written after the
hang), with the tracker as it stood then. The trainer's phases are not in the journal
(journal/rundir/phase.py): the seconds a step boundary's records say were spent in them
(:func:`watcher.alerts.hang.declared_seconds`) are taken out of the gaps of that boundary,
and a gap that holds them is also judged as a phase. Taken out whole, from the first gaps
on: the quiet left is never less than the live guard saw (a gap split by a phase counts as
one), so the backtest errs towards alarms, never away from them.

An alarm on the gap that ends an attempt the guard aborted, or one whose workers died
(its ``train_end`` written by the launcher or a watcher), is that ending seen early; one
whose gap holds the ``raised_at`` of a hang alert journaled for its attempt is a hang the
live guard alerted on; every other alarm is a false one.
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from journal.record.record import Record
from journal.rundir.phase import Phase
from journal.store import iter_events, iter_records
from journal.views.ledger import finite_number
from watcher.alerts.hang import (
    DEFERRED_EVENTS,
    PROGRESS_EVENTS,
    AttemptTracker,
    HangRule,
    check,
    declared_seconds,
)

Key = tuple[str | None, int | None, int]


@dataclass
class HangAlarm:
    """One alarm the guard would have raised."""

    run_id: str | None
    attempt: int | None
    step: int
    ts: float  # when it would have been raised
    quiet_s: float
    threshold_s: float
    phase: str | None
    at_end: bool = False  # on the gap before an abnormal end: the ending, seen early
    ended: str | None = None  # how the attempt ended (status, and "hang" when aborted)
    alerted: bool = False  # a hang alert of its attempt was raised during its gap

    @property
    def false(self) -> bool:
        return not (self.at_end or self.alerted)


@dataclass
class HangBacktest:
    """One journal's hang backtest."""

    journal: str
    rule: str
    attempts: int = 0
    steps: int = 0
    alarms: list[HangAlarm] = field(default_factory=list)

    @property
    def false_alarms(self) -> int:
        return sum(a.false for a in self.alarms)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["false_alarms"] = self.false_alarms
        return out


class Declared:
    """Seconds spent in declared phases at each step boundary of each attempt, and which
    phases, read whole first (an asynchronous save's record comes steps later): per
    attempt, three arrays in step order (17 bytes a boundary, not a dict entry keyed by a
    tuple: a journal may declare a phase at every step), and the seconds not yet taken
    out of a gap."""

    def __init__(self, journal: Path) -> None:
        self._cols: dict[tuple[str | None, int | None], list[array[Any]]] = {}
        for rec in iter_events(journal, {"save", "evaluate"}, holding=("profile_s",)):
            if (s := declared_seconds(rec)) > 0:
                cols = self._cols.setdefault((rec["run_id"], rec["attempt"]), _columns())
                _add(cols, rec["step"], s, {"save": 1, "evaluate": 2}.get(rec["event"], 4))
        for attempt, (steps, secs, kinds) in self._cols.items():
            if any(steps[i] > steps[i + 1] for i in range(len(steps) - 1)):  # a later record
                merged = self._cols[attempt] = _columns()  # of an earlier step: in step order
                for i in sorted(range(len(steps)), key=steps.__getitem__):
                    _add(merged, steps[i], secs[i], kinds[i])
        self._left = {a: array("d", c[1]) for a, c in self._cols.items()}

    def _at(self, key: Key) -> int | None:
        col = self._cols.get(key[:2])
        if col is None:
            return None
        i = bisect.bisect_left(col[0], key[2])
        return i if i < len(col[0]) and col[0][i] == key[2] else None

    def spent(self, key: Key) -> float:
        """The seconds that step boundary declared in all."""
        i = self._at(key)
        return 0.0 if i is None else self._cols[key[:2]][1][i]

    def take(self, key: Key, gap: float) -> float:
        """Up to ``gap`` of the seconds not yet taken out of a gap at that boundary."""
        i = self._at(key)
        if i is None:
            return 0.0
        left = self._left[key[:2]]
        taken = min(gap, left[i])
        left[i] -= taken
        return taken

    def names(self, key: Key) -> str:
        """``save``, ``eval``, ``profile``, ``eval+save``..., or ``phase`` (none declared there)."""
        i = self._at(key)
        kinds = 0 if i is None else self._cols[key[:2]][2][i]
        return (
            "+".join(n for n, bit in (("eval", 2), ("save", 1), ("profile", 4)) if kinds & bit)
            or "phase"
        )


def _columns() -> list[array[Any]]:
    return [array("q"), array("d"), array("b")]  # step, seconds, phases (1 save, 2 eval, 4 profile)


def _add(cols: list[array[Any]], step: int, seconds: float, kinds: int) -> None:
    """One record's declared seconds, added to its step's (the last entry) or a new one."""
    if cols[0] and cols[0][-1] == step:
        cols[1][-1] += seconds
        cols[2][-1] |= kinds
    else:
        for col, value in zip(cols, (step, seconds, kinds), strict=True):
            col.append(value)


def backtest_hangs(journal: Path, rule: HangRule) -> HangBacktest:
    """The alarms ``rule`` would have raised on ``journal`` (see the module doc)."""
    declared = Declared(journal)
    out = HangBacktest(str(journal), rule.describe())
    tracker = AttemptTracker(prefilled=True)
    held: list[Record] = []  # deferred records: they arrive with the next one
    attempt_alarms: list[HangAlarm] = []
    gaps: list[tuple[HangAlarm, float]] = []  # each alarm, and when its gap ended
    raised: list[tuple[Any, Any, float]] = []  # the journaled hang alerts: run, attempt, when
    for rec in iter_records(journal):
        event, data = rec["event"], rec["data"]
        if event == "train_begin":
            out.attempts += 1
            attempt_alarms = []
        if event == "alert" and data.get("kind") == "hang" and finite_number(data.get("raised_at")):
            raised.append((rec["run_id"], data.get("attempt", rec["attempt"]), data["raised_at"]))
        ts = rec["ts"]
        arrives = event in PROGRESS_EVENTS or event == "train_end" or held
        if tracker.active and ts is not None and arrives:
            if event in DEFERRED_EVENTS:
                held.append(rec)
                continue
            step = max([tracker.last_step, rec["step"], *(r["step"] for r in held)])
            found = _look(tracker, rule, ts, tracker.key(step), declared)
            if event == "train_end" and _abnormal(data):
                for a in found:  # the gap the attempt ended on: its ending, seen early
                    a.at_end = True
            attempt_alarms += found
            out.alarms += found
            gaps += [(a, ts) for a in found]
        for r in (*held, rec):
            if r["event"] == "step_end":  # the step's time, less its declared phases
                k = tracker.key(r["step"])
                tracker.declared = {k: declared.spent(k)}
            tracker.observe(r)
        held = []
        if event == "step_end" and tracker.active:
            out.steps += 1
        if event == "train_end":
            ended = "hang" if data.get("aborted_for") == "hang" else data.get("status")
            for a in attempt_alarms:
                a.ended = str(ended)
    for a, until in gaps:  # an alert may be journaled after its gap (by the launcher, say)
        a.alerted = any(
            (run, attempt) == (a.run_id, a.attempt) and a.ts - a.threshold_s <= at <= until
            for run, attempt, at in raised
        )
    return out


def _abnormal(end: dict[str, Any]) -> bool:
    """An ending the guard caused or the trainer could not write: aborted as a hang, or
    written for dead workers by the launcher (or a watcher)."""
    return end.get("aborted_for") == "hang" or end.get("written_by") in ("launcher", "watcher")


def _look(
    tracker: AttemptTracker, rule: HangRule, now: float, key: Key, declared: Declared
) -> list[HangAlarm]:
    """The alarms of the gap from the last progress to ``now`` (a record arriving)."""
    start = tracker.last_progress_ts
    if start is None or now <= start:
        return []
    taken = declared.take(key, now - start)
    run, attempt = tracker.run_id, tracker.attempt
    looks = []  # each phase, and when it is judged
    if taken and tracker.steps:  # the phase itself, at its end, against its limit
        looks.append((Phase(declared.names(key), start, run, attempt), start + taken))
    looks.append((Phase(None, start + taken, run, attempt), now))
    alarms = []
    for phase, at in looks:
        if f := check(tracker, phase, at, rule):
            quiet, limit = round(f.quiet_s, 3), round(f.threshold_s, 3)
            alarms.append(
                HangAlarm(run, attempt, f.step, f.since + f.threshold_s, quiet, limit, f.phase)
            )
    return alarms


def table(results: list[HangBacktest]) -> str:
    """What people read: per journal, its alarms, then the false ones in all."""
    lines = []
    for r in results:
        lines.append(
            f"{r.journal}: --hang-after {r.rule}: {r.attempts} attempt(s), {r.steps} steps, "
            f"{len(r.alarms)} alarm(s), {r.false_alarms} false"
        )
        for a in r.alarms:
            what = f"in {a.phase} for" if a.phase else "no progress for"
            why = (
                " (the attempt's end, seen early)"
                if a.at_end
                else " (alerted live)"
                if a.alerted
                else f" FALSE ALARM (attempt ended {a.ended or 'not'})"
            )
            lines.append(
                f"  attempt {a.attempt} step {a.step}: {what} {a.quiet_s:.1f}s > "
                f"{a.threshold_s:.1f}s{why}"
            )
    if len(results) > 1:
        total = sum(len(r.alarms) for r in results)
        false = sum(r.false_alarms for r in results)
        lines.append(f"{len(results)} journals: {total} alarm(s), {false} false")
    return "\n".join(lines)
