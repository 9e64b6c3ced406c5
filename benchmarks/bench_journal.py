"""Journal write and read speed.

append: a realistic ``log`` record through the public ``JournalWriter.append`` beside the
physical floor (``orjson.dumps`` + ``os.write`` of the same dict on an O_APPEND fd), in
interleaved blocks of the same run. Scan: a full parse of a large journal through the reader
beside a plain ``json.loads`` loop over the same file. Query: wall time of the real
``ilab-journal query --event save --last`` subprocess on that file.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import bench_parser, emit, pct
from journal import JournalWriter
from journal.read.reader import iter_batches
from tests.helpers import log_payload


def bench_append(tmp: Path, n: int, block: int = 1000) -> dict[str, float]:
    writer = JournalWriter(tmp / "append" / "journal.jsonl")
    raw_fd = os.open(tmp / "raw.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    payload = log_payload(1)
    clock = time.perf_counter_ns
    ours: list[float] = []
    raw: list[float] = []
    seq = 0
    for b in range(n // block):
        for i in range(block):
            step = b * block + i
            t0 = clock()
            writer.append("log", payload, step=step, epoch=0, samples_seen=step * 8)
            ours.append(clock() - t0)
        for i in range(block):
            step = b * block + i
            t0 = clock()
            os.write(
                raw_fd,
                orjson.dumps(
                    {
                        "v": 1,
                        "seq": seq,
                        "run_id": "0123456789ab",
                        "attempt": 1,
                        "ts": time.time(),
                        "event": "log",
                        "step": step,
                        "epoch": 0,
                        "samples_seen": step * 8,
                        "data": payload,
                    },
                    option=orjson.OPT_APPEND_NEWLINE,
                ),
            )
            raw.append(clock() - t0)
            seq += 1
    writer.close()
    os.close(raw_fd)
    rec_bytes = os.path.getsize(tmp / "raw.jsonl") / len(raw)
    return {
        "append_p50_us": pct(ours, 50) / 1e3,
        "append_p99_us": pct(ours, 99) / 1e3,
        "raw_write_p50_us": pct(raw, 50) / 1e3,
        "raw_write_p99_us": pct(raw, 99) / 1e3,
        "append_vs_raw_p50": pct(ours, 50) / pct(raw, 50),
        "record_bytes": rec_bytes,
    }


def make_big_journal(path: Path, n_records: int) -> int:
    """A realistic mix: per step step_begin, optimizer events, log, step_end; saves sometimes."""
    payload = log_payload(1)
    n = 0
    step = 0
    with JournalWriter(path, durable_events=frozenset()) as w:  # no fsync: setup speed only
        while n < n_records:
            step += 1
            for ev in ("step_begin", "before_optimizer_step", "after_optimizer_step"):
                w.append(ev, step=step)
            w.append("log", payload, step=step)
            w.append("step_end", step=step)
            n += 5
            if step % 1000 == 0:
                w.append(
                    "save",
                    {
                        "checkpoint_path": f"/ckpt/checkpoints/step-{step:07d}",
                        "kind": ["full_state", "hf"],
                        "duration": 3.0,
                    },
                    step=step,
                )
                n += 1
    return n


def bench_scan(path: Path, repeats: int) -> dict[str, float]:
    ours, stdlib = [], []
    count = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        count = sum(len(b.records) for b in iter_batches(path))
        ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        n = 0
        with open(path, "rb") as f:
            for line in f:
                json.loads(line)
                n += 1
        stdlib.append(time.perf_counter() - t0)
    best_ours, best_std = min(ours), min(stdlib)
    return {
        "scan_records": count,
        "scan_events_per_s": count / best_ours,
        "stdlib_scan_events_per_s": n / best_std,
        "scan_vs_stdlib": (count / best_ours) / (n / best_std),
    }


def bench_query(path: Path, repeats: int) -> dict[str, float]:
    exe = Path(sys.executable).parent / "ilab-journal"
    times = []
    out = ""
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [
                str(exe),
                "query",
                str(path),
                "--event",
                "save",
                "--last",
                "--field",
                "checkpoint_path",
            ],
            capture_output=True,
            text=True,
        )
        times.append(time.perf_counter() - t0)
        out = proc.stdout.strip()
        assert proc.returncode == 0, proc.stderr
    return {"query_save_s": statistics.median(times), "query_result": out}


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--records", type=int, default=1_000_000, help="records in the scan file")
    args = ap.parse_args()
    n_append = 50_000 if args.quick else 300_000
    with tempfile.TemporaryDirectory(prefix="bench-journal-") as d:
        tmp = Path(d)
        result: dict[str, object] = {"appends": n_append}
        result.update(bench_append(tmp, n_append))
        big = tmp / "big" / "journal.jsonl"
        result["scan_file_mb"] = make_big_journal(big, args.records) and big.stat().st_size / 1e6
        result.update(bench_scan(big, 1 if args.quick else 3))
        result.update(bench_query(big, 3 if args.quick else 5))
    emit("bench_journal", result, args.json)


if __name__ == "__main__":
    main()
