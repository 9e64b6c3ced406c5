"""Command deliveries run as scheduler jobs (``ilab-watch --via``), as the engine sees them.

The engine runs a command hook whose ``HookOptions.via`` names a scheduler with its
:class:`JobCommandRunner`, which makes each attempt through a :class:`JobRun`, made once per
executor (at its first job) by the ``jobs`` factory the watcher was given, with the
:class:`JobSite` it hands over: the watcher's state files and what a job's result needs of
it. watcher/scheduler/runner.py implements it, and ``ilab-watch`` wires the two: the engine
imports nothing of the scheduler's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from watcher.engine.attempts import Retries
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


class JobCommandRunner:
    """Runs the deliveries of command hooks with ``via`` as jobs of the scheduler that
    ``jobs`` makes a :class:`JobRun` for (retried as any delivery is)."""

    def __init__(self, jobs: JobRunners, site: JobSite, retries: Retries) -> None:
        self._jobs = jobs
        self._site = site
        self.retries = retries
        self._job_run: JobRun | None = None  # made at the first job
        self._lock = threading.Lock()

    def deliver(self, d: Delivery) -> DeliveryResult:
        """Run ``d`` until it succeeds, its retries are spent, or the watcher stops."""
        return self.retries.run(d, self._attempt)

    def _attempt(self, d: Delivery, out: DeliveryResult, attempt: int) -> None:
        target: CommandTarget = d.hook.target  # type: ignore[assignment]
        self._job_run_made().run(target, d, out, attempt)

    def _job_run_made(self) -> JobRun:
        with self._lock:
            if self._job_run is None:
                self._job_run = self._jobs(self._site)
            return self._job_run

    def close(self) -> None:
        """Journal the job states still pending (when any job ran)."""
        if self._job_run is not None:
            self._job_run.close()
