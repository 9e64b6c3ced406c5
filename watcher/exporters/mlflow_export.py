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
The run's status follows ``train_begin`` (RUNNING) and ``train_end`` (FINISHED for
completed or stopped, FAILED, KILLED for interrupted), in journal order.

No duplicates: the exporter reads the run's metric history first and skips a point it holds
(same key, step and timestamp). Needs the ``mlflow`` package (``ilab-journal[mlflow]``).

A server that dies mid-run: MLflow's client retries each call for minutes, which would hold
the launcher past its grace period with every later record queued behind it. So each call
to an http(s) server runs on a thread of its own while ``/health`` is probed beside it;
after :data:`DOWN_AFTER` unanswered probes in a row (or a failed call and an unanswered
probe) the exporter is down: every later call fails at once with one
:class:`~watcher.exporters.base.TrackerUnavailable` line saying that the MLflow run is incomplete
and that ``ilab-watch DIR --mlflow URI --replay`` repairs it (it is probed again every
:data:`RECHECK_S`).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from watcher.exporters import mlflow_story as story
from watcher.exporters.base import MetricsExport, TrackerUnavailable, flatten
from watcher.hooks.callbacks import CallbackSpecError, Event

DEFAULT_EXPERIMENT = "ilab-journal"
_STATUS = {"completed": "FINISHED", "stopped": "FINISHED", "failed": "FAILED"}
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_MAX_BATCH = 100  # MLflow's limit on params or tags per log_batch call
_MAX_METRICS = 1000  # and on metrics
_MAX_VALUE = 6000  # MLflow's limit on a param value's length

PROBE_EVERY_S = 2.0  # while a call is in flight, /health is asked this often
DOWN_AFTER = 3  # unanswered probes in a row: the server is gone
RECHECK_S = 30.0  # once down, calls fail at once; the server is asked again this often
_CALL_THREAD = "ilab-mlflow-call"
T = TypeVar("T")


@dataclass
class _Run:
    """What one MLflow run already holds."""

    id: str
    seen: set[tuple[str, int, int]] = field(default_factory=set)  # (key, step, timestamp ms)
    params: set[str] = field(default_factory=set)
    tags: dict[str, str] = field(default_factory=dict)
    pending: list[Any] = field(default_factory=list)  # metrics not sent yet (Metric)


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`CallbackSpecError` when an http(s) tracking server does not answer
    (before the client's own retries, which take minutes)."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s):
            pass
    except urllib.error.HTTPError:
        pass  # it answered (a proxy may not serve /health): reachable
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise CallbackSpecError(
            f"cannot reach the MLflow tracking server at {uri}: {reason}"
        ) from None


def _answers(uri: str) -> bool:
    try:
        check_reachable(uri, timeout_s=PROBE_EVERY_S)
    except CallbackSpecError:
        return False
    return True


class _QuietCalls(logging.Filter):
    """urllib3's "Retrying ..." lines of our call threads: the breaker says it, once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.threadName or "").startswith(_CALL_THREAD)


class _Breaker:
    """Runs calls to an http(s) tracking server, giving up when the server stops answering
    (see the module docstring). ``incomplete(reason)`` is the line a down server raises."""

    def __init__(self, uri: str, incomplete: Callable[[str], str]) -> None:
        self.uri = uri
        self.incomplete = incomplete
        self.down: str | None = None
        self._down_at = 0.0
        quiet = logging.getLogger("urllib3.connectionpool")
        if not any(isinstance(f, _QuietCalls) for f in quiet.filters):
            quiet.addFilter(_QuietCalls())

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.down is not None:
            if time.monotonic() - self._down_at < RECHECK_S:
                raise TrackerUnavailable(self.down)
            if not _answers(self.uri):
                self._down_at = time.monotonic()  # asked again in RECHECK_S, not every call
                raise TrackerUnavailable(self.down)
            self.down = None  # back: later records are exported again (earlier need a replay)
        result: list[T] = []
        error: list[BaseException] = []

        def run() -> None:
            try:
                result.append(fn(*args, **kwargs))
            except BaseException as exc:
                error.append(exc)

        # A thread we can stop waiting for: a call on a dead server retries for minutes,
        # and is left to end by itself (its points, if it ever lands them, are deduplicated).
        t = threading.Thread(target=run, name=_CALL_THREAD, daemon=True)
        t.start()
        misses = 0
        while True:
            t.join(PROBE_EVERY_S)
            if not t.is_alive():
                break
            misses = 0 if _answers(self.uri) else misses + 1
            if misses >= DOWN_AFTER:
                self._trip(f"no answer from {self.uri}/health {misses} times in a row")
        if error:
            if not _answers(self.uri):
                self._trip(f"{type(error[0]).__name__}; no answer from {self.uri}/health")
            raise error[0]
        return result[0]

    def _trip(self, reason: str) -> None:
        self.down, self._down_at = self.incomplete(reason), time.monotonic()
        raise TrackerUnavailable(self.down)


class _Guarded:
    """An ``MlflowClient`` whose calls go through a :class:`_Breaker`."""

    def __init__(self, client: Any, breaker: _Breaker) -> None:
        self._client, self._breaker = client, breaker

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr
        return lambda *args, **kwargs: self._breaker.call(attr, *args, **kwargs)


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
        try:
            self.client: Any = MlflowClient(uri)
            self.tracking_uri = uri or mlflow.get_tracking_uri()
            if self.tracking_uri.startswith(("http://", "https://")):
                self.client = _Guarded(self.client, _Breaker(self.tracking_uri, self._incomplete))
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
        path = data.get("checkpoint_path")
        if not isinstance(path, str):
            return
        name = Path(path).name
        with self._lock:
            run = self._run(event)
            if run is None:
                return
            self._tag(run, f"checkpoint.{name}", path)
            self._tag(run, "ilab.last_checkpoint", path)
            self._tags(run, story.save_tags(event.step, data))
            if self.log_artifacts and not self.client.list_artifacts(run.id, f"checkpoints/{name}"):
                self.client.log_artifacts(run.id, path, artifact_path=f"checkpoints/{name}")

    def on_train_end(self, event: Event, **data: Any) -> None:
        status = str(data.get("status"))
        with self._lock:
            run = self._run(event)
            if run is None:
                return
            self._send(run)  # the points before the ending
            if not self._newer(run, event):
                return
            self._tag(run, "ilab.status", status)
            if data.get("reason"):
                self._tag(run, "ilab.reason", str(data["reason"])[:_MAX_VALUE])
            self._tags(run, story.end_tags(status, data))
            self.client.set_terminated(
                run.id, _STATUS.get(status, "KILLED"), end_time=int(event.ts * 1000)
            )

    def on_report(self, event: Event, **data: Any) -> None:
        super().on_report(event, **data)  # the metrics, at the checkpoint's step
        self._story(event, story.report_tags(data))

    def on_checkpoint_removed(self, event: Event, **data: Any) -> None:
        self._story(event, story.removed_tags(event.step, data))

    def on_control(self, event: Event, **data: Any) -> None:
        self._story(event, story.control_tags(data))

    def _story(self, event: Event, tags: dict[str, str]) -> None:
        with self._lock:
            run = self._run(event)
            if run is not None:
                self._tags(run, tags)

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
