"""Slurm as a scheduler: ``sbatch --parsable`` to submit, one ``squeue`` for the state of
all jobs, ``scancel`` to cancel. ``SLURM_CONF`` and the other Slurm variables of the
watcher's environment choose the cluster, as for any Slurm command.

``sbatch`` itself runs with the watcher's whole environment (what it needs to reach the
cluster); the job gets only :func:`~watcher.scheduler.job_env`'s names, by name in
``--export`` (their values are sbatch's: none is on the command line), plus what Slurm
gives a job so submitted: its ``SLURM_*`` and the user's login environment on the node
(``SLURM_GET_USER_ENV``), which the named ones override."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

from watcher.scheduler import JobSpec, JobState, SchedulerError, job_env, run_tool

#: ``squeue --Format``: id, state, node list, exit code and reason, ``|``-separated, not padded.
_FORMAT = "JobID:|,State:|,NodeList:|,exit_code:|,Reason:|"
#: What Slurm says of an id it does not know (never had, or forgot after ``MinJobAge``).
#: ``squeue -j`` with ONE such id exits 1 with it; with several it leaves them out.
_UNKNOWN_ID = "invalid job id specified"
#: sbatch options a delivery's job must not have, as ``(long name, short letter, why)``: an
#: array runs one checkpoint's eval once per index; a held job never starts by itself.
_REFUSED = (
    ("array", "a", "a job array would run each checkpoint's eval once per index"),
    ("hold", "H", "a held job never starts by itself (the delivery would wait for ever)"),
)
#: sbatch reads these as --array and --hold; sbatch's environment is the watcher's.
_REFUSED_ENV = {"SBATCH_ARRAY_INX": "array", "SBATCH_HOLD": "hold"}
#: sbatch's short options that take a value (``-c1``, ``-c 1``): the rest of a cluster
#: of short options after one of them is its value, not more options.
_SHORT_WITH_VALUE = frozenset("aAbBcCdDeFGiJLmMnNopqStwx")


class SlurmScheduler:
    """Jobs on the Slurm cluster the environment names. ``sbatch_args`` (one string, split
    like a shell would) go to every ``sbatch``, e.g. ``--gres=gpu:1 --time=30``; ones that
    would run an eval several times or never (``--array``, ``--hold``) are a ValueError.
    ``env_names`` (``--job-env``) go with each job besides what every job gets."""

    name = "slurm"

    def __init__(
        self,
        sbatch_args: str | None = None,
        env: Mapping[str, str] | None = None,
        env_names: Iterable[str] = (),
    ) -> None:
        try:
            self.sbatch_args = shlex.split(sbatch_args or "")
        except ValueError as exc:
            raise ValueError(f"--sbatch-args: {exc}") from None
        refuse_options(self.sbatch_args, os.environ if env is None else env)
        self.env_names = tuple(env_names)
        self.calls = 0  # scheduler commands run (benchmarks/bench_slurm.py counts them)

    def submit(self, spec: JobSpec) -> str:
        argv = [
            "sbatch",
            *self.sbatch_args,
            *spec.extra_args,
            # ours last, so that they win: the watcher finds the job, its log and its exit
            "--parsable",
            f"--job-name={spec.name}",
            f"--output={filename_pattern(spec.log)}",
            # a copy Slurm runs again (a requeue) adds to the log instead of emptying it
            "--open-mode=append",
            f"--chdir={spec.workdir}",
            # the job's environment by name, values from sbatch's (the delivery's): not ALL,
            # which would hand the watcher's secrets to the job and the controller
            "--export=" + ",".join(sorted(job_env(spec.env, self.env_names))),
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
        argv = ["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-O", _FORMAT]
        try:
            out = run_tool(argv)
        except SchedulerError as exc:
            if _UNKNOWN_ID in str(exc).lower():
                return {}  # an answer: Slurm knows none of them (it said so by failing)
            raise
        states: dict[str, JobState] = {}
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) < 5 or not parts[0].strip():
                continue
            job_id, state, node, code, reason = (p.strip() for p in parts[:5])
            states[job_id] = JobState(
                state.split()[0] if state else "UNKNOWN",
                node or None,
                int(code) if code.lstrip("-").isdigit() else None,
                reason if reason and reason != "None" else None,
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


def filename_pattern(path: Path) -> str:
    """``path`` as sbatch's ``--output`` takes it literally. sbatch expands ``%j``, ``%x``,
    ... in it (a run dir named ``exp%j`` would become ``exp1234``, which does not exist, and
    the job fail at launch); a path with a backslash in it is not expanded, but each
    backslash escapes the character after it (Slurm 22.05, tested)."""
    text = str(path)
    if "\\" in text:
        return text.replace("\\", "\\\\")
    return text.replace("%", "%%")


def refuse_options(args: list[str], env: Mapping[str, str]) -> None:
    """Raise ValueError (one line) when ``args`` (``--sbatch-args``, split) or ``env`` hold an
    option of :data:`_REFUSED`, however sbatch would take it: ``--array=0-3``, ``--array
    0-3``, an abbreviation (``--arr``), ``-a0-3``, ``-a 0-3``, a cluster (``-Ha1``)."""
    value_next = False
    for arg in args:
        if value_next:  # "-J -H": "-H" is the job's name
            value_next = False
            continue
        if arg == "--":
            break
        if arg.startswith("--"):
            name = arg[2:].split("=", 1)[0]
            for long, _short, why in _REFUSED:
                # getopt takes any unambiguous prefix; "ar" and "ho" start no other option
                if len(name) >= 2 and long.startswith(name):
                    raise ValueError(f"--sbatch-args: {arg} is refused: {why}")
        elif arg.startswith("-") and len(arg) > 1:
            for i, letter in enumerate(arg[1:], start=2):
                for long, short, why in _REFUSED:
                    if letter == short:
                        raise ValueError(f"--sbatch-args: {arg} (--{long}) is refused: {why}")
                if letter in _SHORT_WITH_VALUE:
                    value_next = i == len(arg)  # "-c 1": the next argument is its value
                    break  # "-c1": the rest is its value
    for var, long in _REFUSED_ENV.items():
        if env.get(var):
            why = next(w for name, _s, w in _REFUSED if name == long)
            raise ValueError(
                f"--via slurm: {var} is set in the environment (sbatch's --{long}): {why}; unset it"
            )
