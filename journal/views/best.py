"""The best checkpoint by a metric (``keep_best``, ``query --best``, ``status``): folded from
``report`` records (per checkpoint) and ``evaluate`` records (a step's validation belongs to
the checkpoint saved at that step), among checkpoints not journaled as removed and still on
disk."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard

from journal.rundir.paths import checkpoint_key, checkpoint_root, checkpoint_step


@dataclass(frozen=True)
class MetricGoal:
    """``accuracy:max`` / ``val_loss:min``: which metric makes a checkpoint the best."""

    metric: str
    mode: Literal["max", "min"]

    @classmethod
    def parse(cls, text: str) -> MetricGoal:
        """``"accuracy:max"`` -> MetricGoal; raises ValueError with the expected form."""
        metric, sep, mode = text.rpartition(":")
        if not sep or not metric or mode not in ("max", "min"):
            raise ValueError(f"{text!r}: expected METRIC:max or METRIC:min (e.g. val_loss:min)")
        return cls(metric, "max" if mode == "max" else "min")

    def __str__(self) -> str:
        return f"{self.metric}:{self.mode}"

    def better(self, a: float, b: float) -> bool:
        """Whether value ``a`` beats ``b`` for this goal."""
        return a > b if self.mode == "max" else a < b


@dataclass
class BestCheckpoint:
    checkpoint_path: str
    metric: str
    value: float
    step: int | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


#: Records that can change which checkpoint is the best.
BEST_EVENTS = frozenset({"evaluate", "save", "report", "checkpoint_removed"})


@dataclass
class BestTracker:
    """Folds journal records into the best surviving checkpoint for one goal.

    Values come from ``report`` records (per checkpoint) and from ``evaluate`` records (a
    step's validation belongs to the checkpoint saved at that step). Checkpoints journaled
    as removed drop out, and a report that comes for one afterwards does not bring it back
    (until a ``save`` writes a checkpoint of that name again).
    """

    goal: MetricGoal
    _values: dict[str, tuple[float, str, int | None]] = field(default_factory=dict)
    _pending_eval: dict[int, float] = field(default_factory=dict)
    _removed: set[str] = field(default_factory=set)

    def add(self, rec: Mapping[str, Any]) -> None:
        """Fold one record (any event; only :data:`BEST_EVENTS` matter)."""
        event, data = rec.get("event"), rec.get("data")
        if not isinstance(data, Mapping):
            return
        if event == "report":
            metrics = data.get("metrics")
            value = metrics.get(self.goal.metric) if isinstance(metrics, Mapping) else None
            path = data.get("checkpoint_path")
            if _is_number(value) and isinstance(path, str):
                key, step = checkpoint_key(path), data.get("step")
                if key not in self._removed:
                    self._values[key] = (float(value), path, step if _is_int(step) else None)
        elif event == "evaluate":
            value, step = data.get(self.goal.metric), rec.get("step", 0)
            if _is_number(value) and _is_int(step):
                self._pending_eval[step] = float(value)
        elif event == "save":
            step, path = rec.get("step", 0), data.get("checkpoint_path")
            if not _is_int(step):
                return
            if isinstance(path, str):
                key = checkpoint_key(path)
                self._removed.discard(key)  # a fresh checkpoint of that name
                if step in self._pending_eval:
                    self._values.setdefault(key, (self._pending_eval.pop(step), path, step))
            # validations before this save belong to no checkpoint: forget them
            self._pending_eval = {s: v for s, v in self._pending_eval.items() if s > step}
        elif event == "checkpoint_removed" and isinstance(data.get("checkpoint_path"), str):
            key = checkpoint_key(data["checkpoint_path"])
            self._values.pop(key, None)
            self._removed.add(key)

    def to_state(self) -> dict[str, Any]:
        """What was folded, as JSON types (the journal index stores it)."""
        return {
            "goal": str(self.goal),
            "values": {k: list(v) for k, v in self._values.items()},
            "pending_eval": {str(k): v for k, v in self._pending_eval.items()},
            "removed": sorted(self._removed),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> BestTracker:
        """The inverse of :meth:`to_state` (KeyError for a state written before removals
        were kept: the index is then rebuilt)."""
        tracker = cls(MetricGoal.parse(state["goal"]))
        tracker._values = {k: (float(v[0]), str(v[1]), v[2]) for k, v in state["values"].items()}
        tracker._pending_eval = {int(k): float(v) for k, v in state["pending_eval"].items()}
        tracker._removed = {str(k) for k in state["removed"]}
        return tracker

    def best(self, run_dir: str | os.PathLike[str] | None = None) -> BestCheckpoint | None:
        """The best surviving checkpoint, or None when none has a value. With ``run_dir``
        (every reader of a real run passes it), only checkpoints still on disk count: one
        deleted by hand, or a report's that was never saved, is never named (nor kept)."""
        # best first; among equal values the first folded, as a strict "better" would pick
        ranked = sorted(self._values.values(), key=lambda e: e[0], reverse=self.goal.mode == "max")
        for value, path, step in ranked:
            if run_dir is None or on_disk(run_dir, path):
                return BestCheckpoint(path, self.goal.metric, value, step)
        return None


def on_disk(run_dir: str | os.PathLike[str], path: str) -> bool:
    """Whether the checkpoint a record names exists: at its path, or, for a ``step-NNNNNN``
    (``checkpoint-N``), by its name in ``run_dir`` (a record may spell the run dir another
    way, e.g. relative to the trainer's working directory)."""
    if os.path.exists(path):
        return True
    name = Path(path).name
    return checkpoint_step(name) is not None and (checkpoint_root(run_dir, name) / name).exists()


def _is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)
