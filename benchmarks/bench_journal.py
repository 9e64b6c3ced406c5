"""Journal write and read speed.

append: a realistic ``log`` record through the public ``JournalWriter.append`` beside the
physical floor (``orjson.dumps`` + ``os.write`` of the same dict on an O_APPEND fd), in
interleaved blocks of the same run. Scan: a full parse of a large journal through the reader
(``iter_batches``: with a checker process on a spare core, where there is one; ``taskset -c
0`` measures it without) beside plain ``json.loads`` and ``orjson.loads`` loops over the
same file (rounds interleaved; the ratios' median and range). Query: wall time of the real
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def bench_scan(path: Path, repeats: int) -> dict[str, Any]:
    """The reader's full scan beside a ``json.loads`` and an ``orjson.loads`` loop over the
    same file, interleaved (the order flips every round: this machine is shared, so a
    ratio is taken within one round); the ratios' median and range over the rounds."""

    def ours() -> int:
        return sum(len(b.records) for b in iter_batches(path))

    def loop(loads: Callable[[bytes], Any]) -> int:
        n = 0
        with open(path, "rb") as f:
            for line in f:
                loads(line)
                n += 1
        return n

    cases: dict[str, Callable[[], int]] = {
        "ours": ours,
        "json": lambda: loop(json.loads),
        "orjson": lambda: loop(orjson.loads),
    }
    walls: dict[str, list[float]] = {k: [] for k in cases}
    counts: dict[str, int] = {}
    for r in range(repeats):
        for name in cases if r % 2 == 0 else reversed(cases):
            t0 = time.perf_counter()
            counts[name] = cases[name]()
            walls[name].append(time.perf_counter() - t0)
    vs_json = [j / o for j, o in zip(walls["json"], walls["ours"], strict=True)]
    vs_orjson = [j / o for j, o in zip(walls["orjson"], walls["ours"], strict=True)]
    count = counts["ours"]
    return {
        "scan_records": count,
        "scan_rounds": repeats,
        "scan_events_per_s": count / statistics.median(walls["ours"]),
        "stdlib_scan_events_per_s": counts["json"] / statistics.median(walls["json"]),
        "orjson_scan_events_per_s": counts["orjson"] / statistics.median(walls["orjson"]),
        # the goal (issue "One truth of a run", point 10): >= 2x a json.loads loop
        "scan_vs_stdlib": statistics.median(vs_json),
        "scan_vs_stdlib_range": [min(vs_json), max(vs_json)],
        "scan_vs_orjson": statistics.median(vs_orjson),
        "scan_vs_orjson_range": [min(vs_orjson), max(vs_orjson)],
    }


def bench_query(path: Path, repeats: int) -> dict[str, Any]:
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
    ap.add_argument("--scan-only", action="store_true", help="only the full scan and its loops")
    ap.add_argument("--rounds", type=int, default=None, help="scan rounds (default 5, quick 1)")
    args = ap.parse_args()
    n_append = 0 if args.scan_only else 50_000 if args.quick else 300_000
    with tempfile.TemporaryDirectory(prefix="bench-journal-") as d:
        tmp = Path(d)
        result: dict[str, object] = {"appends": n_append}
        if n_append:
            result.update(bench_append(tmp, n_append))
        big = tmp / "big" / "journal.jsonl"
        result["scan_file_mb"] = make_big_journal(big, args.records) and big.stat().st_size / 1e6
        scan = bench_scan(big, args.rounds or (1 if args.quick else 5))
        result.update(scan)
        if not args.scan_only:
            result.update(bench_query(big, 3 if args.quick else 5))
    emit("bench_journal", result, args.json)
    if not args.json:
        lo, hi = scan["scan_vs_stdlib_range"]
        print(
            f"full scan: {scan['scan_vs_stdlib']:.2f}x a json.loads loop (median of "
            f"{scan['scan_rounds']} rounds, range {lo:.2f}-{hi:.2f}; goal >= 2x), "
            f"{scan['scan_vs_orjson']:.2f}x an orjson.loads loop"
        )


if __name__ == "__main__":
    main()
