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

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import bench_parser, emit, pct
from journal import JournalWriter
from tests.helpers import BIN, begin_payload, make_checkpoint, pythonpath, wait_for
from tests.ray_cluster import RayCluster, RayUnavailable, running_ray
from watcher.scheduler import JobSpec
from watcher.scheduler.board import JobBoard
from watcher.scheduler.ray_jobs import RayScheduler

JOB = '#!/bin/sh\ndate +%s.%N > "{out}/start-${{ILAB_SEQ:-$1}}"\n'


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


def watched(cluster: RayCluster, root: Path, n: int) -> dict[str, Any]:
    """Saves appended one at a time, each eval a job of ``ilab-watch --via ray``."""
    ckpt = root / "run"
    ckpt.mkdir()
    out = root / "watched"
    out.mkdir()
    script = root / "eval.sh"
    script.write_text(JOB.format(out=out))
    script.chmod(0o755)
    w = JournalWriter(ckpt, run_id="bench")
    w.append("train_begin", begin_payload(n, world_size=1, hostname="bench"))
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "PYTHONPATH": pythonpath()}
    watcher = subprocess.Popen(
        [
            str(BIN / "ilab-watch"),
            str(ckpt),
            *("--on-save", str(script), "--name", "bench", "--quiet"),
            *("--via", "ray", "--job-poll", "0.2"),
        ],
        env=env,
    )
    waits: list[float] = []
    saved: dict[int, float] = {}
    results = ckpt / "watch" / "bench.results.jsonl"
    try:
        for i in range(1, n + 1):
            path = make_checkpoint(ckpt, i, "bench")
            ts = time.time()
            seq = w.append(
                "save", {"checkpoint_path": str(path), "kind": ["full_state"]}, step=i, ts=ts
            )
            start = wait_for(lambda s=seq: _read(out / f"start-{s}"), 120, "job start")
            waits.append(start - ts)
            saved[int(seq or 0)] = ts
            wait_for(lambda i=i: _lines(results) >= i, 120, "the delivery's result")
        w.append("train_end", {"status": "completed", "reason": None, "final_checkpoint": None})
        w.close()
        watcher.wait(timeout=120)
    finally:
        watcher.kill()
    # the watcher's own part: save record -> submit_job answered (the job's PENDING state)
    submitted = {
        r["seq"]: r["jobs"][0]["states"][0]["at"]
        for r in map(json.loads, results.read_text().splitlines())
    }
    own = [submitted[seq] - ts for seq, ts in saved.items()]
    ray = [w - o for w, o in zip(waits, own, strict=True)]
    return {"waits": waits, "own": own, "ray": ray}


def _read(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


def _lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except OSError:
        return 0


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
            watch = watched(cluster, root, n)
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
        "watcher_submit_to_start_p50_s": pct(watch["ray"], 50),
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
