"""Slurm as a scheduler: ``sbatch --parsable`` to submit, one ``squeue`` for the state of
all jobs, ``scancel`` to cancel. ``SLURM_CONF`` and the other Slurm variables of the
watcher's environment choose the cluster, as for any Slurm command."""

from __future__ import annotations

import shlex

from watcher.scheduler import JobSpec, JobState, SchedulerError, run_tool

#: ``squeue --Format``: id, state, node list and exit code, ``|``-separated, not padded.
_FORMAT = "JobID:|,State:|,NodeList:|,exit_code:|"


class SlurmScheduler:
    """Jobs on the Slurm cluster the environment names. ``sbatch_args`` (one string, split
    like a shell would) go to every ``sbatch``, e.g. ``--gres=gpu:1 --time=30``."""

    name = "slurm"

    def __init__(self, sbatch_args: str | None = None) -> None:
        try:
            self.sbatch_args = shlex.split(sbatch_args or "")
        except ValueError as exc:
            raise ValueError(f"--sbatch-args: {exc}") from None
        self.calls = 0  # scheduler commands run (benchmarks/bench_slurm.py counts them)

    def submit(self, spec: JobSpec) -> str:
        argv = [
            "sbatch",
            *self.sbatch_args,
            *spec.extra_args,
            # ours last, so that they win: the watcher finds the job, its log and its exit
            "--parsable",
            f"--job-name={spec.name}",
            f"--output={spec.log}",
            f"--chdir={spec.workdir}",
            "--export=ALL",  # the ILAB_* environment goes with the job
            str(spec.script),
        ]
        self.calls += 1
        out = run_tool(argv, env=spec.env).strip()
        job_id = out.split(";")[0]  # "id" or "id;cluster"
        if not job_id.isdigit():
            raise SchedulerError(f"sbatch: unexpected answer {out[:80]!r}")
        return job_id

    def states(self, job_ids: list[str]) -> dict[str, JobState]:
        if not job_ids:
            return {}
        self.calls += 1
        out = run_tool(["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-O", _FORMAT])
        states: dict[str, JobState] = {}
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) < 4 or not parts[0].strip():
                continue
            job_id, state, node, code = (p.strip() for p in parts[:4])
            states[job_id] = JobState(
                state.split()[0] if state else "UNKNOWN",
                node or None,
                int(code) if code.lstrip("-").isdigit() else None,
            )
        return states

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            self.calls += 1
            run_tool(["scancel", *job_ids])

    def find(self, name: str) -> str | None:
        self.calls += 1
        out = run_tool(["squeue", "-h", "-t", "all", "-n", name, "-o", "%i"]).split()
        return out[0] if out else None
