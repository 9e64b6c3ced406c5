"""Schedulers: where ``ilab-watch --via NAME`` runs a command delivery as a job.

A scheduler is three calls (:class:`Scheduler`): ``submit`` a job script, the ``states`` of
many jobs in ONE query (the watcher polls all its jobs with one call, never one per job),
and ``cancel``; ``find`` looks a job up by the unique name it was submitted with (a
watcher killed between submitting and noting the job id finds it again). Two
implementations: :class:`~watcher.scheduler.local.LocalScheduler` (processes on this
machine) and :class:`~watcher.scheduler.slurm.SlurmScheduler` (``sbatch``, ``squeue``,
``scancel``: the scheduler's own commands, no client library). Kubernetes Jobs or Ray
would be a third module with these calls.

Every scheduler command runs with a timeout and its failure is one line
(:class:`SchedulerError`).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from journal.channels.jobs import FINAL_JOB_STATES

#: Seconds any one scheduler command may take.
COMMAND_TIMEOUT_S = 30.0
#: States of a job that has not started: what ``--cancel-on-abort`` cancels, and what a
#: job whose exit file exists must not be in (a copy the scheduler would run again).
QUEUED_STATES = frozenset(
    {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT"}
)


class SchedulerError(RuntimeError):
    """A scheduler command failed or timed out (one line: the command and why)."""


@dataclass
class JobSpec:
    """One job: run ``script`` (a shell script) with ``env``; output to ``log``."""

    name: str  # unique per delivery attempt: how a restarted watcher finds the job
    script: Path
    env: dict[str, str]
    log: Path
    workdir: Path
    extra_args: list[str] = field(default_factory=list)  # scheduler options (--sbatch-args)


@dataclass
class JobState:
    """What the scheduler says of one job."""

    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    node: str | None = None
    exit_code: int | None = None
    reason: str | None = None  # why a queued job waits (Slurm's: Resources, JobHeldUser, ...)

    @property
    def final(self) -> bool:
        return self.state in FINAL_JOB_STATES

    @property
    def held(self) -> bool:
        """Queued and held: it starts only once released (``scontrol release``)."""
        return self.state in QUEUED_STATES and "held" in (self.reason or "").lower()


class Scheduler(Protocol):
    """Submit, query and cancel jobs (see the module docstring)."""

    name: str

    def submit(self, spec: JobSpec) -> str:
        """Queue the job; its id. Raises :class:`SchedulerError`."""
        ...

    def states(self, job_ids: list[str]) -> dict[str, JobState]:
        """The state of each known job, in one query (ids it does not know are left out)."""
        ...

    def cancel(self, job_ids: list[str]) -> None:
        """Cancel the jobs (queued or running)."""
        ...

    def find(self, name: str) -> str | None:
        """The id of the job submitted with ``name``, if the scheduler still knows it."""
        ...


def run_tool(argv: list[str], *, env: dict[str, str] | None = None) -> str:
    """Run one scheduler command, bounded by :data:`COMMAND_TIMEOUT_S`; its stdout.
    Raises :class:`SchedulerError` with one line: the command and its last stderr line."""
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise SchedulerError(f"{argv[0]}: no answer within {COMMAND_TIMEOUT_S:g}s") from None
    except OSError as exc:
        raise SchedulerError(f"{argv[0]}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exit code {done.returncode}"
        raise SchedulerError(f"{argv[0]}: {why}")
    return done.stdout
