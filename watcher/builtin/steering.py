"""Built-in callbacks that steer training: early stopping and divergence detection.

Both are ordinary :class:`TrainerCallback` objects (usable in ``TrainingArgs(callbacks=[...])``
and from ``ilab-watch --early-stopping ... / --divergence ...``). Their state is a pure function
of the journal: ``restore_state()`` rebuilds it from history, so a restarted watcher or a resumed run
keeps patience counters and best values, which in-process callbacks lose with the process.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from typing import Any, Literal

from journal.channels.control import Control
from journal.record.numbers import parse_number, shown_value
from journal.record.record import Record
from watcher.hooks.callbacks import CallbackSpecError, Event, TrainerCallback

log = logging.getLogger("watcher")

Action = Literal["stop", "abort"]


@functools.cache
def log_metrics() -> frozenset[str]:
    """Metrics the trainer's log records carry; any other name (not val_*) is a reported
    one. Read from the schema when first asked: its models load pydantic (80 ms of every
    ``ilab-watch`` start otherwise)."""
    from journal.record.schema import LogData

    return frozenset(LogData.model_fields)


#: How each numeric setting of the built-ins is judged (:func:`parse_number`'s arguments):
#: the constructors and ``--early-stopping``/``--divergence`` (and backtest sweeps) alike.
NUMERIC_SETTINGS: dict[str, dict[str, Any]] = {
    "patience": {"whole": True, "low": 1},
    "warmup": {"whole": True, "low": 0},
    "min_delta": {"low": 0},
    "smoothing": {"low": 0, "low_open": True, "high": 1},
    "threshold": {"low": 0, "low_open": True},
    # ema >= best * r: below 1 it would fire on every healthy (positive) loss
    "relative_threshold": {"low": 1},
}


def setting(name: str, value: Any, where: str = "") -> Any:
    """The numeric setting ``name`` (text as typed, or a number) judged by its rule in
    :data:`NUMERIC_SETTINGS`: finite, in range, whole where it counts observations
    (``patience=2.9`` is refused, not cut to 2). :class:`CallbackSpecError` names it."""
    try:
        return parse_number(value, **NUMERIC_SETTINGS[name])
    except ValueError as exc:
        raise CallbackSpecError(f"{where}{name}={shown_value(value)}: {exc}") from None


def _unless_none(name: str, value: Any) -> Any:
    """A setting that None switches off, or :func:`setting`'s judgement of it."""
    return None if value is None else setting(name, value)


def _event_for(metric: str) -> str:
    """Where a metric comes from: ``val_*`` from evaluate, the trainer's own log fields from
    log, anything else (accuracy, pass rates, judge scores) from report records."""
    if metric.startswith("val_"):
        return "evaluate"
    return "log" if metric in log_metrics() else "report"


def record_metrics(event: str | None, data: dict[str, Any]) -> dict[str, Any]:
    """The metrics of a record: a report's are nested under ``metrics``."""
    if event == "report":
        metrics = data.get("metrics")
        return metrics if isinstance(metrics, dict) else {}
    return data


class _MetricCallback(TrainerCallback):
    """Shared plumbing: one metric from log, evaluate or report records, per run, fire once."""

    def __init__(self, metric: str, action: Action, patience: int) -> None:
        if action not in ("stop", "abort"):
            raise CallbackSpecError(f"action must be 'stop' or 'abort', not {action!r}")
        self.metric = metric
        self.event = _event_for(metric)
        # Only that event's hook is delivered; an evaluate metric also reads train_begin,
        # whose configuration says whether evaluate records will come at all.
        self.subscribed_events: tuple[str, ...] = (self.event,)
        self.context_events: tuple[str, ...] = ()
        if self.event == "evaluate":
            self.subscribed_events = ("train_begin", self.event)
            self.context_events = ("train_begin",)
        self.action: Action = action
        self.patience: int = setting("patience", patience)
        self.run_id: str | None = None
        self.warned_missing = False
        self.config_checked: set[str | None] = set()  # run ids whose config was looked at
        self.reset()

    def reset(self) -> None:
        """A fresh run's state: not fired, no best value yet."""
        self.fired = False
        self.best: float | None = None

    # TrainerCallback hooks: only the one matching the metric's event is active.
    def on_train_begin(self, event: Event, **data: Any) -> None:
        if self.event == "evaluate":
            self._check_config(event.run_id, data.get("config"))

    def _measured(self, event: Event, **data: Any) -> Control | None:
        """A ``log``, ``evaluate`` or ``report`` record: the metric's, if of its event."""
        if event.name != self.event:
            return None
        return self._on(event.run_id, record_metrics(self.event, data), live=True)

    on_log = on_evaluate = on_report = _measured

    def restore_state(self, records: list[Record]) -> None:
        # A condition already met in history counts as acted upon: no second command.
        begin: Record | None = None
        for rec in records:
            if rec["event"] == self.event:
                self._on(rec["run_id"], record_metrics(self.event, rec["data"]), live=False)
            elif rec["event"] == "train_begin":
                begin = rec
        if begin is not None and self.event == "evaluate":  # the newest run's settings
            self._check_config(begin["run_id"], begin["data"].get("config"))

    def _check_config(self, run_id: str | None, config: Any) -> None:
        """Warn once per run when its configuration means the metric will not come: no
        validation data (never), or no ``eval_every`` (only on ``control evaluate``). Only
        ilab-train's configuration is judged (it always has both keys): a bridge's run
        (HF Trainer, Accelerate) evaluates by settings of its own."""
        if not isinstance(config, dict) or run_id in self.config_checked:
            return
        if "eval_every" not in config or "val_data_path" not in config:
            return
        self.config_checked.add(run_id)
        if not (config.get("val_data_path") or config.get("demo")):
            lacks = (
                "validation data (val_data_path / --val-data), so %r never comes and it cannot act"
            )
        elif not config.get("eval_every"):
            lacks = "eval_every (--eval-every), so %r comes only when someone sends "
            lacks += "'ilab-journal control evaluate'"
        else:
            return
        log.warning(f"%s: the run has no {lacks}", type(self).__name__, self.metric)

    def _on(self, run_id: str | None, data: dict[str, Any], *, live: bool) -> Control | None:
        if run_id != self.run_id:  # a fresh run in the same directory: start over
            self.reset()
            self.run_id = run_id
        if self.metric not in data and not self.warned_missing:
            # Lightning's ``strict``: a typo in the metric name must not pass in silence.
            self.warned_missing = True
            log.warning(
                "%s: %r is not in %s records (they have: %s); it cannot act until it appears",
                type(self).__name__,
                self.metric,
                self.event,
                ", ".join(sorted(data)) or "nothing",
            )
        reason = self.observe(data)
        if reason is None or self.fired:
            return None
        self.fired = True
        return Control(self.action, reason) if live else None

    def observe(self, data: dict[str, Any]) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError


class EarlyStopping(_MetricCallback):
    """Stop when ``metric`` has not improved by ``min_delta`` for ``patience`` observations.

    Args:
        metric: a field of ``evaluate`` records (names starting with ``val_``), of ``log``
            records (loss, grad_norm, ...), or any metric of ``report`` records (accuracy).
        mode: ``"min"`` (loss-like) or ``"max"`` (accuracy-like).
        patience: observations without improvement before acting.
        min_delta: the smallest change that counts as an improvement.
        action: ``"stop"`` (save, end as stopped) or ``"abort"`` (end without saving).
    """

    #: its name in cursors and results, fixed whatever module it lives in
    CURSOR_LABEL = "watcher.builtins.EarlyStopping"

    def __init__(
        self,
        metric: str = "val_loss",
        mode: Literal["min", "max"] = "min",
        patience: int = 3,
        min_delta: float = 0.0,
        action: Action = "stop",
    ) -> None:
        super().__init__(metric, action, patience)
        if mode not in ("min", "max"):
            raise CallbackSpecError(f"mode must be 'min' or 'max', not {mode!r}")
        self.mode = mode
        self.min_delta: float = setting("min_delta", min_delta)

    def reset(self) -> None:
        super().reset()
        self.bad = 0

    def observe(self, data: dict[str, Any]) -> str | None:
        value = data.get(self.metric)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        better = self.best is None or (
            value < self.best - self.min_delta
            if self.mode == "min"
            else value > self.best + self.min_delta
        )
        if better:
            self.best, self.bad = float(value), 0
            return None
        self.bad += 1
        if self.bad >= self.patience:
            return (
                f"early stopping: {self.metric} did not improve on {self.best:.4g} "
                f"for {self.bad} observations (min_delta {self.min_delta:g})"
            )
        return None


class DivergenceDetector(_MetricCallback):
    """Stop (or abort) when the smoothed loss rises well above its best value, or at once on
    a NaN/Inf loss. Parameters follow Forgather's detector.

    Args:
        smoothing: EMA alpha (higher reacts faster).
        threshold: absolute trigger: ``ema - best_ema >= threshold`` (None disables).
        relative_threshold: relative trigger: ``ema >= best_ema * relative_threshold``.
        patience: consecutive observations above a threshold before acting.
        warmup: initial observations ignored (early loss is noisy and high).
        metric: ``loss`` (log records) or e.g. ``val_loss`` (evaluate records).
        action: ``"stop"`` or ``"abort"``.
    """

    #: its name in cursors and results, fixed whatever module it lives in
    CURSOR_LABEL = "watcher.builtins.DivergenceDetector"

    def __init__(
        self,
        smoothing: float = 0.3,
        threshold: float | None = 1.0,
        relative_threshold: float | None = None,
        patience: int = 3,
        warmup: int = 10,
        metric: str = "loss",
        action: Action = "stop",
    ) -> None:
        super().__init__(metric, action, patience)
        if threshold is None and relative_threshold is None:
            raise CallbackSpecError("give threshold and/or relative_threshold")
        self.smoothing: float = setting("smoothing", smoothing)
        self.threshold: float | None = _unless_none("threshold", threshold)
        self.relative_threshold: float | None = _unless_none(
            "relative_threshold", relative_threshold
        )
        self.warmup: int = setting("warmup", warmup)

    def reset(self) -> None:
        super().reset()
        self.ema: float | None = None
        self.seen = 0
        self.over = 0

    def observe(self, data: dict[str, Any]) -> str | None:
        value = data.get(self.metric)
        if (value is None and data.get("loss_finite") is False) or (
            isinstance(value, (int, float)) and not math.isfinite(value)
        ):
            return f"divergence: {self.metric} is NaN/Inf"
        if not isinstance(value, (int, float)):
            return None
        self.seen += 1
        self.ema = (
            float(value)
            if self.ema is None
            else self.smoothing * value + (1 - self.smoothing) * self.ema
        )
        if self.seen <= self.warmup:
            self.best = self.ema if self.best is None else min(self.best, self.ema)
            return None
        assert self.best is not None or self.warmup == 0
        best = self.ema if self.best is None else self.best
        hit_abs = self.threshold is not None and self.ema - best >= self.threshold
        hit_rel = self.relative_threshold is not None and self.ema >= best * self.relative_threshold
        self.best = min(best, self.ema)
        self.over = self.over + 1 if (hit_abs or hit_rel) else 0
        if self.over >= self.patience:
            return (
                f"divergence: smoothed {self.metric} {self.ema:.4g} vs best {best:.4g} "
                f"for {self.over} observations"
            )
        return None


def parse_builtin(kind: str, spec: str) -> TrainerCallback:
    """``--early-stopping metric=val_loss,patience=3`` style options -> a callback; a
    numeric setting that is not a finite number of its kind is :class:`CallbackSpecError`
    naming it (one line), before the callback is made."""
    cls = {"early-stopping": EarlyStopping, "divergence": DivergenceDetector}[kind]
    kwargs: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise CallbackSpecError(f"--{kind} {spec!r}: expected key=value pairs, got {part!r}")
        if key not in inspect.signature(cls).parameters:
            raise CallbackSpecError(f"--{kind}: unknown setting {key!r}")
        raw = raw.strip()
        value: Any = raw  # metric, mode, action: words
        if raw.lower() in ("none", "off"):
            value = None  # a threshold switched off; any other setting refuses it when made
        elif key in NUMERIC_SETTINGS:
            value = setting(key, raw, f"--{kind} ")
        kwargs[key] = value
    return cls(**kwargs)
