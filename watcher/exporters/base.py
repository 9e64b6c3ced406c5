"""What every experiment-tracker exporter shares (TensorBoard, MLflow, W&B).

The journal is the run's single source of truth, so a tracker is fed from it by a watcher
callback, live or replayed, with nothing in the training processes. The exporters agree on
which numbers go out and under which names and steps: the fold's metric points
(:func:`journal.views.fold.metric_points`, the number rule ``check``, ``backtest`` and
``serve`` read too): ``train/*`` from ``log`` at its step, ``eval/*`` from ``evaluate``,
``report/*`` from reports at the reported checkpoint's step.

Delivery is at-least-once (a watcher killed between writing and saving its cursor delivers
again), so each exporter reads back what its target already holds and skips a point it has
written: same name, step and record time. A resumed run's repeated steps have other times,
so they are kept.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Generator
from contextlib import closing
from typing import Any, cast

from journal.record.record import Record, complete
from journal.rundir.paths import resolve_journal
from journal.store import iter_events
from journal.views.fold import CheckpointLedger, RunFold, metric_points
from journal.views.summary import RunSummary
from watcher.hooks.callbacks import Event, TrainerCallback, callable_name
from watcher.hooks.delivery import TrackerUnavailable as TrackerUnavailable

# TrackerUnavailable (raised by the exporters, said once by the engine) lives below both,
# in watcher/hooks/delivery.py: the exporters import it from here, as before.

log = logging.getLogger("watcher")


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"d_model": 8}}`` as ``{"model.d_model": 8}`` (a tracker's params)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def close_all(exporters: list[Any]) -> None:
    """Close each exporter (the watcher is done); a failure is one logged line."""
    for exporter in exporters:
        try:
            exporter.close()
        except Exception as exc:
            log.error("closing %s failed: %s", type(exporter).__name__, exc)


def destination_digest(destination: str) -> str:
    """A short stable digest of an exporter's resolved destination (8 hex digits)."""
    return hashlib.sha1(destination.encode()).hexdigest()[:8]


def stop_said(summary: RunSummary) -> tuple[str, str]:
    """Who stopped the run and by what, as ``status`` says it (journal/views/stops.py), for
    every exporter at ``train_end``: ``("", "")`` clears what an earlier attempt's stop set
    when a later attempt completed (the fold then says no stop)."""
    if summary.stop_source is None:
        return "", ""
    return summary.stop_source, summary.stopped_by or "?"


class MetricsExport(TrainerCallback):
    """Base of the exporters: turns ``log``, ``evaluate`` and ``report`` records into named
    scalars at a step and hands them to :meth:`write_scalars`.

    ``destination`` (set by each exporter: the resolved LOGDIR, the MLflow tracking URI
    and experiment, the W&B entity and project) is part of the watcher's cursor identity
    (:attr:`callback_label`): a new destination is a new cursor, which delivers the
    journal from its start, so ``--tensorboard tb2`` after ``--tensorboard tb1`` gets
    every point, not only those after tb1's cursor."""

    #: where the exporter writes, resolved (None: not part of the cursor identity)
    destination: str | None = None

    @property
    def callback_label(self) -> str | None:
        """The name of the exporter's hooks (``<class>.to-<digest>.on_<event>``): the class
        and a digest of :attr:`destination`. The class comes first and the digest follows a
        dot, so what matches hooks by ``<class>.`` still does."""
        if self.destination is None:
            return None
        return f"{callable_name(type(self))}.to-{destination_digest(self.destination)}"

    def on_log(self, event: Event, **data: Any) -> None:
        self._emit(event, data)

    def on_evaluate(self, event: Event, **data: Any) -> None:
        self._emit(event, data)

    def on_report(self, event: Event, **data: Any) -> None:
        self._emit(event, data)

    def _emit(self, event: Event, data: dict[str, Any]) -> None:
        got = metric_points(event.name, event.step, data)  # the views' one rule
        if got is not None and got[2]:
            prefix, step, values = got
            self.write_scalars(prefix, {f"{prefix}/{k}": v for k, v in values.items()}, step, event)

    def write_scalars(
        self, prefix: str, values: dict[str, float], step: int, event: Event
    ) -> None:  # pragma: no cover - every exporter overrides it
        """Write ``values`` (``{"train/loss": 0.5, ...}``) at ``step``, with the record's
        time ``event.ts``, skipping what the target already holds."""
        raise NotImplementedError

    def after_deliveries(self) -> None:
        """Write what is buffered. The watcher calls it after each batch of deliveries to
        this object (a replay's thousands of records, a live run's one or few), before
        recording them: an exporter writes a batch in a few calls, not one per record."""

    def close(self) -> None:
        """Flush and finish (the watcher is done); the default has nothing to do."""


class RunFolds:
    """The fold of each run dir an exporter is delivered (journal/views/fold.py: the one
    truth of a run, which ``status``, ``query --best`` and ``serve`` read too), so that what
    an exporter says of checkpoints and of the best comes from it, never from a snapshot a
    record carries (``train_end``'s ``best_checkpoint`` is written while evals may still be
    behind: reports landing after it change the best).

    Fed in journal order with the records the exporter is delivered (:meth:`add`); the
    first one of a run dir is preceded by what the journal holds before it (a restarted
    watcher's cursor does not deliver those again, the fold needs them). Only the records
    that change checkpoints, the best or the run's ending are folded (a replay's millions of
    ``log`` records cost nothing here). Not thread-safe: the caller holds its lock."""

    #: the records folded (the rest change nothing an exporter asks the fold)
    EVENTS = CheckpointLedger.EVENTS | {"train_begin", "train_end", "control"}

    def __init__(self) -> None:
        self._folds: dict[str, RunFold] = {}
        self._last_seq: dict[str, int] = {}

    def add(self, event: Event) -> RunFold:
        """Fold ``event``'s record (once: a record delivered again, a retry or a watcher's
        at-least-once repeat, is not folded twice) and return its run dir's fold."""
        key = os.path.abspath(event.ckpt_dir)
        fold = self._folds.get(key)
        last = self._last_seq.get(key, -1)
        # a replaced journal begins again at seq 0, with a run of its own
        if (
            fold is not None
            and event.seq <= last
            and event.name == "train_begin"
            and (event.run_id != fold.run_id)
        ):
            fold = None
        if fold is None:
            fold = self._folds[key] = RunFold(key)
            last = self._last_seq[key] = self._seed(fold, key, event.seq)
        if event.seq > last and event.name in self.EVENTS:
            # a reader's record (complete), or one a caller built (a test, a bridge): the
            # fold reads a complete one (a copy: the event's record is not changed)
            fold.add(complete(dict(event.record)))
            self._last_seq[key] = event.seq
        return fold

    @classmethod
    def _seed(cls, fold: RunFold, ckpt_dir: str, before: int) -> int:
        """Fold the journal's records before seq ``before``; the last seq folded."""
        last = -1
        if before <= 0:
            return last  # delivered from the journal's start: nothing before it
        journal = resolve_journal(ckpt_dir, must_exist=False)
        try:
            records = cast("Generator[Record, None, None]", iter_events(journal, set(cls.EVENTS)))
            with closing(records):  # its file closed at the break, not when collected
                for rec in records:
                    if rec["seq"] >= before:
                        break
                    fold.add(rec)
                    last = rec["seq"]
        except OSError as exc:  # unreadable now: the fold starts with what is delivered
            log.warning("cannot read %s before seq %d: %s", journal, before, exc)
        return last
