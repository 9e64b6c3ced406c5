"""Evals as Slurm jobs (``ilab-watch --via slurm``), on a one-node Slurm started here
(tests/slurm_cluster.py; skipped in one line where Slurm is not installed).

Side by side in one run:

1. **Save to job start.** N saves (50; 10 with --quick) appended one at a time to a live
   journal, each after the previous eval ended, delivered by ``ilab-watch --via slurm``;
   against a bare loop of ``sbatch --wait`` over the same script, and a bare loop that
   submits the next job once ``squeue`` shows the previous one ended (the watcher's rhythm:
   Slurm itself starts a job later when it comes just after another one ended). Each job
   writes the time it started; the watcher's figure is job start - the save record's
   ``ts`` (split into save -> ``sbatch`` answered, the watcher's own part, and the rest),
   a loop's is job start - the moment before ``sbatch``. Goal: the watcher within 1 s of
   Slurm's own.
2. **Scheduler calls per poll.** A JobBoard following 1 and then 50 jobs in flight (queued
   or running) for 10 polls: ``squeue`` calls per poll (goal: 1 for both), and one
   ``squeue`` for 50 jobs against 50 single-job ``squeue`` calls.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import job_saves
from benchmarks.common import bench_parser, emit, pct
from benchmarks.job_saves import JOB
from tests.helpers import wait_for
from tests.slurm_cluster import SlurmCluster, SlurmUnavailable, running_cluster
from watcher.scheduler import JobSpec
from watcher.scheduler.board import JobBoard
from watcher.scheduler.slurm import SlurmScheduler


def bare_loop(cluster: SlurmCluster, root: Path, n: int) -> list[float]:
    """``sbatch --wait`` one job after another: Slurm's own submit-to-start time."""
    out = root / "bare"
    out.mkdir()
    script = root / "bare.sh"
    script.write_text(JOB.format(out=out))
    waits = []
    for i in range(n):
        t0 = time.time()
        subprocess.run(
            ["sbatch", "--wait", "-c1", "-o", "/dev/null", str(script), str(i)],
            env=cluster.env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        waits.append(float((out / f"start-{i}").read_text()) - t0)
    return waits


def bare_poll_loop(cluster: SlurmCluster, root: Path, n: int) -> list[float]:
    """``sbatch --parsable``, then ``squeue`` every 0.2 s until the job ended, then the next:
    the watcher's rhythm without the watcher (Slurm starts a job later when it comes just
    after the previous one ended: its scheduling pass, not the submitter)."""
    out = root / "poll"
    out.mkdir()
    script = root / "poll.sh"
    script.write_text(JOB.format(out=out))
    sched = SlurmScheduler("-c1")
    waits = []
    for i in range(n):
        env = {**cluster.env, "ILAB_SEQ": str(i)}
        spec = JobSpec(f"poll-{i}", script, env, Path("/dev/null"), root)
        t0 = time.time()
        job_id = sched.submit(spec)
        wait_for(lambda j=job_id: (st := sched.states([j]).get(j)) and st.final, 120, "job end")
        waits.append(float((out / f"start-{i}").read_text()) - t0)
    return waits


def calls_per_poll(cluster: SlurmCluster, root: Path, n_jobs: int, polls: int) -> dict[str, Any]:
    """A board following ``n_jobs`` in flight for ``polls`` polls: squeue calls per poll."""
    sched = SlurmScheduler("-c1")
    script = root / "sleep.sh"
    script.write_text("#!/bin/sh\nsleep 600\n")
    ids = [
        sched.submit(JobSpec(f"b{n_jobs}-{i}", script, dict(os.environ), Path("/dev/null"), root))
        for i in range(n_jobs)
    ]
    before = sched.calls
    board = JobBoard(sched, poll_s=0.2)
    for job_id in ids:
        board.watch(job_id)
    wait_for(lambda: board.polls >= polls, 120, f"{polls} polls")
    board.close()
    calls = sched.calls - before
    t = time.perf_counter()
    sched.states(ids)
    one_query = time.perf_counter() - t
    t = time.perf_counter()
    for job_id in ids:
        sched.states([job_id])
    per_job = time.perf_counter() - t
    sched.cancel(ids)
    return {
        "jobs_in_flight": n_jobs,
        "polls": board.polls,
        "squeue_calls": calls,
        "calls_per_poll": calls / board.polls,
        "one_query_s": one_query,
        "one_query_per_job_s": per_job,
    }


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    n = 10 if args.quick else 50
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        root = Path(tmp)
        try:
            cluster_cm = running_cluster(root / "slurm")
            cluster = cluster_cm.__enter__()
        except SlurmUnavailable as exc:
            print(f"bench_slurm: skipped: {exc}")
            emit("bench_slurm", {"skipped": str(exc)}, args.json)
            return
        os.environ["SLURM_CONF"] = str(cluster.conf)  # for the scheduler's squeue here
        try:
            bare = bare_loop(cluster, root, n)
            polled = bare_poll_loop(cluster, root, n)
            watch = job_saves.watched(
                root,
                n,
                {"SLURM_CONF": str(cluster.conf)},
                ("--via", "slurm", "--sbatch-args", "-c1 -o /dev/null", "--job-poll", "0.2"),
            )
            polls = [calls_per_poll(cluster, root, k, 10) for k in (1, 50)]
        finally:
            cluster_cm.__exit__(None, None, None)
    waits, own = watch["waits"], watch["own"]
    result: dict[str, Any] = {
        "saves": n,
        "bare_sbatch_to_start_p50_s": pct(bare, 50),
        "bare_sbatch_to_start_p95_s": pct(bare, 95),
        "watcher_save_to_start_p50_s": pct(waits, 50),
        "watcher_save_to_start_p95_s": pct(waits, 95),
        "watcher_save_to_sbatch_p50_s": pct(own, 50),
        "watcher_save_to_sbatch_p95_s": pct(own, 95),
        "watcher_sbatch_to_start_p50_s": pct(watch["scheduler"], 50),
        "bare_poll_loop_to_start_p50_s": pct(polled, 50),
        "bare_poll_loop_to_start_p95_s": pct(polled, 95),
        "watcher_minus_sbatch_wait_p50_s": pct(waits, 50) - pct(bare, 50),
        "watcher_minus_poll_loop_p50_s": pct(waits, 50) - pct(polled, 50),
        # the goal: within 1 s of what Slurm takes in the same rhythm (the poll loop)
        "within_1s": pct(waits, 50) - pct(polled, 50) <= 1.0,
        "calls_per_poll_1_job": polls[0]["calls_per_poll"],
        "calls_per_poll_50_jobs": polls[1]["calls_per_poll"],
        "squeue_50_jobs_one_query_s": polls[1]["one_query_s"],
        "squeue_50_jobs_one_per_job_s": polls[1]["one_query_per_job_s"],
        "one_per_job_vs_one_query": polls[1]["one_query_per_job_s"] / polls[1]["one_query_s"],
        "polls": polls,
        "bare_waits_s": bare,
        "poll_loop_waits_s": polled,
        "watcher_waits_s": waits,
        "watcher_save_to_sbatch_s": own,
    }
    emit("bench_slurm", result, args.json)


if __name__ == "__main__":
    main()
