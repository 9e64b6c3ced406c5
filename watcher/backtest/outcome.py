"""A backtest's results, as plain data (``--json`` prints them; a page or a plot can draw
``StopOutcome.stop_step``), and the table people read."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class WouldHave:
    """A Control or Report a policy answered: recorded, never sent."""

    seq: int
    event: str
    step: int
    ts: float  # when the record it answered was journaled
    what: str  # "stop", "abort", "save", ..., or "report"
    reason: str | None = None
    rejected: str | None = None  # why it could not have been applied (at train_end)


@dataclass
class StopOutcome:
    """Where one stopping policy would have stopped one run, and what it would have cost."""

    policy: str
    kind: str  # the stop_source it would have had: early_stopping, divergence, eval, callback
    stop_step: int | None = None  # None: it would not have stopped (no step after its answer)
    trigger_seq: int | None = None
    trigger_step: int | None = None  # the step of the record it answered
    reason: str | None = None
    steps_saved: int = 0
    samples_saved: int | None = None
    tokens_saved: int | None = None  # estimated: the logged tokens per step x steps saved
    wall_s_saved: float | None = None
    metric: str | None = None
    value_at_stop: float | None = None  # the newest value known at stop_step
    best_at_stop: float | None = None  # the best known by stop_step (what keep_best kept)
    final_value: float | None = None
    best_value: float | None = None
    lost: float | None = None  # best_value - best_at_stop, in the metric's direction (>= 0)
    would_have: list[WouldHave] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # deliveries that failed, one line each


@dataclass
class RetentionOutcome:
    """Which checkpoints a retention policy would have kept of one run's saves."""

    policy: str
    keep_last_n: int | None
    keep_best: str | None
    kept: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    best: str | None = None  # the best by every value the run got, reports after the end too
    best_deleted: bool = False  # the run's best was deleted before its value came
    #: kept only because the run held them (a lease: its own policy let them go, it kept them)
    held: list[str] = field(default_factory=list)


@dataclass
class RunBacktest:
    """One journal, replayed."""

    journal: str
    run_id: str | None
    status: str
    last_step: int
    stop_source: str | None  # who really stopped it (status's stop_source)
    #: the run's best by its keep_best, as status says it (the run's fold), or None
    best_checkpoint: dict[str, Any] | None = None
    stops: list[StopOutcome] = field(default_factory=list)
    retention: list[RetentionOutcome] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SweepRow:
    """One policy over every run: how often it stopped, what it saved, what it lost."""

    policy: str
    runs: int
    stopped: int  # runs it would have stopped earlier than they ended
    mean_steps_saved: float
    mean_saved_fraction: float  # of each run's steps
    runs_lost: int  # runs whose best by the stop is worse than their best
    max_lost: float | None
    mean_lost: float | None


def sweep_rows(runs: list[RunBacktest]) -> list[SweepRow]:
    """One row per stopping policy (same order as asked), over all runs."""
    by_policy: dict[str, list[tuple[RunBacktest, StopOutcome]]] = {}
    for run in runs:
        for s in run.stops:
            by_policy.setdefault(s.policy, []).append((run, s))
    rows = []
    for policy, pairs in by_policy.items():
        lost = [s.lost for _, s in pairs if s.lost is not None and s.steps_saved > 0]
        rows.append(
            SweepRow(
                policy=policy,
                runs=len(pairs),
                stopped=sum(s.steps_saved > 0 for _, s in pairs),
                mean_steps_saved=statistics.fmean(s.steps_saved for _, s in pairs),
                mean_saved_fraction=statistics.fmean(
                    s.steps_saved / r.last_step if r.last_step else 0.0 for r, s in pairs
                ),
                runs_lost=sum(v > 0 for v in lost),
                max_lost=max(lost) if lost else None,
                mean_lost=statistics.fmean(lost) if lost else None,
            )
        )
    return rows


def _num(v: float | None, spec: str = ".4g") -> str:
    return "-" if v is None else format(v, spec)


def table(runs: list[RunBacktest]) -> str:
    """The people's view: per run, each policy's stop and retention; then the sweep."""
    lines = []
    for run in runs:
        who = f", stopped by {run.stop_source}" if run.stop_source else ""
        lines.append(f"{run.journal}: {run.status} at step {run.last_step}{who}")
        for s in run.stops:
            if s.stop_step is None:
                lines.append(f"  {s.policy}: would not have stopped before step {run.last_step}")
            elif s.stop_step == run.last_step:
                lines.append(
                    f"  {s.policy}: would stop at step {s.stop_step}, as the run did; {s.reason}"
                )
            else:
                wall = f", {s.wall_s_saved:.0f}s" if s.wall_s_saved is not None else ""
                tok = f", ~{s.tokens_saved} tokens" if s.tokens_saved else ""
                lines.append(
                    f"  {s.policy}: would stop at step {s.stop_step} (answering seq "
                    f"{s.trigger_seq}, step {s.trigger_step}): saves {s.steps_saved} steps"
                    f"{tok}{wall}; {s.reason}"
                )
                if s.metric is not None:
                    lines.append(
                        f"    {s.metric}: {_num(s.best_at_stop)} best by then vs "
                        f"{_num(s.best_value)} best, {_num(s.final_value)} final "
                        f"(lost {_num(s.lost)})"
                    )
            for f in s.failures[:3]:
                lines.append(f"    failed: {f}")
        for kept in run.retention:
            gone = " - deletes the run's best first" if kept.best_deleted else ""
            held = f" (held by the run: {', '.join(kept.held)})" if kept.held else ""
            lines.append(
                f"  {kept.policy}: keeps {', '.join(kept.kept) or 'nothing'}{held}; "
                f"removes {len(kept.removed)}{gone}"
            )
    rows = sweep_rows(runs)
    if len(rows) > 1 or len(runs) > 1:
        lines.append("")
        head = f"{'policy':<32} {'runs':>5} {'stopped':>7} {'steps saved':>11} {'saved %':>7} {'lost runs':>9} {'max lost':>9} {'mean lost':>9}"
        lines.append(head)
        for r in rows:
            lines.append(
                f"{r.policy[:32]:<32} {r.runs:>5} {r.stopped:>7} {r.mean_steps_saved:>11.1f} "
                f"{100 * r.mean_saved_fraction:>6.1f}% {r.runs_lost:>9} "
                f"{_num(r.max_lost):>9} {_num(r.mean_lost):>9}"
            )
    return "\n".join(lines)
