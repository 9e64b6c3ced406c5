"""Evals as Ray jobs (``ilab-watch --via ray``), on a local Ray head started here
(tests/ray_cluster.py; skipped in one line where Ray is not installed or does not start).

Side by side in one run:

1. **Save to job start.** N saves (50; 10 with --quick) appended one at a time to a live
   journal, each after the previous eval ended, delivered by ``ilab-watch --via ray``;
   against a bare loop through Ray's job client (what ``ray job submit`` calls) that
   submits the next job once ``get_job_status`` says the previous one ended (the watcher's
   rhythm, without the watcher), over the same script; and, for reference, 10 runs of the
   ``ray job submit`` CLI itself (it waits for the job's end; each run starts a Python that
   imports Ray, so 10, not 50). Each job writes the time it started; the watcher's figure is job start - the
   save record's ``ts`` (split into save -> ``submit_job`` answered, the watcher's own
   part, and the rest), a loop's is job start - the moment before its submit. Goal: the
   watcher within 1 s of Ray's own (the client loop).
2. **Ray calls per poll.** A JobBoard following 1 and then 50 jobs in flight for 10 polls:
   job API calls per poll (goal: 1 for both: one ``list_jobs``).
"""

from __future__ import annotations

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
from tests.ray_cluster import RayCluster, RayUnavailable, running_ray
from watcher.scheduler import JobSpec
from watcher.scheduler.board import JobBoard
from watcher.scheduler.ray_jobs import RayScheduler


def bare_cli_loop(cluster: RayCluster, root: Path, n: int) -> list[float]:
    """``ray job submit -- sh SCRIPT i`` one after another (the CLI waits for the end)."""
    out = root / "bare"
    out.mkdir()
    script = root / "bare.sh"
    script.write_text(JOB.format(out=out))
    ray = str(Path(sys.executable).parent / "ray")
    waits = []
    for i in range(n):
        t0 = time.time()
        subprocess.run(
            [ray, "job", "submit", "--address", cluster.address, "--", "sh", str(script), str(i)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        waits.append(float((out / f"start-{i}").read_text()) - t0)
    return waits


def bare_client_loop(cluster: RayCluster, root: Path, n: int) -> list[float]:
    """Ray's job client: ``submit_job``, then ``get_job_status`` every 0.2 s until the job
    ended, then the next: Ray's own submit-to-start time in the watcher's rhythm."""
    from ray.job_submission import JobSubmissionClient

    out = root / "client"
    out.mkdir()
    script = root / "client.sh"
    script.write_text(JOB.format(out=out))
    client = JobSubmissionClient(cluster.address)
    waits = []
    for i in range(n):
        t0 = time.time()
        job = client.submit_job(entrypoint=f"sh {script} {i}")
        wait_for(lambda j=job: client.get_job_status(j).is_terminal(), 120, "job end")
        waits.append(float((out / f"start-{i}").read_text()) - t0)
    return waits


def calls_per_poll(cluster: RayCluster, root: Path, n_jobs: int, polls: int) -> dict[str, Any]:
    """A board following ``n_jobs`` in flight for ``polls`` polls: job API calls per poll.
    The jobs stay queued (each needs the head's one CPU, held by a blocker job): 50 running
    jobs would be 50 driver processes on this machine."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.address)
    blocker = client.submit_job(entrypoint="sleep 600", entrypoint_num_cpus=1)
    sched = RayScheduler(cluster.address, {"entrypoint_num_cpus": 1})
    script = root / "sleep.sh"
    script.write_text("#!/bin/sh\nsleep 600\n")
    ids = [
        sched.submit(JobSpec(f"b{n_jobs}-{i}", script, {}, Path("/dev/null"), root))
        for i in range(n_jobs)
    ]
    before = sched.calls
    board = JobBoard(sched, poll_s=0.2)
    for job_id in ids:
        board.watch(job_id)
    wait_for(lambda: board.polls >= polls, 300, f"{polls} polls")
    board.close()
    calls = sched.calls - before
    t = time.perf_counter()
    sched.states(ids)
    one_query = time.perf_counter() - t
    sched.cancel(ids)
    client.stop_job(blocker)
    return {
        "jobs_in_flight": n_jobs,
        "polls": board.polls,
        "ray_calls": calls,
        "calls_per_poll": calls / board.polls,
        "one_list_jobs_s": one_query,
    }


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    n = 10 if args.quick else 50
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        root = Path(tmp)
        try:
            cluster_cm = running_ray(root / "ray")
            cluster = cluster_cm.__enter__()
        except RayUnavailable as exc:
            print(f"bench_ray: skipped: {exc}")
            emit("bench_ray", {"skipped": str(exc)}, args.json)
            return
        try:
            cli_loop = bare_cli_loop(cluster, root, min(n, 10))
            client_loop = bare_client_loop(cluster, root, n)
            watch = job_saves.watched(
                root, n, {"RAY_ADDRESS": cluster.address}, ("--via", "ray", "--job-poll", "0.2")
            )
            polls = [calls_per_poll(cluster, root, k, 10) for k in (1, 50)]
        finally:
            cluster_cm.__exit__(None, None, None)
    waits, own = watch["waits"], watch["own"]
    result: dict[str, Any] = {
        "saves": n,
        "ray_job_submit_cli_runs": len(cli_loop),
        "bare_ray_job_submit_to_start_p50_s": pct(cli_loop, 50),
        "bare_ray_job_submit_to_start_p95_s": pct(cli_loop, 95),
        "bare_client_loop_to_start_p50_s": pct(client_loop, 50),
        "bare_client_loop_to_start_p95_s": pct(client_loop, 95),
        "watcher_save_to_start_p50_s": pct(waits, 50),
        "watcher_save_to_start_p95_s": pct(waits, 95),
        "watcher_save_to_submit_p50_s": pct(own, 50),
        "watcher_save_to_submit_p95_s": pct(own, 95),
        "watcher_submit_to_start_p50_s": pct(watch["scheduler"], 50),
        "watcher_minus_client_loop_p50_s": pct(waits, 50) - pct(client_loop, 50),
        "watcher_minus_ray_job_submit_p50_s": pct(waits, 50) - pct(cli_loop, 50),
        # the goal: within 1 s of what Ray takes in the same rhythm (the client loop)
        "within_1s": pct(waits, 50) - pct(client_loop, 50) <= 1.0,
        "calls_per_poll_1_job": polls[0]["calls_per_poll"],
        "calls_per_poll_50_jobs": polls[1]["calls_per_poll"],
        "list_jobs_50_in_flight_s": polls[1]["one_list_jobs_s"],
        "polls": polls,
        "ray_job_submit_waits_s": cli_loop,
        "client_loop_waits_s": client_loop,
        "watcher_waits_s": waits,
        "watcher_save_to_submit_s": own,
    }
    emit("bench_ray", result, args.json)


if __name__ == "__main__":
    main()
