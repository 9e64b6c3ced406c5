"""Local processes as a scheduler: each job is ``sh SCRIPT`` in its own session on this
machine, with its output in its log. A job outlives a watcher killed with ``kill -9`` (as a
Slurm job would), so a restarted watcher re-attaches to it: the id holds the pid and its
start time, which tell the job from a process that reused the pid. Its environment is a
cluster job's (:func:`~watcher.scheduler.job_env`), so that ``--via local`` rehearses what
a Slurm or Ray job will get."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterable

from journal.rundir.procs import start_time
from watcher.scheduler import JobSpec, JobState, SchedulerError, job_env


class LocalScheduler:
    """Jobs as processes of this machine (``ilab-watch --via local``); ``env_names``
    (``--job-env``) go with each job besides what every job gets."""

    name = "local"

    def __init__(self, env_names: Iterable[str] = ()) -> None:
        self.env_names = tuple(env_names)
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._names: dict[str, str] = {}
        self._lock = threading.Lock()
        self.calls = 0

    def submit(self, spec: JobSpec) -> str:
        self.calls += 1
        try:
            with open(spec.log, "ab") as log:
                proc = subprocess.Popen(
                    ["/bin/sh", str(spec.script)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=job_env(spec.env, self.env_names),
                    cwd=spec.workdir,
                    start_new_session=True,  # its own group: cancel ends it whole
                )
        except OSError as exc:
            raise SchedulerError(f"cannot start {spec.script}: {exc.strerror or exc}") from None
        job_id = f"{proc.pid}-{start_time(proc.pid) or 0}"
        with self._lock:
            self._children[job_id] = proc
            self._names[spec.name] = job_id
        return job_id

    def states(self, job_ids: list[str]) -> dict[str, JobState]:
        self.calls += 1
        out: dict[str, JobState] = {}
        node = os.uname().nodename
        for job_id in job_ids:
            with self._lock:
                proc = self._children.get(job_id)
            if proc is not None:
                code = proc.poll()  # reaps it: no zombie left behind
                if code is None:
                    out[job_id] = JobState("RUNNING", node)
                else:
                    state = "COMPLETED" if code == 0 else "FAILED"
                    out[job_id] = JobState(state if code >= 0 else "CANCELLED", node, code)
            elif _alive(job_id):  # started by a watcher before a restart
                out[job_id] = JobState("RUNNING", node)
            # else: gone, and not ours to ask: the job's exit file says how it ended
        return out

    def cancel(self, job_ids: list[str]) -> None:
        self.calls += 1
        for job_id in job_ids:
            if _alive(job_id):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(job_id.split("-")[0]), signal.SIGTERM)

    def find(self, name: str) -> str | None:
        with self._lock:
            return self._names.get(name)


def _alive(job_id: str) -> bool:
    pid, _, started = job_id.partition("-")
    return pid.isdigit() and start_time(int(pid)) == started
