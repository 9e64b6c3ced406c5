"""Control channel: how fast a command takes effect, and what checking costs per step.

A real 2-rank demo run; ``log`` commands are written at random moments, then ``stop``. For
each: the step at which it applied minus the step in progress when the file appeared, and the
time from writing the file to the trainer's control record. The per-step cost of checking is
measured inside the trainer (train_end.data.journal): on steps where nothing new arrived (the
check itself), and separately on the steps that read and archived command files; beside a
warm microbenchmark of the idle check.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import bench_parser, emit, pct
from journal import read_all, send_command
from journal.rundir.paths import control_dir, journal_path
from tests.helpers import wait_for
from trainer.steering.control_poller import ControlPoller


def _records(ckpt: Path) -> list[dict[str, Any]]:
    p = journal_path(ckpt)
    return read_all(p, final=False).records if p.exists() else []


def real_run(tmp: Path, n_commands: int) -> dict[str, Any]:
    ckpt = tmp / "run"
    exe = Path(sys.executable).parent / "ilab-train"
    job = subprocess.Popen(
        [
            str(exe),
            "--demo",
            "--ckpt-dir",
            str(ckpt),
            "--nproc-per-node",
            "2",
            "--max-steps",
            "100000",
            "--num-epochs",
            "1000",
            "--log-every",
            "1000",
            "--quiet",
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    steps: list[int] = []
    ms: list[float] = []
    try:
        wait_for(lambda: any(r["event"] == "step_end" and r["step"] >= 3 for r in _records(ckpt)))
        for i in range(n_commands + 1):
            time.sleep(random.uniform(0.2, 1.0))  # a random moment within some step
            t = time.time()
            cid = send_command(ckpt, "stop" if i == n_commands else "log", source="bench")
            rec = wait_for(
                lambda cid=cid: next(
                    (
                        r
                        for r in _records(ckpt)
                        if r["event"] == "control" and r["data"].get("id") == cid
                    ),
                    None,
                )
            )
            begun = max(
                r["step"] for r in _records(ckpt) if r["event"] == "step_begin" and r["ts"] <= t
            )
            steps.append(rec["data"]["applied_at_step"] - begun)
            ms.append((rec["ts"] - t) * 1e3)
        job.wait(timeout=120)
    finally:
        job.kill()
    recs = _records(ckpt)
    j = recs[-1]["data"]["journal"]
    step_times = [r["data"]["elapsed_time"] for r in recs if r["event"] == "log"]
    return {
        "commands": len(steps),
        "apply_steps_max": max(steps),
        "apply_steps_mean": statistics.fmean(steps),
        "apply_ms_p50": pct(ms, 50),
        "apply_ms_p99": pct(ms, 99),
        "step_time_ms_median": statistics.median(step_times) * 1e3 if step_times else None,
        "steps": recs[-1]["step"],
        "check_us_idle_step_in_run": j["control_idle_ns_per_step"] / 1e3,
        "steps_handling_files": j["control_busy_steps"],
        "handling_us_per_busy_step": j["control_busy_ns_per_step"] / 1e3,
        "check_us_per_step_all_in_run": j["control_ns_per_step"] / 1e3,
        "stopped": recs[-1]["data"]["status"] == "stopped",
    }


def warm_poll(tmp: Path, n: int) -> float:
    d = tmp / "warm"
    control_dir(d).mkdir(parents=True, mode=0o750)
    poller = ControlPoller(d, set())
    poller.poll()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        poller.poll()
    return (time.perf_counter_ns() - t0) / n / 1e3


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-control-") as d:
        tmp = Path(d)
        result: dict[str, Any] = real_run(tmp, 8 if args.quick else 25)
        result["poll_us_warm_microbench"] = warm_poll(tmp, 20_000 if args.quick else 200_000)
    emit("bench_control", result, args.json)


if __name__ == "__main__":
    main()
