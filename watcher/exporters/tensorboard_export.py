"""``ilab-watch DIR --tensorboard LOGDIR``: the journal as TensorBoard event files.

Scalars at the record's step, with the record's time as wall time: ``train/*`` from ``log``
(loss, lr, grad_norm, throughput, any other number a bridge logs), ``eval/*`` from
``evaluate``, ``report/*`` from reports (at the reported checkpoint's step). ``save``,
``control`` and ``train_end`` become text (``events/*``). Works live and with ``--replay``.

Idempotent across watcher restarts (see watcher/exporters/base.py): the exporter first reads what
LOGDIR already holds and skips a point it has already written: same tag, step and wall
time. A resumed run's repeated steps have other times, so they are kept, as TensorBoard
shows them.
Needs the ``tensorboard`` package (``pip install 'ilab-journal[tensorboard]'``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from watcher.exporters.base import MetricsExport
from watcher.hooks.callbacks import CallbackSpecError, Event


class TensorBoardExport(MetricsExport):
    """Writes the journal's metrics and milestones to TensorBoard event files in ``logdir``."""

    def __init__(self, logdir: str | Path) -> None:
        try:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:
            raise CallbackSpecError(
                "--tensorboard needs the tensorboard package: pip install 'ilab-journal[tensorboard]'"
            ) from None
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # hooks of different events run in different threads
        self._seen = _written(self.logdir)
        self._writer = EventFileWriter(str(self.logdir))

    # -- hooks (log, evaluate and report: MetricsExport) ----------------------------------

    def on_save(self, event: Event, **data: Any) -> None:
        why = f" ({data['trigger']})" if data.get("trigger") else ""
        self._text("events/save", event, f"{data.get('checkpoint_path')}{why}")

    def on_control(self, event: Event, **data: Any) -> None:
        verdict = "applied" if data.get("accepted") else "rejected"
        reason = f": {data['reason']}" if data.get("reason") else ""
        self._text("events/control", event, f"{data.get('command')} {verdict}{reason}")

    def on_train_end(self, event: Event, **data: Any) -> None:
        reason = f": {data['reason']}" if data.get("reason") else ""
        self._text("events/train_end", event, f"{data.get('status')}{reason}")

    # -- writing -------------------------------------------------------------------------

    def write_scalars(self, prefix: str, values: dict[str, float], step: int, event: Event) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._write(
            [Summary.Value(tag=k, simple_value=v) for k, v in values.items()], step, event.ts
        )

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
        self._write([Summary.Value(tag=tag, metadata=meta, tensor=tensor)], event.step, event.ts)

    def _write(self, values: list[Any], step: int, wall_time: float) -> None:
        from tensorboard.compat.proto.event_pb2 import Event as TBEvent
        from tensorboard.compat.proto.summary_pb2 import Summary

        with self._lock:
            new = [v for v in values if (v.tag, step, wall_time) not in self._seen]
            if not new:
                return
            self._writer.add_event(
                TBEvent(wall_time=wall_time, step=step, summary=Summary(value=new))
            )
            self._seen.update((v.tag, step, wall_time) for v in new)

    def after_deliveries(self) -> None:
        """On disk once per batch of records (live: per record), not once per point."""
        with self._lock:
            self._writer.flush()

    def close(self) -> None:
        self._writer.close()


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
