"""What the launcher hands every torchrun worker, as a JSON file: plain data only."""

from __future__ import annotations

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
