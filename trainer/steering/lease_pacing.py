"""Lease pacing (``--max-leased-checkpoints N``): training never runs more than N saves
ahead of the consumers of its checkpoints, however slow they are.

A watcher leases a save's checkpoint while its delivery is queued or running (an eval, an
upload), and ``ilab-journal lease`` by hand counts too (journal/checkpoints/leases.py). Before the
all-reduce of a step that saves by schedule, rank 0 waits while N or more of this run's
checkpoints are leased; the other ranks simply wait in that all-reduce, so no collective is
added. Waiting *before* the all-reduce means a command that the consumer of the previous
checkpoint wrote (an eval's ``stop``) is carried by this very step's all-reduce and applied
here, whatever the speed of the machine.

The wait ends when:

- fewer than N checkpoints are leased (a lease released, or expired by its TTL: a killed
  watcher never pins training);
- a new control command arrives (the step boundary then applies it);
- this rank got SIGINT/SIGTERM (Ctrl-C);
- the deadline passes: a fraction of the collective timeout (``--pg-timeout``), so the other
  ranks, blocked in the all-reduce meanwhile, never time out.

Torch-free: the loop hands in the control directory's watch and the interrupt flag.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Literal

from journal.checkpoints import leases
from journal.rundir.paths import leases_dir
from trainer.config import TrainingArgs
from trainer.steering.decisions import decide
from trainer.steering.dir_watch import DirWatch

log = logging.getLogger("trainer")

#: The longest wait, as a fraction of the collective timeout: the other ranks wait in the
#: step's all-reduce meanwhile, and the rest of the step must still fit in that timeout.
DEADLINE_FRACTION = 0.75
WaitEnd = Literal["free", "released", "control", "interrupt", "deadline"]


def save_scheduled(
    args: TrainingArgs, step: int, samples_seen: int, step_samples: int, epoch_ends: bool
) -> bool:
    """Whether the boundary after ``step`` saves by schedule (``save_every``,
    ``save_samples``, the epoch's end), known before its all-reduce. ``samples_seen``
    includes this step's ``step_samples``. Commanded and ending saves are not paced."""
    if epoch_ends and args.save_at_epoch_end:
        return True
    return decide(step, 0, False, args, samples_seen, step_samples).save is not None


def leased_count(ckpt_dir: str | Path, now: float | None = None) -> tuple[int, float | None]:
    """How many checkpoints of this run hold an unexpired lease (a checkpoint with two
    leases counts once), and when the first of those leases expires (None when none)."""
    held = leases.active(ckpt_dir, now)
    first_expiry = min((lease.expires for lease in held), default=None)
    return len({lease.checkpoint for lease in held}), first_expiry


@dataclass(frozen=True)
class PaceResult:
    """One pacing wait: seconds waited, and why it ended (``free``: nothing to wait for)."""

    waited_s: float
    end: WaitEnd
    leased: int  # checkpoints leased when the wait began


@dataclass(eq=False)  # a pacer is one wait's state, equal to itself only
class LeasePacer:
    """Rank 0's wait for leases before a scheduled save.

    Args:
        ckpt_dir: the run dir (its ``leases/`` is watched).
        max_leased: wait while this many checkpoints or more are leased (>= 1).
        limit_s: the longest wait, in seconds.
        control: the control directory's watch: its ``changed`` flag ends the wait, and is
            raised after a wait so that the step's poll reads ``control/`` at once (a
            consumer writes its command before it releases its lease).
        interrupted: true once this rank got SIGINT/SIGTERM.
        tick_s: how often the flags are looked at while waiting.
    """

    ckpt_dir: str | Path
    max_leased: int
    limit_s: float
    _: KW_ONLY
    control: DirWatch | None = None
    interrupted: Callable[[], bool] = lambda: False
    tick_s: float = 0.05

    def __post_init__(self) -> None:
        if self.max_leased < 1:
            raise ValueError(f"max_leased must be >= 1, not {self.max_leased}")
        self.ckpt_dir = Path(self.ckpt_dir)

    @classmethod
    def for_run(
        cls, args: TrainingArgs, control: DirWatch | None, interrupted: Callable[[], bool]
    ) -> LeasePacer | None:
        """The pacer ``args`` ask for (None when ``max_leased_checkpoints`` is not set)."""
        if args.max_leased_checkpoints is None:
            return None
        limit = args.pg_timeout_s * DEADLINE_FRACTION
        return cls(
            args.ckpt_dir,
            args.max_leased_checkpoints,
            limit,
            control=control,
            interrupted=interrupted,
        )

    def wait(self) -> PaceResult:
        """Block while ``max_leased`` or more checkpoints are leased (see the module doc)."""
        count, next_expiry = leased_count(self.ckpt_dir)
        if count < self.max_leased:
            return PaceResult(0.0, "free", count)
        t0 = time.monotonic()
        log.info(
            "waiting before the save: %d checkpoint(s) leased, at most %d ahead "
            "(--max-leased-checkpoints); up to %.0fs",
            count,
            self.max_leased,
            self.limit_s,
        )
        # The helper thread raises ``changed`` when leases/ changes (a release, a new
        # lease); an expiry changes nothing on disk, so the first one is awaited by time.
        watch = DirWatch(leases_dir(self.ckpt_dir), interval=self.tick_s, name="ilab-lease-watch")
        watch.start()  # ``changed`` starts raised: a release since the count is seen
        try:
            end = self._wait(watch, t0 + self.limit_s, next_expiry)
        finally:
            watch.close()
        waited = time.monotonic() - t0
        if self.control is not None:
            self.control.changed = True  # the step's poll reads control/ now, not in a tick
        if end == "deadline":
            log.warning(
                "saving after %.0fs although %d or more checkpoints are still leased: the "
                "wait is bounded below the collective timeout (--pg-timeout)",
                waited,
                self.max_leased,
            )
        else:
            log.info("waited %.1fs for leases (%s)", waited, end)
        return PaceResult(waited, end, count)

    def _wait(self, watch: DirWatch, deadline: float, next_expiry: float | None) -> WaitEnd:
        while True:
            if self.interrupted():
                return "interrupt"
            if self.control is not None and self.control.changed:
                return "control"
            if watch.changed or (next_expiry is not None and time.time() >= next_expiry):
                watch.changed = False
                count, next_expiry = leased_count(self.ckpt_dir)
                if count < self.max_leased:
                    return "released"
            if time.monotonic() >= deadline:
                return "deadline"
            time.sleep(self.tick_s)  # a signal's handler runs, then the flags are seen
