"""The hang rule: no step progress for longer than the threshold while the trainer is in no
declared long phase (docs/alerts.md, "Hangs and deaths").

Pure: :class:`AttemptTracker` folds records (what an attempt has done, when), and
:func:`check` says, for a moment ``now`` and the phase the trainer declared
(:mod:`journal.rundir.phase`), whether that is a hang. The live guard
(:mod:`watcher.alerts.guard`) calls it every second with the clock; the backtest
(:mod:`watcher.backtest.hangs`) calls it at the moments of past journals. One rule, two
clocks.

The threshold is ``--hang-after SECONDS`` or ``auto``: :data:`AUTO_FACTOR` times the
longest step of this attempt so far (of its last :data:`AUTO_WINDOW`), never below
:data:`AUTO_FLOOR_S`. A step's time is the time between its step boundary and the one
before, less what its own records declare was spent in a phase (a save's ``lease_wait_s``,
``waited_s`` and ``blocked_s``, an eval's ``duration``); the first step (compile,
warm-up) is not counted. A declared phase is no hang until it lasts longer than its own
bound plus the threshold (a lease wait: the pacer's) or, without one,
:data:`PHASE_FACTOR` times the threshold and at least :data:`PHASE_FLOOR_S` (the first
step: ``--first-step-limit`` when given).

A step boundary is ``ilab-train``'s ``step_end``; a bridge's (its ``train_begin`` names
its ``trainer``) is its first record of a later step: the Accelerate bridge writes no
``step_end``, only ``log`` records at the loop's step.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from journal.record.events import LIFECYCLE_EVENTS, RESULT_EVENTS
from journal.record.numbers import seconds_or_auto
from journal.rundir.phase import Phase

AUTO_FLOOR_S = 20.0
AUTO_FACTOR = 10.0
AUTO_WINDOW = 100
PHASE_FACTOR = 10.0
PHASE_FLOOR_S = 600.0
#: Records the trainer writes while it makes progress (every record of the loop, and the
#: commands and reports it journals at a step boundary). ``train_end`` ends the attempt;
#: an ``alert`` or a guest's record says nothing about the trainer.
PROGRESS_EVENTS = frozenset(LIFECYCLE_EVENTS) - {"train_begin", "train_end"} | set(RESULT_EVENTS)
#: Records ``ilab-train``'s rank 0 holds back and writes with the next other one (its
#: ``step_end`` at the latest: trainer/journaling/emitter.py): a reader sees them arrive
#: then, so their own times say nothing about when progress was last seen.
DEFERRED_EVENTS = frozenset(
    {"epoch_begin", "step_begin", "before_optimizer_step", "after_optimizer_step", "log"}
    | {"evaluate", "before_forward", "after_forward", "before_backward", "after_backward"}
)


class HangSpecError(ValueError):
    """``--hang-after`` given something that is neither seconds nor ``auto``."""


@dataclass(frozen=True)
class HangRule:
    """``after_s``: a fixed threshold in seconds; None: ``auto``. ``first_step_s``: how
    long an attempt's first step may take (None: as any phase without a bound)."""

    after_s: float | None = None
    first_step_s: float | None = None

    @classmethod
    def parse(cls, text: str) -> HangRule:
        """``"auto"`` or a positive number of seconds (:class:`HangSpecError` otherwise;
        the rule: :func:`journal.record.numbers.seconds_or_auto`)."""
        try:
            return cls(seconds_or_auto(text))
        except ValueError as exc:
            raise HangSpecError(f"--hang-after {text!r}: {exc}") from None

    def describe(self) -> str:
        return "auto" if self.after_s is None else f"{self.after_s:g}s"

    def threshold(self, step_times: Any) -> float:
        """The threshold in seconds, given this attempt's step times (for ``auto``)."""
        if self.after_s is not None:
            return self.after_s
        longest = max(step_times, default=0.0)
        return max(AUTO_FLOOR_S, AUTO_FACTOR * longest)

    def phase_limit(self, threshold: float, phase: Phase) -> float:
        """How long a declared phase may last before it counts as a hang."""
        if phase.name == "first_step" and self.first_step_s is not None:
            return self.first_step_s
        if phase.limit_s is not None:
            return phase.limit_s + threshold
        return max(PHASE_FACTOR * threshold, PHASE_FLOOR_S)


def declared_seconds(rec: Mapping[str, Any]) -> float:
    """What a record says was spent in declared phases at its step's boundary: a save's
    lease wait, wait for the previous save and blocking part; an eval's duration."""
    data = rec.get("data") or {}
    keys = {"save": ("lease_wait_s", "waited_s", "blocked_s"), "evaluate": ("duration",)}
    total = 0.0
    for key in keys.get(rec.get("event", ""), ()):
        v = data.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
            total += float(v)
    return total


@dataclass
class AttemptTracker:
    """What the current attempt of a journal has done, folded from its records.

    ``declared``: seconds spent in declared phases per ``(run_id, attempt, step)``; the
    backtest fills it from the whole journal first (an asynchronous save's record comes
    after its step), the live guard as records arrive."""

    run_id: str | None = None
    attempt: int | None = None
    begin_ts: float | None = None
    begin: dict[str, Any] = field(default_factory=dict)  # train_begin's payload
    last_progress_ts: float | None = None
    last_step: int = 0
    steps: int = 0  # step boundaries of this attempt
    ended: bool = True
    end: dict[str, Any] | None = None
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=AUTO_WINDOW))
    declared: dict[tuple[str | None, int | None, int], float] = field(default_factory=dict)
    _boundary_ts: float | None = None  # the last step boundary (or train_begin)
    bridge: bool = False  # a bridge's attempt: a later step's first record is its boundary
    prefilled: bool = False  # declared came from the whole journal (the backtest)

    @property
    def active(self) -> bool:
        """An attempt has begun and not ended."""
        return not self.ended and self.begin_ts is not None

    def key(self, step: int) -> tuple[str | None, int | None, int]:
        return (self.run_id, self.attempt, step)

    def observe(self, rec: Mapping[str, Any]) -> None:
        event, ts = rec["event"], rec.get("ts")
        if not isinstance(ts, (int, float)):
            return
        if event == "train_begin":
            self.run_id, self.attempt = rec.get("run_id"), rec.get("attempt")
            self.begin_ts = self.last_progress_ts = self._boundary_ts = float(ts)
            self.begin = dict(rec.get("data") or {})
            self.bridge = "trainer" in self.begin
            self.last_step, self.steps, self.ended, self.end = (
                rec["step"],
                0,
                False,
                None,
            )
            self.step_times.clear()
            return
        if self.ended:
            return
        if event == "train_end":
            self.ended, self.end = True, dict(rec.get("data") or {})
            return
        if event not in PROGRESS_EVENTS:
            return
        step = rec["step"]
        if not self.prefilled and (spent := declared_seconds(rec)):
            k = self.key(step)
            self.declared[k] = self.declared.get(k, 0.0) + spent
        self.last_progress_ts = max(self.last_progress_ts or ts, float(ts))
        if step > self.last_step if self.bridge else event == "step_end":
            if self.steps >= 1 and self._boundary_ts is not None:  # not the first: warm-up
                spent = float(ts) - self._boundary_ts - self.declared.get(self.key(step), 0.0)
                self.step_times.append(max(spent, 0.0))
            self.steps += 1
            self.last_step = max(self.last_step, step)
            self._boundary_ts = float(ts)


@dataclass(frozen=True)
class HangFinding:
    """What :func:`check` found: ``quiet_s`` without progress (outside phases), or
    ``phase`` lasting ``quiet_s``, against ``threshold_s``."""

    run_id: str | None
    attempt: int | None
    step: int
    quiet_s: float
    threshold_s: float
    since: float  # when the quiet (or the phase) began
    phase: str | None = None

    @property
    def message(self) -> str:
        where = f"step {self.step}" if self.step else "before the first step"
        if self.phase is not None:
            return (
                f"in {self.phase} for {self.quiet_s:.0f}s at {where} (a {self.phase} "
                f"longer than {self.threshold_s:.0f}s counts as a hang)"
            )
        return (
            f"no step progress for {self.quiet_s:.0f}s after {where} (threshold "
            f"{self.threshold_s:.0f}s, no declared phase)"
        )


def current_phase(tracker: AttemptTracker, declared: Phase | None) -> Phase | None:
    """The phase that counts now: the first step (from ``train_begin`` to the first step
    boundary, said by the records), else what the trainer declared for this attempt (a
    phase file of another attempt, or older than it, says nothing)."""
    if tracker.steps == 0 and tracker.begin_ts is not None:
        return Phase("first_step", tracker.begin_ts, tracker.run_id, tracker.attempt)
    if declared is None or tracker.begin_ts is None:
        return None
    if declared.since < tracker.begin_ts:
        return None
    mine = (declared.run_id, declared.attempt) == (tracker.run_id, tracker.attempt)
    if declared.attempt is not None and tracker.attempt is not None and not mine:
        return None
    return declared


def check(
    tracker: AttemptTracker, declared: Phase | None, now: float, rule: HangRule
) -> HangFinding | None:
    """Whether the attempt ``tracker`` follows is hung at ``now`` (see the module doc)."""
    if not tracker.active or tracker.last_progress_ts is None:
        return None
    threshold = rule.threshold(tracker.step_times)
    phase = current_phase(tracker, declared)
    if phase is not None and phase.name is not None:
        limit = rule.phase_limit(threshold, phase)
        in_phase = now - phase.since
        if in_phase <= limit:
            return None
        return HangFinding(
            tracker.run_id,
            tracker.attempt,
            tracker.last_step,
            in_phase,
            limit,
            phase.since,
            phase.name,
        )
    start = tracker.last_progress_ts
    if phase is not None:  # no phase since ``since``: the last one ended then
        start = max(start, phase.since)
    quiet = now - start
    if quiet <= threshold:
        return None
    return HangFinding(tracker.run_id, tracker.attempt, tracker.last_step, quiet, threshold, start)
