"""What one policy would have done to one run: where it stops and what that costs
(:func:`judge_stop`), which checkpoints retention keeps (:func:`judge_retention`, the
trainer's own rule: :func:`journal.checkpoints.rotation.surplus` and the best by
:class:`journal.views.best.BestTracker`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from journal.checkpoints.rotation import surplus
from journal.views.best import BestTracker, MetricGoal
from watcher.backtest.outcome import RetentionOutcome, StopOutcome, WouldHave
from watcher.backtest.policies import StopPolicy
from watcher.backtest.timeline import Timeline, metric_series

_ENDS = ("stop", "abort")


def policy_goal(p: StopPolicy) -> MetricGoal | None:
    """The metric a policy watches, as the goal its losses are judged by."""
    if p.target is not None:
        return MetricGoal(p.target.metric, "max" if p.target.op in (">=", ">") else "min")
    if p.builtin is not None:
        obj: Any = p.make()
        return MetricGoal(obj.metric, getattr(obj, "mode", "min"))
    return None


def _trigger(
    tl: Timeline, p: StopPolicy, answers: list[WouldHave]
) -> tuple[float, int, int, int, str] | None:
    """(time, after_step, trigger seq, trigger step, reason) of the policy's stop, or None:
    a target's from the record that brought the value (see :func:`metric_series`); a
    callback's Control when the record it answered was journaled, after that record's step."""
    if p.target is not None:
        t = p.target
        for step, value, ts, seq, after in metric_series(tl, t.metric):
            if t.met(value):
                why = f"{t.metric} {value:.4g} {t.op} {t.value:g} (checkpoint step {step})"
                return ts, after, seq, step, why
        return None
    first = next((a for a in answers if a.what in _ENDS and a.rejected is None), None)
    if first is None:
        return None
    return (
        first.ts,
        first.step,
        first.seq,
        first.step,
        f"{first.what}: {first.reason or ''}".strip(),
    )


def judge_stop(
    tl: Timeline, p: StopPolicy, answers: list[WouldHave], goal: MetricGoal | None
) -> StopOutcome:
    """Where policy ``p`` would have stopped the run, and the metric it would have had."""
    out = StopOutcome(p.label, p.kind, would_have=answers)
    trig = _trigger(tl, p, answers)
    if trig is not None:
        t, after, out.trigger_seq, out.trigger_step, out.reason = trig
        at = tl.applied(t, after)
        if at is not None:  # at the run's own last step: it stops where the run did
            out.stop_step = at[0]
            out.steps_saved = tl.last_step - at[0]
            out.samples_saved = max(0, tl.end_samples - at[1]) if tl.end_samples else None
            if tl.tokens_per_step is not None:
                out.tokens_saved = round(tl.tokens_per_step * out.steps_saved)
            if tl.end_ts is not None:
                out.wall_s_saved = max(0.0, tl.end_ts - at[2])
    if goal is not None:
        _judge_metric(tl, out, goal)
    return out


def _judge_metric(tl: Timeline, out: StopOutcome, goal: MetricGoal) -> None:
    series = metric_series(tl, goal.metric)
    if not series:
        return
    pick = max if goal.mode == "max" else min
    out.metric = str(goal)
    out.final_value = series[-1][1]
    out.best_value = pick(v for _, v, _, _, _ in series)
    upto = tl.last_step if out.stop_step is None else out.stop_step
    known = [v for step, v, _, _, _ in series if step <= upto]
    if known:
        out.value_at_stop, out.best_at_stop = known[-1], pick(known)
        gap = out.best_value - out.best_at_stop
        out.lost = gap if goal.mode == "max" else -gap


def judge_retention(
    tl: Timeline, keep_last_n: int | None, keep_best: str | None
) -> RetentionOutcome:
    """The run's saves under a retention policy: after each save, the trainer's rule
    (the newest ``keep_last_n`` and the best so far, reports before the save counted)."""
    goal = MetricGoal.parse(keep_best) if keep_best else None
    now = BestTracker(goal) if goal else None  # the best as rotation knew it at each save
    ever = BestTracker(goal) if goal else None  # by every value, late reports too
    alive: list[str] = []
    paths: dict[str, str] = {}
    removed: list[str] = []
    for rec in tl.metric_records:
        ev = rec.get("event")
        if ev == "log":
            continue
        if now is not None and ever is not None:
            now.add(rec)
            ever.add(rec)
        path = (rec.get("data") or {}).get("checkpoint_path")
        if ev != "save" or not isinstance(path, str):
            continue
        name = Path(path).name
        paths[name] = path
        alive = [n for n in alive if n != name] + [name]
        best = now.best() if now is not None else None
        keep = {Path(best.checkpoint_path).name} if best else set()
        for gone in surplus(alive, keep_last_n, keep):
            alive.remove(gone)
            removed.append(gone)
            if now is not None:
                now.add({"event": "checkpoint_removed", "data": {"checkpoint_path": paths[gone]}})
    final = ever.best() if ever is not None else None
    best_name = Path(final.checkpoint_path).name if final else None
    return RetentionOutcome(
        policy=f"keep_last_n={keep_last_n} keep_best={keep_best}",
        keep_last_n=keep_last_n,
        keep_best=keep_best,
        kept=alive,
        removed=removed,
        best=best_name,
        best_deleted=best_name in removed,
    )
