"""Callback pacing: training runs at most one step ahead of the launcher's callbacks of
InstructLab or training_hub that hook a point within a step (watcher/builtin/foreign.py).

Such a callback may return a :class:`journal.Control` (or set a hub control flag) at step
N; for every rank to apply it at step N+1 at the latest, rank 0 waits, before the
all-reduce of step N+1 (which carries the control bits), until those callbacks have
handled the journal up to step N's ``step_end``: the launcher's adapters write that step
to ``watch/embedded.progress`` (:func:`journal.rundir.paths.callbacks_progress_path`). The other
ranks wait in the all-reduce, so no collective is added; with callbacks keeping up, the
wait is nil (they run while the next step computes).

The wait ends when the callbacks caught up, a control command arrives, this rank got
SIGINT/SIGTERM, or the deadline passes (a callback stuck for :data:`LIMIT_S`: pacing is
then off for the rest of the attempt, said once). Torch-free.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from trainer.config import TrainingArgs
from trainer.steering.dir_watch import DirWatch
from trainer.steering.lease_pacing import DEADLINE_FRACTION

log = logging.getLogger("trainer")

#: The longest wait for the callbacks at one step (also bounded by 3/4 of --pg-timeout).
LIMIT_S = 60.0
TICK_S = 0.002


def read_progress(path: Path) -> int | None:
    """The step the paced callbacks have handled, None when no launcher writes one."""
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return None


@dataclass(eq=False)  # a pacer is one wait's state, equal to itself only
class CallbackPacer:
    """Rank 0's wait for the paced callbacks before a step's all-reduce.

    Args:
        path: the progress file.
        first_step: the attempt's first step: records before it are not delivered.
        limit_s: the longest wait at one step.
        control: the control directory's watch (its ``changed`` ends the wait, and is
            raised after it so that the step's poll reads the command at once).
        interrupted: true once this rank got SIGINT/SIGTERM.
    """

    path: Path
    first_step: int
    limit_s: float
    _: KW_ONLY
    control: DirWatch | None = None
    interrupted: Callable[[], bool] = lambda: False
    on: bool = field(default=True, init=False)
    _seen: int = field(default=-1, init=False)  # the progress read at the last wait

    @classmethod
    def for_run(
        cls,
        args: TrainingArgs,
        path: Path | None,
        start_step: int,
        poller: Any,
        interrupted: Callable[[], bool],
    ) -> CallbackPacer | None:
        """Rank 0's pacer (it has the control ``poller``) of an attempt that starts after
        ``start_step``; None without a progress file (no paced callbacks) or on other ranks."""
        if path is None or poller is None:
            return None
        limit = min(LIMIT_S, args.pg_timeout_s * DEADLINE_FRACTION)
        return cls(path, start_step + 1, limit, control=poller.watch, interrupted=interrupted)

    def wait(self, step: int, blocking: Callable[[], None] | None = None) -> float:
        """Before the all-reduce of ``step``: wait until ``step - 1`` was handled. Returns
        the seconds waited; ``blocking`` is called once before a wait that blocks (the loop
        declares the phase, so the hang detector does not count it)."""
        if not self.on or step - 1 < self.first_step:
            return 0.0
        done = read_progress(self.path)
        if done is None or done >= step - 1:
            # caught up already: what they returned meanwhile is in control/ by now (a
            # callback's command is written before its step counts as handled), so this
            # step's poll reads the directory rather than wait for its watcher to notice
            if done is not None and done > self._seen and self.control is not None:
                self.control.changed = True
            self._seen = done if done is not None else self._seen
            return 0.0
        if blocking is not None:
            blocking()
        t0 = time.monotonic()
        deadline = t0 + self.limit_s
        while True:
            time.sleep(TICK_S)  # the callbacks run in the launcher meanwhile
            done = read_progress(self.path)
            if done is None or done >= step - 1:
                break
            if self.interrupted() or (self.control is not None and self.control.changed):
                break
            if time.monotonic() >= deadline:
                self.on = False
                log.warning(
                    "the launcher's callbacks are %d step(s) behind after %.0fs: training "
                    "goes on without waiting for them (a control command they return now "
                    "applies later than the next step)",
                    step - 1 - done,
                    self.limit_s,
                )
                break
        if self.control is not None:
            self.control.changed = True  # a command they wrote is read by this step's poll
        self._seen = done if done is not None else self._seen
        return time.monotonic() - t0
