"""``ilab-journal backtest RUN --hang-after SECONDS|auto``: the hang alarms the live guard
would have raised on a past journal.

The same rule as the live guard's (:func:`watcher.alerts.hang.check`), asked at the
moments a watcher would have looked: just before each record that reaches a reader on its
own (the records ``ilab-train`` holds back arrive with the next one), with the tracker as
it stood then. The trainer's phases are not in the journal (journal/rundir/phase.py): the
seconds a step boundary's records say were spent in them (a save's ``lease_wait_s``,
``waited_s`` and ``blocked_s``, an eval's ``duration``) are taken out of the gaps of that
boundary, and a gap that holds them is also judged as a phase. Taken out whole, from the
first gaps on: the quiet left is never less than the live guard saw (a gap split by a
phase counts as one), so the backtest errs towards alarms, never away from them.

An alarm on the gap that ends an attempt the guard aborted, or one whose workers died
(its ``train_end`` written by the launcher or a watcher), is that ending seen early;
every other alarm is a false one.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from journal.read.reader import iter_records
from journal.record.record import Record
from journal.rundir.phase import Phase
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

    @property
    def false(self) -> bool:
        return not self.at_end


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


def _declared(journal: Path) -> tuple[dict[Key, float], dict[Key, set[str]]]:
    """Seconds spent in declared phases per ``(run_id, attempt, step)`` of a boundary, and
    which phases (read whole first: an asynchronous save's record comes steps later)."""
    spent: dict[Key, float] = defaultdict(float)
    names: dict[Key, set[str]] = defaultdict(set)
    for rec in iter_records(journal):
        if (s := declared_seconds(rec)) > 0:
            key = (rec["run_id"], rec["attempt"], rec["step"])
            spent[key] += s
            names[key].add("save" if rec["event"] == "save" else "eval")
    return dict(spent), dict(names)


def backtest_hangs(journal: Path, rule: HangRule) -> HangBacktest:
    """The alarms ``rule`` would have raised on ``journal`` (see the module doc)."""
    spent, names = _declared(journal)
    out = HangBacktest(str(journal), rule.describe())
    tracker = AttemptTracker(declared=dict(spent), prefilled=True)
    left: dict[Key, float] = dict(spent)  # declared seconds not yet taken out of a gap
    held: list[Record] = []  # deferred records: they arrive with the next one
    attempt_alarms: list[HangAlarm] = []
    for rec in iter_records(journal):
        event = rec["event"]
        if event == "train_begin":
            out.attempts += 1
            attempt_alarms = []
        ts = rec["ts"]
        if tracker.active and ts is not None and (event in PROGRESS_EVENTS or event == "train_end"):
            if event in DEFERRED_EVENTS:
                held.append(rec)
                continue
            step = max([tracker.last_step, rec["step"], *(r["step"] for r in held)])
            found = _look(tracker, rule, ts, tracker.key(step), left, names)
            if event == "train_end" and _abnormal(rec["data"]):
                for a in found:  # the gap the attempt ended on: its ending, seen early
                    a.at_end = True
            attempt_alarms += found
            out.alarms += found
        for r in (*held, rec):
            tracker.observe(r)
        held = []
        if event == "step_end" and tracker.active:
            out.steps += 1
        if event == "train_end":
            ended = (
                "hang" if rec["data"].get("aborted_for") == "hang" else rec["data"].get("status")
            )
            for a in attempt_alarms:
                a.ended = str(ended)
    return out


def _abnormal(end: dict[str, Any]) -> bool:
    """An ending the guard caused or the trainer could not write: aborted as a hang, or
    written for dead workers by the launcher (or a watcher)."""
    return end.get("aborted_for") == "hang" or end.get("written_by") in ("launcher", "watcher")


def _look(
    tracker: AttemptTracker,
    rule: HangRule,
    now: float,
    key: Key,
    left: dict[Key, float],
    names: dict[Key, set[str]],
) -> list[HangAlarm]:
    """The alarms of the gap from the last progress to ``now`` (a record arriving)."""
    start = tracker.last_progress_ts
    if start is None or now <= start:
        return []
    gap = now - start
    declared = min(gap, left.get(key, 0.0))
    if declared:
        left[key] -= declared
    found = []
    phase_name = "+".join(sorted(names.get(key, ()))) or "phase"
    if declared and tracker.steps:  # the phase itself, at its end, against its limit
        phase = Phase(phase_name, start, tracker.run_id, tracker.attempt)
        if f := check(tracker, phase, start + declared, rule):
            found.append(f)
    f = check(tracker, Phase(None, start + declared, tracker.run_id, tracker.attempt), now, rule)
    if f is not None:
        found.append(f)
    return [
        HangAlarm(
            f.run_id,
            f.attempt,
            f.step,
            f.since + f.threshold_s,
            round(f.quiet_s, 3),
            round(f.threshold_s, 3),
            f.phase,
        )
        for f in found
    ]


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
