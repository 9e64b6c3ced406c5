"""What one policy would have done to one run: where it stops and what that costs
(:func:`judge_stop`), which checkpoints retention keeps (:func:`judge_retention`, the
trainer's own rule: :func:`journal.checkpoints.rotation.surplus` and the best by the one
best rule, :class:`journal.views.ledger.CheckpointLedger`, at the moments the run rotated)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from journal.checkpoints.rotation import surplus
from journal.record.record import Record
from journal.rundir.paths import checkpoint_key
from journal.views.best import BestCheckpoint, MetricGoal
from journal.views.ledger import CheckpointLedger
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
        if at is None and tl.end_ts is not None and t <= tl.end_ts:
            # known before the run ended, but after its last step boundary: the run ended
            # before a step could read it, so it stops where the run did
            at = (tl.last_step, tl.end_samples, tl.end_ts)
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


@dataclass
class Rotation:
    """A moment the run rotated (or could have): right after a save and the reports
    journaled before its removals (the trainer's rotation), and at removals journaled
    elsewhere (a guest: ``prune``, a watcher releasing a lease after ``train_end``, with
    the late reports known then). ``run_removed``: what the run removed there (the
    journal's truth); ``held``: what the run's own policy let go there that the run kept
    anyway (a lease, as far as the journal tells), kept under any policy asked."""

    run_removed: set[str] = field(default_factory=set)
    held: set[str] = field(default_factory=set)


#: An item of the run's retention story: a record (a save, report or evaluate to fold; a
#: removal the run journaled) or a rotation.
Item = Record | Rotation


def retention_story(tl: Timeline) -> list[Item]:
    """The run's records that retention reads, with its rotations put where they happened
    (see :class:`Rotation`), each one's ``held`` inferred (:func:`_infer_holds`). A save's
    rotation comes right after it, or, when removals follow the reports journaled after
    it, at the first removal (the trainer journals the reports that came before it
    rotates); removals elsewhere are a guest's rotation, with what was known then."""
    items: list[Item] = []
    after_save: list[Record] | None = None  # the reports after a save, held back
    window: Rotation | None = None  # the rotation whose removals are being read
    for rec in tl.metric_records:
        ev = rec["event"]
        if ev == "report" and after_save is not None:
            after_save.append(rec)
            continue
        if ev == "checkpoint_removed":
            if window is None:  # its first removal: decided with what came before
                window = Rotation()
                items += [*(after_save or ()), window]
                after_save = None
            if (name := _name(rec)) is not None:
                window.run_removed.add(name)
            items.append(rec)
            continue
        if after_save is not None:  # the save's rotation removed nothing
            items += [Rotation(), *after_save]
        after_save, window = None, None
        if ev in ("train_begin", "train_end"):
            continue
        items.append(rec)
        if ev == "save" and _name(rec) is not None:
            after_save = []
    if after_save is not None:
        items += [Rotation(), *after_save]
    _infer_holds(items, tl)
    return items


def _name(rec: Record) -> str | None:
    path = rec["data"].get("checkpoint_path")
    return checkpoint_key(path) if isinstance(path, str) and path else None


def _infer_holds(items: list[Item], tl: Timeline) -> None:
    """At each rotation, what the run's own policy would remove that the run kept: held.
    Only where the run's fold sees its checkpoints (on disk, or journaled as removed): a
    journal without its run dir's checkpoints (copied, made by hand) tells nothing of what
    the run kept."""
    if not tl.keep_last_n or all(v.state == "missing" for v in tl.fold.checkpoints()):
        return
    _simulate(items, tl.keep_last_n, _parse(tl.keep_best), infer=True)


def _parse(text: str | None) -> MetricGoal | None:
    try:
        return MetricGoal.parse(text) if text else None
    except ValueError:
        return None


class _RotationLedger(CheckpointLedger):
    """The one best rule over what one policy's rotation sees: a removed checkpoint is
    dropped rather than kept as a fate (thousands of saves: each look at the best stays
    as small as what is on disk). A report about one not there is dropped too
    (:func:`_simulate`), as the ledger never lets it bring one back."""

    def _removed(self, rec: Any, data: Any, step: int | None) -> None:
        path = data.get("checkpoint_path")
        if isinstance(path, str):
            self._fates.pop(checkpoint_key(path), None)


@dataclass
class _Simulated:
    alive: dict[str, int]  # name -> step, oldest first
    removed: dict[str, None]  # in the order removed (a name saved again leaves it)
    final: BestCheckpoint | None  # the best by every value, late reports too
    held: list[str]  # kept at the last rotation only because the run held them


def _simulate(
    items: list[Item], keep_last_n: int | None, goal: MetricGoal | None, *, infer: bool = False
) -> _Simulated:
    """The run's saves under a retention policy: at each rotation, the trainer's rule
    (:func:`surplus`: the newest ``keep_last_n`` and the best as known then, by the one
    best rule, :class:`CheckpointLedger`), less what was held. ``infer``: the run's own
    policy, whose rotations learn what was held from what the run kept."""
    now = _RotationLedger()  # the best as rotation knew it (removals as simulated)
    ever = CheckpointLedger()  # by every value, late reports too
    alive: dict[str, int] = {}
    run_disk: set[str] = set()  # infer: the run's checkpoints, as its journal says
    removed: dict[str, None] = {}
    held: list[str] = []
    for item in items:
        if isinstance(item, Rotation):
            best = now.best(goal) if goal else None
            keep = {checkpoint_key(best.checkpoint_path)} if best else set()
            held = []
            for gone in surplus(list(alive), keep_last_n, keep):
                if infer and gone in run_disk and gone not in item.run_removed:
                    item.held.add(gone)
                if gone in item.held:
                    held.append(gone)
                    continue
                del alive[gone]
                removed[gone] = None
                now.add(_removal(gone))
            continue
        name = _name(item)
        if item["event"] == "checkpoint_removed":  # the run's: the policy's are its own
            run_disk.discard(name or "")
            continue
        now.add(item)
        ever.add(item)
        if name is None:
            continue
        if item["event"] == "save":
            run_disk.add(name)
            removed.pop(name, None)  # a fresh checkpoint of that name
            step = item["step"]
            alive.pop(name, None)
            if alive and step < alive[next(reversed(alive))]:  # a resume went back: re-sort
                alive = dict(sorted({**alive, name: step}.items(), key=lambda e: e[1]))
            else:
                alive[name] = step
        elif name not in alive:  # a report about one not there: no value to rotation
            now.add(_removal(name))
    return _Simulated(alive, removed, ever.best(goal) if goal else None, held)


def _removal(name: str) -> dict[str, Any]:
    return {"event": "checkpoint_removed", "data": {"checkpoint_path": name}}


def judge_retention(
    tl: Timeline, keep_last_n: int | None, keep_best: str | None, story: list[Item] | None = None
) -> RetentionOutcome:
    """The run's saves under a retention policy, rotated where the run rotated (after each
    save, with the reports journaled before its removals counted; after ``train_end``, with
    the late reports; see :func:`retention_story`). A checkpoint the run's own policy let go
    that the run still kept (a lease) is kept under this one too: with the run's own
    settings, this is what the run removed and kept. ``story``: the run's, made once."""
    goal = MetricGoal.parse(keep_best) if keep_best else None
    story = retention_story(tl) if story is None else story
    sim = _simulate(story, keep_last_n, goal)
    best_name = checkpoint_key(sim.final.checkpoint_path) if sim.final else None
    return RetentionOutcome(
        policy=f"keep_last_n={keep_last_n} keep_best={keep_best}",
        keep_last_n=keep_last_n,
        keep_best=keep_best,
        kept=list(sim.alive),
        removed=list(sim.removed),
        best=best_name,
        best_deleted=best_name in sim.removed,
        held=sim.held,
    )
