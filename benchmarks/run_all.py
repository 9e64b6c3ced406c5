"""Run every benchmark (``make bench``): a table per benchmark, JSON in benchmarks/results/.

Usage: python benchmarks/run_all.py [--quick] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = [
    "bench_journal",
    "bench_startup",  # issue 52: ilab-journal status beside import click, orjson
    "bench_overhead",
    "bench_latency",
    "bench_control",
    "bench_leases",
    "bench_resume",
    "bench_readers",
    "bench_fsdp_memory",
    "bench_checkpoint",
    "bench_hf_peer",
    "bench_hf_bridge",
    "bench_mirror",  # issue 38: loopback S3 (SeaweedFS); needs the dev extra (s3fs, weed)
    "bench_replay",  # issue 35; each watcher case stops at --case-timeout (300 s)
    "bench_slurm",  # issue 37; one line and skipped where Slurm is not installed
    "bench_ray",  # issue 47; one line and skipped where Ray is not installed or cannot start
    "bench_callback_pacing",  # issue 36; skipped without instructlab-training
    "bench_backtest",  # issue 46: backtest sweeps beside a json.loads pass, check --wait
    "bench_serve",  # issue 45: ilab-journal serve in chromium; one line, skipped without it
    "bench_guard",  # issue 53: a STOPped rank to alert, abort and resumed step; false alarms
    "bench_gpu",  # one line and skipped without a CUDA GPU
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    summary = {}
    failed = []
    for name in args.only or BENCHES:
        script = HERE / f"{name}.py"
        if not script.exists():
            print(f"-- {name}: not present, skipped")
            continue
        cmd = [sys.executable, str(script)] + (["--quick"] if args.quick else [])
        print(f"-- running {' '.join(cmd[1:])}", flush=True)
        proc = subprocess.run(cmd)
        if proc.returncode != 0:
            failed.append(name)
            continue
        summary[name] = json.loads((HERE / "results" / f"{name}.json").read_text())
    (HERE / "results" / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
