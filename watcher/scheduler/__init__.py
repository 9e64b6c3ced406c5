"""Schedulers: where ``ilab-watch --via NAME`` runs a command delivery as a job.

A scheduler is three calls (:class:`Scheduler`): ``submit`` a job script, the ``states`` of
many jobs in ONE query (the watcher polls all its jobs with one call, never one per job),
and ``cancel``; ``find`` looks a job up by the unique name it was submitted with (a
watcher killed between submitting and noting the job id finds it again; a local job,
which no scheduler remembers, by the record it cannot run without: local.py). Two
implementations: :class:`~watcher.scheduler.local.LocalScheduler` (processes on this
machine) and :class:`~watcher.scheduler.slurm.SlurmScheduler` (``sbatch``, ``squeue``,
``scancel``: the scheduler's own commands, no client library). Kubernetes Jobs or Ray
would be a third module with these calls.

Every scheduler command runs with a timeout and its failure is one line
(:class:`SchedulerError`). What a job gets of the watcher's environment is decided here,
once for every scheduler (:func:`job_env`).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Mapping
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


#: What every job gets of the watcher's environment, besides ``ILAB_*`` and the names of
#: ``--job-env``: what a program needs to start (where programs and the Python environment
#: are, the user, locale, time zone, temporary dir, threads) and Hugging Face's cache and
#: offline switches (``--lm-eval``'s jobs read their models and datasets through them).
#: Never a credential: the environment of a Ray job is shown on its dashboard to anyone
#: who can reach it, and a Slurm job's is kept by the controller.
JOB_ENV_NAMES = frozenset(
    {
        *("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR"),
        *("VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "PYTHONPATH", "OMP_NUM_THREADS"),
        *("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE"),
        *("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"),
    }
)
#: Prefixes of the same: the delivery's own ``ILAB_*`` and the locale's ``LC_*``.
JOB_ENV_PREFIXES = ("ILAB_", "LC_")
#: What ``--job-env`` takes: a variable's name (its value is the watcher's).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def job_env(env: Mapping[str, str], names: Iterable[str] = ()) -> dict[str, str]:
    """The environment of a scheduler job, for every scheduler (the one place that decides
    it): of ``env`` (the delivery's: the watcher's plus its ``ILAB_*``), the variables of
    :data:`JOB_ENV_NAMES` and :data:`JOB_ENV_PREFIXES` and those in ``names``
    (``--job-env``); nothing else, so that the watcher's secrets (``AWS_SECRET_ACCESS_KEY``,
    ``HF_TOKEN``, ``WANDB_API_KEY``, ...) stay with it. A name not set is left out."""
    wanted = JOB_ENV_NAMES.union(names)
    return {k: v for k, v in env.items() if k in wanted or k.startswith(JOB_ENV_PREFIXES)}


class SchedulerError(RuntimeError):
    """A scheduler command failed or timed out (one line: the command and why)."""


@dataclass
class JobSpec:
    """One job: run ``script`` (a shell script) with :func:`job_env` of ``env``; output to
    ``log``."""

    name: str  # unique per delivery attempt: how a restarted watcher finds the job
    script: Path
    env: dict[str, str]  # the delivery's (the watcher's and ILAB_*): the scheduler's own too
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
