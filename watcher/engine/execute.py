"""Running deliveries: one runner per kind of hook, chosen once per lane.

A command hook runs as a process of the watcher (:mod:`watcher.engine.command_runner`) or,
with ``HookOptions.via``, as a scheduler job (:mod:`watcher.engine.jobs`); a Python callable
runs in the watcher (:mod:`watcher.engine.callable_runner`). All of them share one retry loop
(:mod:`watcher.engine.attempts`) and one hand-back (:mod:`watcher.engine.handback`), which
sends what callables return and commands report. Everything an executor uses is given to its
constructor: a backtest gives its own hand-back and checkpoints, and nothing is swapped in
afterwards.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from journal.record.record import Record
from watcher.engine.attempts import Checkpoints, Retries, Runner
from watcher.engine.callable_runner import CallableRunner
from watcher.engine.command_runner import CommandRunner
from watcher.engine.handback import HandBack
from watcher.engine.jobs import JobCommandRunner, JobRunners, JobSite
from watcher.engine.statedir import StateFiles
from watcher.hooks.callbacks import CommandTarget
from watcher.hooks.hook import Hook

log = logging.getLogger("watcher")


class Executor:
    """Runs deliveries for one watcher (or one backtest).

    Args:
        journal: the journal the deliveries' records come from (its dir is the run dir).
        files: the watcher's state files (logs, running markers, scratch; None: none
            written).
        control_source: the ``source`` of what callables send, and of job records.
        stop: ends retries and backoff waits early.
        checkpoints: says whether a save delivery's checkpoint is already gone (skipped).
        notice: says a line once (the state dir cannot be written, a refusal).
        jobs: makes the runner of the command hooks with ``via`` (:mod:`watcher.engine.jobs`).
        handback: sends what callables return and commands report (None: to the run dir's
            ``control/`` and ``reports/``; a backtest keeps them instead).
    """

    def __init__(
        self,
        journal: Path,
        *,
        files: StateFiles | None,
        control_source: str,
        stop: threading.Event,
        checkpoints: Checkpoints,
        notice: Callable[[str], None] = log.warning,
        jobs: JobRunners | None = None,
        handback: HandBack | None = None,
    ) -> None:
        ckpt_dir = str(journal.parent)
        self.files = files
        self.handback = handback or HandBack(ckpt_dir, control_source, notice)
        retries = Retries(stop, checkpoints)
        self.commands = CommandRunner(
            journal, files=files, retries=retries, handback=self.handback, notice=notice
        )
        self.callables = CallableRunner(
            ckpt_dir, retries=retries, handback=self.handback, notice=notice
        )
        self.jobs: JobCommandRunner | None = None
        if jobs is not None:
            site = JobSite(
                files,
                ckpt_dir,
                journal,
                control_source,
                stop,
                notice,
                values=self.commands.values,
                read_report=self.commands.report_from_file,
            )
            self.jobs = JobCommandRunner(jobs, site, retries)

    def runner(self, hook: Hook) -> Runner:
        """The runner of ``hook``'s kind: a callable's, a command's, or a scheduler's jobs
        (a command with ``via``; a callable's ``via`` is not used: it runs in the watcher)."""
        if not isinstance(hook.target, CommandTarget):
            return self.callables
        if hook.options.via is None:
            return self.commands
        if self.jobs is None:  # the Watcher refuses such hooks at its start
            raise RuntimeError("a hook runs via a scheduler, and no jobs= was given")
        return self.jobs

    def lane_runner(self, lane: list[Hook]) -> Runner:
        """The one runner of a lane's hooks (watcher.engine.dispatch.lanes): an object's
        methods are all callables, any other lane is one hook."""
        runner = self.runner(lane[0])
        if any(self.runner(h) is not runner for h in lane[1:]):
            raise ValueError(f"the hooks of {lane[0].label} are not of one kind")
        return runner

    def note_records(self, records: list[Record]) -> None:
        """Records just read: see :meth:`HandBack.note_records`."""
        self.handback.note_records(records)

    def close(self) -> None:
        """Journal the job states still pending (with ``via``), and remove the scratch dir
        made in the system's temp dir, if one was needed."""
        if self.jobs is not None:
            self.jobs.close()
        self.commands.close()


def first_job_hook(hooks: list[Hook]) -> Hook | None:
    """The first of ``hooks`` whose deliveries run as scheduler jobs (a command with
    ``via``: it needs ``jobs=``; a callable's ``via`` is not used: it runs in the watcher)."""
    return next(
        (h for h in hooks if h.options.via is not None and isinstance(h.target, CommandTarget)),
        None,
    )
