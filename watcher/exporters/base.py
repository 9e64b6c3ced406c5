"""What every experiment-tracker exporter shares (TensorBoard, MLflow, W&B).

The journal is the run's single source of truth, so a tracker is fed from it by a watcher
callback, live or replayed, with nothing in the training processes. The exporters agree on
which numbers go out and under which names and steps: ``train/*`` from ``log`` at its step,
``eval/*`` from ``evaluate``, ``report/*`` from reports at the reported checkpoint's step.

Delivery is at-least-once (a watcher killed between writing and saving its cursor delivers
again), so each exporter reads back what its target already holds and skips a point it has
written: same name, step and record time. A resumed run's repeated steps have other times,
so they are kept.
"""

from __future__ import annotations

import logging
from typing import Any

from watcher.hooks.callbacks import Event, TrainerCallback
from watcher.hooks.delivery import TrackerUnavailable as TrackerUnavailable

# TrackerUnavailable (raised by the exporters, said once by the engine) lives below both,
# in watcher/hooks/delivery.py: the exporters import it from here, as before.

log = logging.getLogger("watcher")

#: log fields that are not metrics (plus any value that is not a number)
SKIP_LOG_FIELDS = frozenset(
    {"loss_finite", "cuda_mem_allocated", "cuda_max_mem_allocated", "samples_seen"}
)


def numbers(values: dict[str, Any]) -> dict[str, float]:
    """The int and float values (bools and everything else left out)."""
    return {
        k: float(v)
        for k, v in values.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


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


class MetricsExport(TrainerCallback):
    """Base of the exporters: turns ``log``, ``evaluate`` and ``report`` records into named
    scalars at a step and hands them to :meth:`write_scalars`."""

    def on_log(self, event: Event, **data: Any) -> None:
        values = numbers({k: v for k, v in data.items() if k not in SKIP_LOG_FIELDS})
        self._emit("train", event, values, event.step)

    def on_evaluate(self, event: Event, **data: Any) -> None:
        self._emit("eval", event, numbers(data), event.step)

    def on_report(self, event: Event, **data: Any) -> None:
        step = data.get("step")
        self._emit(
            "report",
            event,
            numbers(data.get("metrics") or {}),
            step if isinstance(step, int) else event.step,
        )

    def _emit(self, prefix: str, event: Event, values: dict[str, float], step: int) -> None:
        if values:
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
