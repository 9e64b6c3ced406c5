"""What the launcher hands every torchrun worker, as a JSON file: plain data only."""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import Field

from trainer.config.args import TrainingArgs
from trainer.config.fields import Settings


class WorkerConfig(Settings):
    """What the launcher hands every torchrun worker, as a JSON file: plain data only."""

    args: TrainingArgs
    callbacks_named: dict[str, list[str]] = Field(
        default_factory=dict, description="the launcher's callbacks by name, for train_begin"
    )
    callback_progress: str | None = Field(
        None,
        description="rank 0 waits before each all-reduce until the launcher's paced "
        "callbacks handled the previous step, as this file says (callback_pacing)",
    )
    restart: int = Field(0, ge=0, description="relaunches so far: a relaunch continues the run")
    stalled: int = Field(
        0, ge=0, description="the attempts before it, in a row, that failed saving no checkpoint"
    )

    def relaunch_facts(self, saved: bool) -> dict[str, Any]:
        """What this attempt's failed ``train_end`` says of what follows (:func:`relaunch`;
        ``saved``: whether it saved a checkpoint): its ``restart``, the ``restarts_left``
        and the ``relaunch`` in words. Nothing without ``max_restarts``."""
        if not self.args.max_restarts:
            return {}
        after = relaunch(self.args, self.restart, self.stalled, saved)
        return {"restart": self.restart, "restarts_left": after.left, "relaunch": after.says}


class Relaunch(NamedTuple):
    """What follows a failed attempt: the relaunches left (0: none follows), how many
    failed attempts in a row, its own among them, saved no new checkpoint, and that in words."""

    left: int
    stalled: int
    says: str


def relaunch(args: TrainingArgs, restart: int, stalled: int, saved: bool) -> Relaunch:
    """The one relaunch rule of ``max_restarts`` (docs/alerts.md, "Abort and restart"): the
    launcher follows it; the attempt's failed ``train_end`` and its hang alert say it. The
    failed attempt followed ``restart`` relaunches and ``stalled`` failed attempts in a row
    that saved no checkpoint; ``saved``: whether it saved one. None follows once
    ``max_restarts`` were made, or ``max_no_progress_attempts`` failed attempts in a row
    saved nothing: a crash loop."""
    stalled = 0 if saved else stalled + 1
    most, limit = args.max_restarts, args.max_no_progress_attempts
    if restart >= most:
        used = " used up" * (most > 0)
        return Relaunch(0, stalled, f"no relaunch follows (--max-restarts {most}{used})")
    if stalled >= limit:
        why = f"{stalled} attempt(s) in a row saved no new checkpoint"
        option = f"--max-no-progress-attempts {limit}"
        return Relaunch(0, stalled, f"no relaunch follows: no progress, {why} ({option})")
    last = ", the last" if restart + 1 == most else ""
    if not last and stalled + 1 == limit:
        last = f", the last unless it saves a checkpoint (--max-no-progress-attempts {limit})"
    says = f"a relaunch from the newest checkpoint follows (restart {restart + 1} of {most}{last})"
    return Relaunch(most - restart, stalled, says)
