"""``ilab-watch DIR --mlflow [TRACKING_URI]``: the journal as MLflow runs.

One MLflow run per journal ``run_id`` (tagged ``ilab.run_id``), found again by that tag, so
a resume, a restarted watcher and a replay all continue the same run. Params come from
``train_begin``'s config (nested keys joined with dots; MLflow params cannot change, so a
resume that changes a setting keeps the first value). Metrics are the exporters' shared
``train/*``, ``eval/*`` and ``report/*`` (watcher/exporters/base.py) at their steps, with the
record's time as timestamp. Each ``save`` sets a ``checkpoint.<name>`` tag to its path (and
with ``log_artifacts`` copies the checkpoint in as artifacts under ``checkpoints/<name>``);
the rest of the story (each checkpoint's step, reports and removal, commands, the best, the
end's reason as the run's description) is tagged too (watcher/exporters/mlflow_story.py).
Checkpoints and the best come from the run's fold (journal/views/fold.py, kept by
:class:`~watcher.exporters.base.RunFolds`), as ``status`` says them: the best and the
description are tagged at ``train_end`` and again whenever a later report or removal
changes the best (``train_end``'s own ``best_checkpoint`` may predate evals still running).
The tracking URI and experiment are part of the watcher's cursor identity: another
destination gets the journal from its start.
The run's status follows ``train_begin`` (RUNNING) and ``train_end`` (FINISHED for
completed or stopped, FAILED, KILLED for interrupted), in journal order.

No duplicates: the exporter reads the run's metric history first and skips a point it holds
(same key, step and timestamp). Needs the ``mlflow`` package (``ilab-journal[mlflow]``).

A server that dies mid-run: MLflow's client retries each call for minutes, which would hold
the launcher past its grace period with every later record queued behind it. So each call
to an http(s) server runs on a thread of its own while ``/health`` is probed beside it;
after :data:`~watcher.exporters.mlflow_calls.DOWN_AFTER` unanswered probes in a row (or a
failed call and an unanswered probe) the exporter is down: every later call fails at once
with one :class:`~watcher.exporters.base.TrackerUnavailable` line saying that the MLflow run
is incomplete and that ``ilab-watch DIR --mlflow URI --replay`` repairs it (it is probed
again every :data:`~watcher.exporters.mlflow_calls.RECHECK_S`; watcher/exporters/mlflow_calls.py).
"""

from __future__ import annotations

import os
import re
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal.views.fold import CheckpointFate, RunFold
from watcher.exporters import mlflow_story as story
from watcher.exporters.base import MetricsExport, RunFolds, flatten
from watcher.exporters.mlflow_calls import Breaker, Guarded, check_reachable
from watcher.hooks.callbacks import CallbackSpecError, Event

DEFAULT_EXPERIMENT = "ilab-journal"
_STATUS = {"completed": "FINISHED", "stopped": "FINISHED", "failed": "FAILED"}
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_MAX_BATCH = 100  # MLflow's limit on params or tags per log_batch call
_MAX_METRICS = 1000  # and on metrics
_MAX_VALUE = 6000  # MLflow's limit on a param value's length


@dataclass
class _Run:
    """What one MLflow run already holds."""

    id: str
    seen: set[tuple[str, int, int]] = field(default_factory=set)  # (key, step, timestamp ms)
    params: set[str] = field(default_factory=set)
    tags: dict[str, str] = field(default_factory=dict)
    pending: list[Any] = field(default_factory=list)  # metrics not sent yet (Metric)


def _absolute(uri: str) -> str:
    """A tracking URI with a local path made absolute (``mlruns`` is another store from
    another directory); a URI with a scheme as it is."""
    head = uri.split("/", 1)[0]
    return uri if ":" in head else os.path.abspath(uri)


class MlflowExport(MetricsExport):
    """Writes the journal's runs to an MLflow tracking server or store.

    Args:
        tracking_uri: where to (default: ``MLFLOW_TRACKING_URI``, else MLflow's default).
        experiment: experiment name (default: ``MLFLOW_EXPERIMENT_NAME``, else
            ``ilab-journal``); created when missing.
        log_artifacts: copy each saved checkpoint into the run's artifacts (default: only
            its path, as a tag).
        run_name: the MLflow run's name (default: ``<ckpt dir name>-<journal run id>``).

    Raises:
        CallbackSpecError: mlflow is not installed, or the tracking URI does not work.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        experiment: str | None = None,
        log_artifacts: bool = False,
        run_name: str | None = None,
    ) -> None:
        self.run_name = run_name
        try:
            import mlflow
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise CallbackSpecError(
                "--mlflow needs the mlflow package: pip install 'ilab-journal[mlflow]'"
            ) from None
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
        if uri:
            check_reachable(uri)
        self.experiment = (
            experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
        )
        self.log_artifacts = log_artifacts
        self._lock = threading.Lock()  # hooks of different events run in different threads
        self._runs: dict[str, _Run] = {}
        self._where: tuple[str, str] | None = None  # (ckpt_dir, run_id) being exported
        self._folds = RunFolds()  # each run dir's fold: checkpoints and the best from it
        try:
            self.client: Any = MlflowClient(uri)
            self.tracking_uri = uri or mlflow.get_tracking_uri()
            # the tracking URI and experiment are the watcher's cursor identity
            # (MetricsExport.callback_label): another server or experiment starts over
            self.destination = f"mlflow {_absolute(self.tracking_uri)} {self.experiment}"
            if self.tracking_uri.startswith(("http://", "https://")):
                self.client = Guarded(self.client, Breaker(self.tracking_uri, self._incomplete))
            found = self.client.get_experiment_by_name(self.experiment)
            self._experiment_id = (
                found.experiment_id if found else self.client.create_experiment(self.experiment)
            )
        except Exception as exc:  # any failure of the store: one line, not a traceback
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CallbackSpecError(f"MLflow tracking URI {uri or '(default)'}: {first}") from None

    # -- hooks (log, evaluate and report: MetricsExport) ----------------------------------

    def on_train_begin(self, event: Event, **data: Any) -> None:
        from mlflow.entities import Param

        with self._lock:
            self._folds.add(event)  # the run's keep_best: which checkpoint is the best
            run = self._run(event)
            if run is None:
                return
            values = flatten(data.get("config") or {})
            if "world_size" in data:
                values["world_size"] = data["world_size"]
            new = [Param(k, str(v)[:_MAX_VALUE]) for k, v in values.items() if k not in run.params]
            for i in range(0, len(new), _MAX_BATCH):
                self.client.log_batch(run.id, params=new[i : i + _MAX_BATCH])
            run.params.update(p.key for p in new)
            if self._newer(run, event):
                self.client.update_run(run.id, status="RUNNING")
            # The newest attempt, whatever order the hooks ran in: a later train_end handled
            # first makes this train_begin "not newer" for the status, not for the attempt.
            if event.attempt > int(run.tags.get("ilab.attempt", "0")):
                self._tag(run, "ilab.attempt", str(event.attempt))

    def on_save(self, event: Event, **data: Any) -> None:
        with self._lock:
            found = self._checkpoint(event, data, lambda fate: story.save_tags(fate, event.step))
            if found is None:
                return
            run, fate = found
            where = f"checkpoints/{fate.name}"
            gone = not os.path.isdir(str(data["checkpoint_path"]))  # a replay's removed one
            if self.log_artifacts and not gone and not self.client.list_artifacts(run.id, where):
                self.client.log_artifacts(run.id, str(data["checkpoint_path"]), artifact_path=where)

    def on_train_end(self, event: Event, **data: Any) -> None:
        status = str(data.get("status"))
        with self._lock:
            fold = self._folds.add(event)
            run = self._run(event)
            if run is None:
                return
            self._send(run)  # the points before the ending
            if not self._newer(run, event):
                return
            self._tag(run, "ilab.status", status)
            reason = str(data["reason"]) if data.get("reason") else None
            if reason:
                self._tag(run, "ilab.reason", reason[:_MAX_VALUE])
            self._tags(run, story.end_tags(fold.summary()))
            # the best and the description from the fold, not train_end's best_checkpoint:
            # reports still on their way when it was written land after it
            self._best(run, fold, ending=(status, reason))
            self.client.set_terminated(
                run.id, _STATUS.get(status, "KILLED"), end_time=int(event.ts * 1000)
            )

    def on_evaluate(self, event: Event, **data: Any) -> None:
        with self._lock:
            self._folds.add(event)  # a step's validation belongs to the save at that step
        super().on_evaluate(event, **data)

    def on_report(self, event: Event, **data: Any) -> None:
        super().on_report(event, **data)  # the metrics, at the checkpoint's step
        with self._lock:  # a late report may change the best, after train_end too
            self._checkpoint(event, data, lambda fate: story.report_tags(fate, data))

    def on_checkpoint_removed(self, event: Event, **data: Any) -> None:
        with self._lock:  # the best removed: the next one is
            self._checkpoint(event, data, lambda fate: story.removed_tags(fate, event.step, data))

    def on_control(self, event: Event, **data: Any) -> None:
        with self._lock:
            self._folds.add(event)
            run = self._run(event)
            if run is not None:
                self._tags(run, story.control_tags(data))

    # -- the run's fold ------------------------------------------------------------------

    def _checkpoint(
        self, event: Event, data: dict[str, Any], tags: Callable[[CheckpointFate], dict[str, str]]
    ) -> tuple[_Run, CheckpointFate] | None:
        """Fold a record about a checkpoint (under the lock) and tag its run: ``tags`` of
        the checkpoint's fate, and the fold's best. The run and the fate (None: no run, or
        a checkpoint the fold does not know)."""
        fold = self._folds.add(event)
        fate = self._fate(fold, data)
        run = self._run(event)
        if run is None or fate is None:
            return None
        self._tags(run, tags(fate))
        self._best(run, fold)
        return run, fate

    @staticmethod
    def _fate(fold: RunFold, data: dict[str, Any]) -> CheckpointFate | None:
        """The checkpoint a record names, as the fold knows it (its canonical path)."""
        path = data.get("checkpoint_path")
        return fold.ledger.fate(path) if isinstance(path, str) and path else None

    def _best(self, run: _Run, fold: RunFold, ending: tuple[str, str | None] | None = None) -> None:
        """Tag the run's best and last checkpoint as its fold says now, and once the run has ended
        (``ending``: its train_end's status and reason, else the fold's last attempt's) the
        description that names it. Only changed tags are sent."""
        goal = fold.keep_best()
        best = fold.best(goal) if goal is not None else None
        last = {"ilab.last_checkpoint": fold.last_checkpoint or ""}  # the newest not removed
        for key, value in {**story.best_tags(best), **last}.items():
            if value:
                self._tag(run, key, value[:_MAX_VALUE])
            elif key in run.tags:  # no best any more (removed): no stale name left
                self.client.delete_tag(run.id, key)
                del run.tags[key]
        if ending is None and fold.ended and fold.attempts and fold.attempts[-1].status:
            ending = (fold.attempts[-1].status, fold.attempts[-1].reason)
        if ending is not None:
            self._tags(run, story.note(*ending, best))

    # -- writing -------------------------------------------------------------------------

    def _tags(self, run: _Run, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self._tag(run, key, value[:_MAX_VALUE])

    def write_scalars(self, prefix: str, values: dict[str, float], step: int, event: Event) -> None:
        from mlflow.entities import Metric

        ts = int(event.ts * 1000)
        with self._lock:
            run = self._run(event)
            if run is None:
                return
            new = [
                Metric(k, v, ts, step) for k, v in values.items() if (k, step, ts) not in run.seen
            ]
            run.seen.update((m.key, step, ts) for m in new)
            run.pending += new
            if len(run.pending) >= _MAX_METRICS:
                self._send(run)

    def after_deliveries(self) -> None:
        """Send the batch's metrics: ``log_batch`` calls of up to 1,000 points each."""
        with self._lock:
            for run in self._runs.values():
                self._send(run)

    def close(self) -> None:
        self.after_deliveries()

    def _send(self, run: _Run) -> None:
        metrics, run.pending = run.pending, []
        for i in range(0, len(metrics), _MAX_METRICS):
            self.client.log_batch(run.id, metrics=metrics[i : i + _MAX_METRICS])

    def _tag(self, run: _Run, key: str, value: str) -> None:
        if run.tags.get(key) != value:
            self.client.set_tag(run.id, key, value)
            run.tags[key] = value

    def _newer(self, run: _Run, event: Event) -> bool:
        """Whether ``event`` is later in the journal than the last status change (hooks of
        different events may run out of order; a replay must not undo a later ending)."""
        if event.seq <= int(run.tags.get("ilab.status_seq", "-1")):
            return False
        self._tag(run, "ilab.status_seq", str(event.seq))
        return True

    def _incomplete(self, reason: str) -> str:
        """The one line said when the server stops answering mid-run."""
        ckpt_dir, rid = self._where or ("DIR", "")
        run = f" of journal run {rid}" if rid else ""
        return (
            f"the MLflow tracking server at {self.tracking_uri} stopped answering ({reason}): "
            f"the MLflow run{run} is incomplete (later points and its end are missing); "
            f"`ilab-watch {shlex.quote(ckpt_dir)} --mlflow {self.tracking_uri} --replay` "
            "repairs it once the server is back"
        )

    def _run(self, event: Event) -> _Run | None:
        """The MLflow run of the event's journal run: cached, found by tag, or created."""
        rid = event.run_id
        self._where = (event.ckpt_dir, rid)
        if rid in self._runs:
            return self._runs[rid]
        if not _RUN_ID.match(rid):
            return None  # no run id (or one that could not be a tag filter): nothing to file
        found = self.client.search_runs(
            [self._experiment_id], filter_string=f"tags.`ilab.run_id` = '{rid}'", max_results=1
        )
        if found:
            run = _Run(found[0].info.run_id, params=set(found[0].data.params))
            run.tags = dict(found[0].data.tags)
            for key in found[0].data.metrics:
                for m in self.client.get_metric_history(run.id, key):
                    run.seen.add((key, m.step, m.timestamp))
        else:
            created = self.client.create_run(
                self._experiment_id,
                start_time=int(event.ts * 1000),
                tags={"ilab.run_id": rid, "ilab.ckpt_dir": event.ckpt_dir},
                run_name=self.run_name or f"{Path(event.ckpt_dir).name}-{rid}",
            )
            run = _Run(created.info.run_id, tags=dict(created.data.tags))
        self._runs[rid] = run
        return run
