"""``ilab-watch``'s scheduler options (``--via``, ``--sbatch-args``, ``--cancel-on-abort``,
``--job-poll``, ``--job-env``) and the :class:`~watcher.scheduler.board.JobBoard` they make."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

import click

from journal.cli.common import Seconds
from watcher.hooks.hook import Hook, HookOptions
from watcher.scheduler import ENV_NAME, Scheduler
from watcher.scheduler.board import DEFAULT_POLL_S, JobBoard
from watcher.scheduler.local import LocalScheduler
from watcher.scheduler.slurm import SlurmScheduler

_SLURM_COMMANDS = ("sbatch", "squeue", "scancel")

SCHEDULER_OPTIONS = [
    click.option(
        "--via",
        type=click.Choice(["slurm", "ray", "local"]),
        help="Run the command hooks as scheduler jobs: slurm (sbatch --parsable, one squeue "
        "per poll for all jobs), ray (Ray's job API, one list_jobs per poll) or local "
        "(processes). A delivery runs, and its checkpoint stays leased, until its job ends; a "
        "restarted watcher re-attaches to its jobs.",
    ),
    click.option(
        "--ray-address",
        metavar="URL",
        help="With --via ray: the job endpoint, e.g. http://head:8265 (a KubeRay cluster's "
        "too) [default: $RAY_ADDRESS].",
    ),
    click.option(
        "--ray-resources",
        metavar="K=V,...",
        help="With --via ray: what each job's entrypoint needs, e.g. num_gpus=1 (it waits "
        "PENDING for a free GPU), num_cpus=2, memory=BYTES, or a custom resource.",
    ),
    click.option(
        "--sbatch-args",
        metavar="ARGS",
        help="With --via slurm: options for every sbatch, e.g. '--gres=gpu:1 --time=30' "
        "(not --array or --hold: an eval would run several times, or never).",
    ),
    click.option(
        "--cancel-on-abort",
        is_flag=True,
        help="With --via: a train_end of an aborted run cancels that attempt's queued jobs and "
        "submits no more for its saves (a resumed attempt's saves are evaluated).",
    ),
    click.option(
        "--job-env",
        "--ray-env",
        "job_env",
        multiple=True,
        metavar="NAME",
        help="With --via: a variable of the watcher's environment that each job gets too "
        "(repeatable; its value is the watcher's; --ray-env is the same option). Otherwise a job gets only ILAB_*, PATH, "
        "HOME, the Python environment, locale, OMP_NUM_THREADS and HF_HOME/HF_*_OFFLINE: no "
        "secret unless named here, and one named here is readable by whoever can read the "
        "job (Ray's dashboard, Slurm's controller).",
    ),
    click.option(
        "--job-poll",
        type=Seconds(0.1),
        default=DEFAULT_POLL_S,
        show_default=True,
        metavar="SECONDS",
        help="With --via: how often the jobs' states are queried (one query for all of them).",
    ),
]


def make_scheduler(
    via: str,
    sbatch_args: str | None = None,
    ray_address: str | None = None,
    ray_resources: str | None = None,
    job_env: Sequence[str] = (),
) -> Scheduler:
    """The scheduler named by ``--via`` (``local``, ``slurm`` or ``ray``); ``job_env``: the
    ``--job-env`` names its jobs get besides :func:`watcher.scheduler.job_env`'s."""
    if via == "slurm":
        return SlurmScheduler(sbatch_args, env_names=job_env)
    if via == "ray":
        from watcher.scheduler.ray_jobs import RayScheduler, parse_resources
        from watcher.scheduler.ray_jobs import ray_address as address_of

        resources = parse_resources(ray_resources)
        return RayScheduler(address_of(ray_address), resources, env_names=job_env)
    if via == "local":
        return LocalScheduler(env_names=job_env)
    raise ValueError(f"unknown scheduler {via!r} (local, slurm or ray)")


def job_board(
    via: str | None,
    sbatch_args: str | None,
    cancel_on_abort: bool,
    job_poll: float,
    ray_address: str | None = None,
    ray_resources: str | None = None,
    job_env: Sequence[str] = (),
) -> JobBoard | None:
    """The board of ``--via`` (None without it); usage mistakes as click.UsageError."""
    ray_given = [
        n for n, v in (("--ray-address", ray_address), ("--ray-resources", ray_resources)) if v
    ]
    if via is None and (sbatch_args is not None or cancel_on_abort):
        raise click.UsageError("--sbatch-args and --cancel-on-abort need --via")
    if via is None and job_env:
        raise click.UsageError("--job-env needs --via (a local command gets the whole environment)")
    if sbatch_args is not None and via != "slurm":  # without --via: said above
        raise click.UsageError("--sbatch-args needs --via slurm")
    if ray_given and via != "ray":
        raise click.UsageError(f"{' and '.join(ray_given)} need(s) --via ray")
    if via is None:
        return None
    if via == "slurm" and (missing := [c for c in _SLURM_COMMANDS if shutil.which(c) is None]):
        raise click.UsageError(f"--via slurm: {', '.join(missing)} not found on PATH")
    check_job_env(job_env, via)
    try:
        scheduler = make_scheduler(via, sbatch_args, ray_address, ray_resources, job_env)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    return JobBoard(scheduler, poll_s=job_poll, cancel_on_abort=cancel_on_abort)


def check_job_env(names: Sequence[str], via: str) -> None:
    """``--job-env`` takes variable names only (a value would be on the command line, for
    ``ps`` to show), and with ``--via ray`` none of Ray's own ``RAY_*`` (a job's driver
    reads them: ``RAY_ADDRESS`` would send it to the dashboard). click.UsageError if not."""
    for name in names:
        if not ENV_NAME.fullmatch(name):
            raise click.UsageError(
                f"--job-env {name!r}: not a variable name (give NAME: the job gets the "
                "watcher's value)"
            )
        if via == "ray" and name.startswith("RAY_"):
            raise click.UsageError(f"--job-env {name}: RAY_* variables are Ray's own, not sent")
        if name not in os.environ:  # a typo, or set in another shell: said, not silently lost
            logging.getLogger("watcher").warning(
                "--job-env %s: not set in this environment; the jobs will not get it", name
            )


def abort_hook(board: JobBoard, options_for: Callable[[str], HookOptions]) -> Hook:
    """The ``train_end`` hook of ``--cancel-on-abort`` (left out of the cursor's name)."""
    fn: Any = board.on_train_end
    return Hook("train_end", fn, options_for("train_end"), label="cancel-on-abort", context=True)


def skipped_words(n_skipped: int, board: JobBoard | None) -> str:
    """The summary's words for ``n_skipped`` deliveries, with why they were skipped: a
    removed checkpoint, or (``--cancel-on-abort``) an aborted attempt."""
    if not n_skipped:
        return ""
    aborted = min(board.skipped_on_abort, n_skipped) if board is not None else 0
    if aborted == 0:
        return f", {n_skipped} skipped (checkpoint removed)"
    if aborted == n_skipped:
        return f", {n_skipped} skipped (run aborted)"
    return (
        f", {n_skipped} skipped ({n_skipped - aborted} checkpoint removed, {aborted} run aborted)"
    )
