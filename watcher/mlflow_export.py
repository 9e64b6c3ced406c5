"""``ilab-watch DIR --mlflow [TRACKING_URI]``: the journal as MLflow runs.

One MLflow run per journal ``run_id`` (tagged ``ilab.run_id``), found again by that tag, so
a resume, a restarted watcher and a replay all continue the same run. Params come from
``train_begin``'s config (nested keys joined with dots; MLflow params cannot change, so a
resume that changes a setting keeps the first value). Metrics are the exporters' shared
``train/*``, ``eval/*`` and ``report/*`` (watcher/export.py) at their steps, with the
record's time as timestamp. Each ``save`` sets a ``checkpoint.<name>`` tag to its path (and
with ``log_artifacts`` copies the checkpoint in as artifacts under ``checkpoints/<name>``).
The run's status follows ``train_begin`` (RUNNING) and ``train_end`` (FINISHED for
completed or stopped, FAILED, KILLED for interrupted), in journal order.

No duplicates: the exporter reads the run's metric history first and skips a point it holds
(same key, step and timestamp). Needs the ``mlflow`` package (``ilab-journal[mlflow]``).
"""

from __future__ import annotations

import os
import re
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from watcher.callbacks import CallbackSpecError, Event
from watcher.export import MetricsExport, flatten

DEFAULT_EXPERIMENT = "ilab-journal"
_STATUS = {"completed": "FINISHED", "stopped": "FINISHED", "failed": "FAILED"}
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_MAX_BATCH = 100  # MLflow's limit on params or tags per log_batch call
_MAX_VALUE = 6000  # MLflow's limit on a param value's length


@dataclass
class _Run:
    """What one MLflow run already holds."""

    id: str
    seen: set[tuple[str, int, int]] = field(default_factory=set)  # (key, step, timestamp ms)
    params: set[str] = field(default_factory=set)
    tags: dict[str, str] = field(default_factory=dict)


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


class MlflowExport(MetricsExport):
    """Writes the journal's runs to an MLflow tracking server or store.

    Args:
        tracking_uri: where to (default: ``MLFLOW_TRACKING_URI``, else MLflow's default).
        experiment: experiment name (default: ``MLFLOW_EXPERIMENT_NAME``, else
            ``ilab-journal``); created when missing.
        log_artifacts: copy each saved checkpoint into the run's artifacts (default: only
            its path, as a tag).

    Raises:
        CallbackSpecError: mlflow is not installed, or the tracking URI does not work.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        experiment: str | None = None,
        log_artifacts: bool = False,
    ) -> None:
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
        try:
            self.client = MlflowClient(uri)
            self.tracking_uri = uri or mlflow.get_tracking_uri()
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
            if self.log_artifacts and not self.client.list_artifacts(run.id, f"checkpoints/{name}"):
                self.client.log_artifacts(run.id, path, artifact_path=f"checkpoints/{name}")

    def on_train_end(self, event: Event, **data: Any) -> None:
        status = str(data.get("status"))
        with self._lock:
            run = self._run(event)
            if run is None or not self._newer(run, event):
                return
            self._tag(run, "ilab.status", status)
            if data.get("reason"):
                self._tag(run, "ilab.reason", str(data["reason"])[:_MAX_VALUE])
            self.client.set_terminated(
                run.id, _STATUS.get(status, "KILLED"), end_time=int(event.ts * 1000)
            )

    # -- writing -------------------------------------------------------------------------

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
            if new:
                self.client.log_batch(run.id, metrics=new)
                run.seen.update((m.key, step, ts) for m in new)

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

    def _run(self, event: Event) -> _Run | None:
        """The MLflow run of the event's journal run: cached, found by tag, or created."""
        rid = event.run_id
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
                run_name=f"{Path(event.ckpt_dir).name}-{rid}",
            )
            run = _Run(created.info.run_id, tags=dict(created.data.tags))
        self._runs[rid] = run
        return run
