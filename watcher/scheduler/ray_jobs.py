"""Ray jobs as a scheduler (``ilab-watch --via ray``), through Ray's job submission API
(``ray.job_submission.JobSubmissionClient``): the same HTTP endpoint ``ray job submit``
uses, a Ray head's dashboard port (8265) or a KubeRay cluster's job endpoint.

``submit`` runs the job script as the job's entrypoint, ``sh SCRIPT >> LOG 2>&1`` in the
watcher's working directory (the run dir is on a filesystem the cluster shares, as for
Slurm), with :func:`~watcher.scheduler.job_env` of the delivery's environment as the
job's ``env_vars`` (``ILAB_*``, what a program needs to start, ``--job-env``'s names; no
``RAY_*``: the driver's own), which the dashboard shows to anyone who can reach it: the
watcher's other variables, its secrets among them, stay with it. ``states`` is ONE
``list_jobs`` call for all jobs in flight; ``cancel`` stops each job; ``find`` looks the
job up by the name the runner gave it (kept in the job's metadata: the submission id has a
random suffix, so that a second watcher's job of the same name is never refused as a
duplicate).

Every call has a timeout (:data:`~watcher.scheduler.COMMAND_TIMEOUT_S`) and its failure is
one line (:class:`~watcher.scheduler.SchedulerError`). Imports Ray only when used.
"""

from __future__ import annotations

import os
import shlex
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from journal.record.numbers import parse_number, shown_value
from watcher.scheduler import COMMAND_TIMEOUT_S, JobSpec, JobState, SchedulerError, job_env

#: Ray's job statuses as the runner's (Slurm's) names.
_STATES = {
    "PENDING": "PENDING",
    "RUNNING": "RUNNING",
    "SUCCEEDED": "COMPLETED",
    "FAILED": "FAILED",
    "STOPPED": "CANCELLED",
}
#: ``--ray-resources`` names that are entrypoint arguments of their own; any other is a
#: custom resource (``entrypoint_resources``).
_OWN = {"num_cpus": "entrypoint_num_cpus", "num_gpus": "entrypoint_num_gpus"}
_T = TypeVar("_T")


def parse_resources(text: str | None) -> dict[str, Any]:
    """``num_cpus=1,num_gpus=1,memory=4e9,accel=1`` as ``submit_job`` keyword arguments;
    ValueError (one line) for a malformed item or an amount that is not a finite number,
    0 or more (nan or inf would pass here and fail only at the first submit)."""
    out: dict[str, Any] = {}
    custom: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"--ray-resources: {shown_value(item.strip())!r} is not NAME=AMOUNT")
        try:
            amount = parse_number(value, low=0)
        except ValueError as exc:
            raise ValueError(f"--ray-resources {name}={shown_value(value)}: {exc}") from None
        if name in _OWN:
            out[_OWN[name]] = amount
        elif name == "memory":
            out["entrypoint_memory"] = int(amount)
        else:
            custom[name] = amount
    if custom:
        out["entrypoint_resources"] = custom
    return out


def ray_address(given: str | None, env: Mapping[str, str] = os.environ) -> str:
    """The job endpoint: ``--ray-address``, else ``$RAY_ADDRESS``; ``http://`` added to a
    bare ``host:port``. ValueError when neither is given."""
    address = given or env.get("RAY_ADDRESS") or ""
    if not address:
        raise ValueError(
            "--via ray needs --ray-address URL or $RAY_ADDRESS (e.g. http://head:8265)"
        )
    if "://" not in address:
        address = f"http://{address}"
    return address


class RayScheduler:
    """Jobs on the Ray cluster at ``address`` (see the module docstring); ``resources`` are
    :func:`parse_resources`'s keyword arguments for every job; ``env_names``
    (``--job-env``) go with each job besides what every job gets."""

    name = "ray"

    def __init__(
        self,
        address: str,
        resources: Mapping[str, Any] | None = None,
        env_names: Iterable[str] = (),
    ) -> None:
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError as exc:
            raise ValueError(
                f"--via ray: Ray's job client cannot be imported ({exc}); "
                "pip install 'ilab-journal[ray]'"
            ) from None

        class _Client(JobSubmissionClient):
            """Every request bounded in time: a head that stops answering is an error."""

            def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
                kwargs.setdefault("timeout", COMMAND_TIMEOUT_S)
                return super()._do_request(method, endpoint, **kwargs)

        self.address = address
        self.resources = dict(resources or {})
        self.env_names = tuple(env_names)  # --job-env: sent besides what every job gets
        self.calls = 0  # job API calls made (benchmarks/bench_ray.py counts them)
        try:
            self.client = _Client(address)
        except Exception as exc:  # ConnectionError, RuntimeError, ...: one line
            raise ValueError(f"--via ray: cannot reach Ray at {address}: {_line(exc)}") from None

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        self.calls += 1
        try:
            return fn()
        except Exception as exc:
            raise SchedulerError(f"ray {what} ({self.address}): {_line(exc)}") from None

    def submit(self, spec: JobSpec) -> str:
        q = shlex.quote
        entrypoint = f"cd {q(str(spec.workdir))} && exec /bin/sh {q(str(spec.script))} >> {q(str(spec.log))} 2>&1"
        env = job_env(spec.env, self.env_names)  # ILAB_* and named ones: never RAY_*
        submission_id = f"{spec.name}-{uuid.uuid4().hex[:8]}"
        return self._call(
            "submit",
            lambda: self.client.submit_job(
                entrypoint=entrypoint,
                submission_id=submission_id,
                runtime_env={"env_vars": env},
                metadata={"ilab_name": spec.name},
                **self.resources,
            ),
        )

    def _jobs(self) -> list[Any]:
        return self._call("list_jobs", self.client.list_jobs)

    def states(self, job_ids: list[str]) -> dict[str, JobState]:
        if not job_ids:
            return {}
        wanted = set(job_ids)
        out: dict[str, JobState] = {}
        for job in self._jobs():  # one call, however many jobs are in flight
            if job.submission_id in wanted:
                status = str(getattr(job.status, "value", job.status))
                node = _node(job)
                state = _STATES.get(status, status)
                out[job.submission_id] = JobState(
                    state,
                    node,
                    job.driver_exit_code,
                    (job.message or None) if state == "PENDING" else None,
                )
        return out

    def cancel(self, job_ids: list[str]) -> None:
        for job_id in job_ids:  # Ray stops one job a call
            self._call("stop_job", lambda j=job_id: self.client.stop_job(j))  # type: ignore[misc]

    def find(self, name: str) -> str | None:
        ours = [j for j in self._jobs() if (j.metadata or {}).get("ilab_name") == name]
        ours.sort(key=lambda j: j.start_time or 0)
        return ours[-1].submission_id if ours else None


def _node(job: Any) -> str | None:
    """Where the job's driver runs: its node's address, else Ray's node id (shortened)."""
    info = job.driver_info
    if info is not None and getattr(info, "node_ip_address", None):
        return str(info.node_ip_address)
    agent = job.driver_agent_http_address or ""
    if "://" in agent:
        return agent.split("://", 1)[1].rsplit(":", 1)[0] or None
    return job.driver_node_id[:12] if job.driver_node_id else None


def _line(exc: BaseException) -> str:
    """An exception as one line (Ray's messages may span several)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]
