"""Local processes as a scheduler: each job is ``sh SCRIPT`` in its own session on this
machine, with its output in its log. A job outlives a watcher killed with ``kill -9`` (as a
Slurm job would), so a restarted watcher re-attaches to it: the id holds the pid and its
start time, which tell the job from a process that reused the pid. Its environment is a
cluster job's (:func:`~watcher.scheduler.job_env`), so that ``--via local`` rehearses what
a Slurm or Ray job will get.

Unlike Slurm's, a local job is known to no one but the watcher that started it, so
``find`` cannot find it after a restart. Instead the job starts behind a gate: its shell
waits on a pipe from the watcher, which records the job's id durably beside its script
(``<prefix>.job``, :func:`~watcher.scheduler.markers.record_job`) and then closes the pipe.
The gate opens when the pipe closes, by the watcher or by its death, and the job runs its
script only if that record names it. So a job whose command may have run is always on
disk for a restarted watcher (:func:`~watcher.scheduler.markers.recorded_job`), and one
whose watcher died before recording it ends without running anything: the delivery is
submitted again and its command still runs once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterable

from journal.rundir.procs import start_time
from journal.rundir.safety import APPEND, open_no_follow
from watcher.scheduler import COMMAND_TIMEOUT_S, JobSpec, JobState, SchedulerError, job_env
from watcher.scheduler.markers import JOB_RECORD, record_job

#: The job's shell before its script (``$1``: its record, ``$2``: its script): wait for the
#: watcher's pipe to close (nothing is written to it: EOF is the signal, a dead watcher's
#: too), then run the script, in place (the job's pid and start time stay its id), only if
#: the record names this process.
_GATE = """read -r _ || :
case "$(cat "$1" 2>/dev/null)" in "$$-"*) ;; *) exit 0 ;; esac
exec /bin/sh "$2" </dev/null
"""


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
        proc = self.start_gated(spec)
        job_id = f"{proc.pid}-{start_time(proc.pid) or 0}"
        try:
            record_job(spec.script, job_id)  # before the gate opens: a restart finds the job
        except OSError as exc:
            _open_gate(proc)  # no record: the job ends without running its script
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(COMMAND_TIMEOUT_S)  # reaped, not left a zombie
            raise SchedulerError(f"cannot record job {job_id}: {exc.strerror or exc}") from None
        _open_gate(proc)
        with self._lock:
            self._children[job_id] = proc
            self._names[spec.name] = job_id
        return job_id

    def start_gated(self, spec: JobSpec) -> subprocess.Popen[bytes]:
        """The job's process, waiting at its gate (the module docstring): it runs
        ``spec.script`` only once its stdin pipe is closed AND its record names it."""
        record = spec.script.with_suffix(JOB_RECORD)
        try:
            # the runner checked logs/: the log file itself is never a symlink
            with open(open_no_follow(spec.log, APPEND, root=spec.log.parent), "ab") as log:
                return subprocess.Popen(
                    ["/bin/sh", "-c", _GATE, "ilab-job", str(record), str(spec.script)],
                    stdin=subprocess.PIPE,  # the gate; the script gets /dev/null
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=job_env(spec.env, self.env_names),
                    cwd=spec.workdir,
                    start_new_session=True,  # its own group: cancel ends it whole
                )
        except OSError as exc:
            raise SchedulerError(f"cannot start {spec.script}: {exc.strerror or exc}") from None

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


def _open_gate(proc: subprocess.Popen[bytes]) -> None:
    """Close the job's gate pipe (its shell reads EOF and looks for its record)."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()


def _alive(job_id: str) -> bool:
    pid, _, started = job_id.partition("-")
    return pid.isdigit() and start_time(int(pid)) == started
