"""What ``run_training`` returns and raises (re-exported by :mod:`trainer.launch`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class RunDirBusy(RuntimeError):
    """Another launch is running in this checkpoint dir (``ilab-train`` exits 3)."""


class TrainingFailed(RuntimeError):
    """The run ended with status ``failed``; the message names the error and the log file."""

    def __init__(self, message: str, result: TrainingResult) -> None:
        super().__init__(message)
        self.result = result


class NoProgress(TrainingFailed):
    """``max_no_progress_attempts`` failed attempts in a row saved no new checkpoint: a crash
    loop, relaunched no more (``ilab-train`` exits 4); the message gives each attempt's
    cause."""


@dataclass
class TrainingResult:
    status: str  # completed | stopped | failed | interrupted
    reason: str | None
    final_checkpoint: str | None
    last_metrics: dict[str, Any]
    last_checkpoint: str | None
    journal_path: Path
    log_path: Path
    returncode: int
    run_id: str | None = None
    attempt: int | None = None
    callbacks: list[dict[str, Any]] = field(default_factory=list)
    #: report_to's trackers: "ok", or what failed and the ilab-watch line that replays it
    trackers: dict[str, str] = field(default_factory=dict)
    #: attempts relaunched after a failure or a hang (``max_restarts``)
    restarts: int = 0
