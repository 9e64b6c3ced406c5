"""Command deliveries run as scheduler jobs (``ilab-watch --via``), as the engine sees them.

The engine runs a command hook whose ``HookOptions.via`` names a scheduler through a
:class:`JobRun`, made once per executor by the ``jobs`` factory the watcher was given, with
the :class:`JobSite` it hands over: the watcher's state files and what a job's result
needs of it. watcher/scheduler/runner.py implements it, and ``ilab-watch`` wires the two:
the engine imports nothing of the scheduler's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from watcher.engine.statedir import StateFiles
from watcher.hooks.callbacks import CommandTarget
from watcher.hooks.delivery import Delivery, DeliveryResult


@dataclass(frozen=True)
class JobSite:
    """What the runner of one executor's jobs is handed."""

    files: StateFiles | None  # job markers and logs (None: a temp dir, logs beside them)
    ckpt_dir: str
    journal: Path
    control_source: str  # the ``source`` of the job records
    stop: threading.Event  # the watcher stops: no more waiting (the jobs run on)
    notice: Callable[[str], None]  # one line, said once
    #: what a command's ``{name}`` placeholders can name, for a delivery
    values: Callable[[Delivery], dict[str, Any]]
    #: a job's ``$ILAB_REPORT`` file: submitted as the delivery's report (or its failure)
    read_report: Callable[[Path, Delivery, DeliveryResult], None]


class JobRun(Protocol):
    """Runs one executor's command deliveries as jobs of one scheduler."""

    def run(self, target: CommandTarget, d: Delivery, out: DeliveryResult, attempt: int) -> None:
        """One attempt of ``d``: submit (or re-attach to) its job, wait for its end, and
        fill ``out``."""
        ...

    def close(self) -> None:
        """The watcher is done: journal the job states still pending."""
        ...


#: Makes an executor's :class:`JobRun`, at its first job.
JobRunners = Callable[[JobSite], JobRun]
