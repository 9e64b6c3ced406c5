"""What "the best checkpoint by a metric" is made of (``keep_best``, ``query --best``,
``status``): the goal (:class:`MetricGoal`), the answer (:class:`BestCheckpoint`) and whether
a journaled checkpoint is still on disk (:func:`on_disk`). The one rule that picks it is the
run's checkpoint ledger (:class:`journal.views.ledger.CheckpointLedger`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from journal.rundir.paths import checkpoint_root, checkpoint_step, in_run_dir


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
    """The best checkpoint by one metric: its path, the metric, its value and its step."""

    checkpoint_path: str
    metric: str
    value: float
    step: int | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def on_disk(run_dir: str | os.PathLike[str], path: str) -> bool:
    """Whether the checkpoint a record names is one of the run's on disk: a ``step-NNNNNN``
    (``checkpoint-N``) by its name where ``run_dir`` keeps it (a record may spell the run dir
    another way, e.g. relative to the trainer's working directory); any other at its path,
    only inside the run dir (:func:`~journal.rundir.paths.in_run_dir`: never ``/etc``)."""
    name = Path(path).name
    if checkpoint_step(name) is not None:
        return (checkpoint_root(run_dir, name) / name).exists()
    return in_run_dir(run_dir, path) and os.path.exists(path)
