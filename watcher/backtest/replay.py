"""One journal replayed through every policy of a backtest, read once.

Callbacks run as ``ilab-watch`` runs them: hooks made by :func:`assemble_hooks`, each
record routed by the watcher's :class:`Dispatcher` and delivered in journal order by the
runners of its :class:`Executor` (the same :class:`Event`, keyword arguments, timeouts and
retries, and the same judgement of what a callback returns), with ``restore_state([])``
first as for a watcher that starts at the journal's beginning. Only what comes back
differs: the executor is made with a :class:`WouldHaveHandBack`, which records each Control
and Report as "would have", and writes nothing into ``control/`` or ``reports/``.
Every record is delivered (a watcher that keeps up; one that lags may coalesce high-rate
events such as ``log``).

When a stop would have applied: a Control answering record R is read at a step boundary
after R was journaled, so it applies at the end of the first step after R's step that
ends after R (``step_end`` records, else ``log`` ones). The eval's own ``--target`` asks
with its result: a report's value at the step whose boundary journaled the report (an
eval's stop sent with it is read there too), an evaluate value at the next step. None:
no step comes after it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from journal.channels.control import Control
from journal.record.record import Record
from journal.store import START
from journal.views.best import MetricGoal
from watcher.backtest.judge import judge_retention, judge_stop, policy_goal, retention_story
from watcher.backtest.outcome import RunBacktest, WouldHave
from watcher.backtest.policies import StopPolicy
from watcher.backtest.timeline import read_run
from watcher.engine.dispatch import Dispatcher
from watcher.engine.execute import Executor
from watcher.engine.handback import HandBack
from watcher.hooks.callbacks import BadReturn, returned_actions
from watcher.hooks.delivery import Batch, Delivery, DeliveryResult
from watcher.hooks.hook import Hook, HookOptions, HookSet, assemble_hooks


class WouldHaveHandBack(HandBack):
    """A watcher's hand-back that sends nothing: each answer is kept, by the policy whose
    hook gave it (a Control at ``train_end`` is rejected, as the watcher rejects it)."""

    def __init__(self, ckpt_dir: str) -> None:
        super().__init__(ckpt_dir, "backtest", lambda line: None)
        self.answers: dict[int, list[WouldHave]] = {}
        self.owner: dict[int, int] = {}  # id(hook) -> its policy's index

    def act_on(self, returned: Any, d: Delivery, out: DeliveryResult) -> None:
        try:
            items = returned_actions(returned)
        except BadReturn as exc:  # the watcher fails the delivery with the same line
            out.status, out.error = "failed", str(exc)
            return
        rec = d.record
        for item in items:
            late = rec["event"] == "train_end" and isinstance(item, Control)
            self.answers.setdefault(self.owner[id(d.hook)], []).append(
                WouldHave(
                    seq=rec["seq"],
                    event=rec["event"],
                    step=rec["step"],
                    ts=0.0 if rec["ts"] is None else rec["ts"],  # read_run's records: complete
                    what=item.command if isinstance(item, Control) else "report",
                    reason=item.reason if isinstance(item, Control) else None,
                    rejected="the run had ended" if late else None,
                )
            )


class _NoRemovals:
    """The checkpoint guard of a replay: nothing is leased, a save is always delivered."""

    def removed(self, d: Delivery) -> bool:
        return False


def replay(
    journal: Path,
    policies: list[StopPolicy],
    user: Callable[[], HookSet] | None,
    retention: list[tuple[int | None, str | None]],
    goal: MetricGoal | None,
) -> RunBacktest:
    """Every policy over one journal (read once). ``user`` makes the user's callbacks'
    hooks, fresh for each journal as a watcher of it would (one policy: ``callbacks``);
    ``retention``: (keep_last_n, keep_best) pairs, None for the run's own; ``goal``: the
    metric losses are judged by (None: the run's keep_best, else each policy's metric)."""
    made = [(p, _builtin_hooks(p) if p.builtin is not None else None) for p in policies]
    if user is not None:
        made.append((StopPolicy("callbacks", "callback"), user()))
    metrics = {g.metric for g in [goal, *map(policy_goal, policies)] if g is not None}
    with Replayer(journal, [hs for _, hs in made]) as deliver:
        # each record delivered as it is read: the journal is never held in memory
        tl = read_run(journal, metrics, on_record=deliver)
    answers, failures = deliver.hand.answers, deliver.failures
    run_goal = MetricGoal.parse(tl.keep_best) if tl.keep_best else None
    best = tl.fold.summary().best_checkpoint  # the run as it happened: status's answer
    out = RunBacktest(str(journal), tl.run_id, tl.status, tl.last_step, tl.stop_source, best)
    for i, (p, _) in enumerate(made):
        stop = judge_stop(tl, p, answers.get(i, []), goal or run_goal or policy_goal(p))
        stop.failures = failures.get(i, [])
        out.stops.append(stop)
    story = retention_story(tl) if retention else []  # the run's rotations, read once
    for keep_last_n, keep_best in retention:
        n = keep_last_n if keep_last_n is not None else tl.keep_last_n
        out.retention.append(judge_retention(tl, n, keep_best or tl.keep_best, story))
    return out


def _builtin_hooks(p: StopPolicy) -> HookSet:
    """A built-in's hooks, as ``ilab-watch --early-stopping`` makes them."""
    return assemble_hooks([], [p.make()], [], lambda event: HookOptions())


class Replayer:
    """Each record to the hooks of its event, in journal order, through the watcher's
    dispatch and executor (call it with each record; close it after the last); keeps each
    policy's answers (``hand.answers``) and its failed deliveries (``failures``: one line
    each)."""

    def __init__(self, journal: Path, sets: list[HookSet | None]) -> None:
        self.hand = WouldHaveHandBack(str(journal.parent))
        self.ex = Executor(
            journal,
            files=None,
            control_source="backtest",
            stop=threading.Event(),
            checkpoints=_NoRemovals(),
            handback=self.hand,
        )
        hooks: list[Hook] = []
        for i, hs in enumerate(sets):
            if hs is None:
                continue
            for shape in hs.stateful:  # a watcher that starts at the beginning: no history
                if shape.restore_state is not None:
                    shape.restore_state([])
            hooks += hs.hooks
            self.hand.owner.update((id(hook), i) for hook in hs.hooks)
        # every record, none leased or completed before; a malformed one goes to no hook
        # without a word (the watcher says it)
        self.dispatch = Dispatcher(hooks, notice=lambda line: None)
        self._events = self.dispatch.events
        self._runs = [self.ex.lane_runner(lane).deliver for lane in self.dispatch.lanes]
        self.failures: dict[int, list[str]] = {}
        self._batch = Batch(START, 0, 0)

    def __call__(self, rec: Record) -> None:
        if rec["event"] not in self._events:
            return  # most records: no policy hooks their event
        routed = self.dispatch.route([rec], self._batch)
        for lane, todo in routed.deliveries.items():
            run = self._runs[lane]
            for d in todo:
                res = run(d)
                if res is not None and res.status not in ("ok", "skipped"):
                    self.failures.setdefault(self.hand.owner[id(d.hook)], []).append(
                        f"{d.hook.label} on seq {rec['seq']}: {res.error}"
                    )

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.ex.close()
