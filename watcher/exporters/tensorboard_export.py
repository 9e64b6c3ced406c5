"""``ilab-watch DIR --tensorboard LOGDIR``: the journal as TensorBoard event files.

Scalars at the record's step, with the record's time as wall time: ``train/*`` from ``log``
(loss, lr, grad_norm, throughput, any other number a bridge logs), ``eval/*`` from
``evaluate``, ``report/*`` from reports (at the reported checkpoint's step). ``save``,
``checkpoint_removed``, ``control`` and ``train_end`` become text (``events/*``); from the
run's fold (journal/views/fold.py, as ``status``, MLflow and W&B say them),
``ilab/last_checkpoint`` (the newest not removed, after each save and removal) and
``ilab/stop_source`` (who ended the run, at ``train_end``). Works live and with
``--replay``, which delivers every save, of removed checkpoints too.

Each journal run gets a subdirectory of LOGDIR, ``<run dir name>-<run id>`` (the name of its
MLflow and W&B runs), which TensorBoard shows as one run: two runs given one LOGDIR stay
two runs (``tensorboard --logdir LOGDIR`` compares them), never one with each step twice,
and a resume continues its run's subdirectory. LOGDIR (resolved) is part of the watcher's
cursor identity: another LOGDIR gets the journal from its start.

Idempotent across watcher restarts (see watcher/exporters/base.py): the exporter first reads what
a run's subdirectory already holds and skips a point it has already written: same tag, step
and wall time. A resumed run's repeated steps have other times, so they are kept, as
TensorBoard shows them.
Needs the ``tensorboard`` package (``pip install 'ilab-journal[tensorboard]'``).
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

from journal.record.fields import accepted
from watcher.exporters.base import MetricsExport, RunFolds, destination_digest, stop_said
from watcher.hooks.callbacks import CallbackSpecError, Event

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _plain(text: str) -> str:
    """``text`` as one plain path component (other characters as ``-``, at most 64); a
    name that is nothing but dots, or empty, as a digest: never a path outside LOGDIR."""
    plain = _UNSAFE.sub("-", text)[:64]
    return plain if plain.strip(".") else f"x{destination_digest(text)}"


def run_subdir(ckpt_dir: str, run_id: str) -> str:
    """The subdirectory of LOGDIR for one journal run: ``<run dir name>-<run id>`` (the
    name of its MLflow and W&B runs), each made a plain path component."""
    name = _plain(Path(os.path.abspath(ckpt_dir)).name)
    return f"{name}-{_plain(run_id)}" if run_id else name


class _RunLog:
    """One journal run's event file writer and the points its subdirectory holds."""

    def __init__(self, logdir: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        logdir.mkdir(parents=True, exist_ok=True)
        self.seen = _written(logdir)
        self.writer = EventFileWriter(str(logdir))


class TensorBoardExport(MetricsExport):
    """Writes the journal's metrics and milestones to TensorBoard event files, one
    subdirectory of ``logdir`` per journal run (:func:`run_subdir`)."""

    def __init__(self, logdir: str | Path) -> None:
        try:
            from tensorboard.summary.writer.event_file_writer import (  # noqa: F401
                EventFileWriter,
            )
        except ImportError:
            raise CallbackSpecError(
                "--tensorboard needs the tensorboard package: pip install 'ilab-journal[tensorboard]'"
            ) from None
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.destination = f"tensorboard {self.logdir.resolve()}"  # the cursor identity
        self._lock = threading.Lock()  # hooks of different events run in different threads
        self._runs: dict[str, _RunLog] = {}  # subdirectory -> its writer, opened on first use
        self._folds = RunFolds()  # each run dir's fold: its checkpoints and who ended it

    # -- hooks (log, evaluate and report: MetricsExport) ----------------------------------

    def on_train_begin(self, event: Event, **data: Any) -> None:
        with self._lock:
            self._folds.add(event)  # a new attempt: the fold's ending is its own

    def on_save(self, event: Event, **data: Any) -> None:
        why = f" ({data['trigger']})" if data.get("trigger") else ""
        self._text("events/save", event, f"{data.get('checkpoint_path')}{why}")
        self._last(event)

    def on_checkpoint_removed(self, event: Event, **data: Any) -> None:
        why = f" ({data['reason']})" if data.get("reason") else ""
        self._text("events/checkpoint_removed", event, f"{data.get('checkpoint_path')}{why}")
        self._last(event)

    def on_control(self, event: Event, **data: Any) -> None:
        with self._lock:
            self._folds.add(event)  # an applied stop: who ended the run
        verdict = "applied" if accepted(data) else "rejected"
        reason = f": {data['reason']}" if data.get("reason") else ""
        self._text("events/control", event, f"{data.get('command')} {verdict}{reason}")

    def on_train_end(self, event: Event, **data: Any) -> None:
        reason = f": {data['reason']}" if data.get("reason") else ""
        self._text("events/train_end", event, f"{data.get('status')}{reason}")
        with self._lock:
            source, by = stop_said(self._folds.add(event).summary())
        self._text("ilab/stop_source", event, f"{source} ({by})" if source else "")  # "": none

    def _last(self, event: Event) -> None:
        """``ilab/last_checkpoint``: the newest checkpoint not removed, as the fold says."""
        with self._lock:
            last = self._folds.add(event).last_checkpoint
        self._text("ilab/last_checkpoint", event, last or "")  # "": every one removed

    # -- writing -------------------------------------------------------------------------

    def write_scalars(self, prefix: str, values: dict[str, float], step: int, event: Event) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._write(event, [Summary.Value(tag=k, simple_value=v) for k, v in values.items()], step)

    def _text(self, tag: str, event: Event, text: str) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        tensor = TensorProto(
            dtype=7,  # DT_STRING
            string_val=[text.encode()],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        self._write(event, [Summary.Value(tag=tag, metadata=meta, tensor=tensor)], event.step)

    def _write(self, event: Event, values: list[Any], step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event as TBEvent
        from tensorboard.compat.proto.summary_pb2 import Summary

        wall_time = event.ts
        with self._lock:
            sub = run_subdir(event.ckpt_dir, event.run_id)
            run = self._runs.get(sub)
            if run is None:
                run = self._runs[sub] = _RunLog(self.logdir / sub)
            new = [v for v in values if (v.tag, step, wall_time) not in run.seen]
            if not new:
                return
            run.writer.add_event(
                TBEvent(wall_time=wall_time, step=step, summary=Summary(value=new))
            )
            run.seen.update((v.tag, step, wall_time) for v in new)

    def after_deliveries(self) -> None:
        """On disk once per batch of records (live: per record), not once per point."""
        with self._lock:
            for run in self._runs.values():
                run.writer.flush()

    def close(self) -> None:
        with self._lock:
            for run in self._runs.values():
                run.writer.close()


def _written(logdir: Path) -> set[tuple[str, int, float]]:
    """(tag, step, wall time) of every point already in ``logdir``."""
    from tensorboard.backend.event_processing.event_accumulator import (
        SCALARS,
        TENSORS,
        EventAccumulator,
    )

    if not any(logdir.glob("events.out.tfevents.*")):
        return set()
    acc = EventAccumulator(str(logdir), size_guidance={SCALARS: 0, TENSORS: 0})
    acc.Reload()
    seen: set[tuple[str, int, float]] = set()
    tags = acc.Tags()
    for tag in tags.get("scalars", []):
        seen.update((tag, e.step, e.wall_time) for e in acc.Scalars(tag))
    for tag in tags.get("tensors", []):
        seen.update((tag, e.step, e.wall_time) for e in acc.Tensors(tag))
    return seen
