"""Readers on a small and a large journal, each command a whole process: wall time, peak
RSS, and the large/small ratio in the same run. A reader that costs O(what it prints)
keeps the ratio near 1; one that reads the whole file grows with it."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

from benchmarks.common import bench_parser, emit, write_step_journal

BIN = Path(sys.executable).parent
COMMANDS = {
    "status": ["status", "--json"],
    "show_last_5": ["show", "--last", "5", "--json"],
    "show_since_step": ["show", "--since-step", "{near_end}", "--json"],
    "tail_n_5": ["tail", "-n", "5", "--json"],
    "query_last_save": ["query", "--event", "save"],
    "stats": ["stats", "--json"],
    "validate": ["validate", "--json"],
}
# Runs the command and prints its peak RSS (KiB): resource sees only this child.
_PEAK = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL);"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def run(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one whole process."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _PEAK, *args], capture_output=True, text=True)
    wall = time.perf_counter() - t
    return wall, int(out.stdout.strip() or 0) / 1024


def best_of(args: list[str], repeats: int) -> tuple[float, float]:
    runs = [run(args) for _ in range(repeats)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    # ~5 records a step: 1k and 1M records (200k with --quick), and 5M for the full scans
    small_steps, big_steps = 200, 40_000 if args.quick else 200_000
    repeats = 2 if args.quick else 3
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-readers-") as d:
        small, big = Path(d) / "small", Path(d) / "big"
        steps = {small: small_steps, big: big_steps}
        write_step_journal(small, small_steps)
        write_step_journal(big, big_steps)
        for name, ckpt in (("small", small), ("big", big)):
            result[f"{name}_records"] = (ckpt / "journal.jsonl").read_bytes().count(b"\n")
        t = time.perf_counter()
        for _ in range(repeats):
            subprocess.run([sys.executable, "-c", "import journal"], check=True)
        result["import_journal_s"] = (time.perf_counter() - t) / repeats

        def argv(cmd: list[str], ckpt: Path) -> list[str]:
            near_end = str(steps[ckpt] - 5)  # the last 5 steps: the same output for both
            rest = [a.replace("{near_end}", near_end) for a in cmd[1:]]
            return [str(BIN / "ilab-journal"), cmd[0], str(ckpt), *rest]

        for name, cmd in COMMANDS.items():
            ws, ms = best_of(argv(cmd, small), repeats)
            wb, mb = best_of(argv(cmd, big), repeats)
            result[f"{name}_small_s"] = ws
            result[f"{name}_big_s"] = wb
            result[f"{name}_wall_ratio"] = wb / ws
            result[f"{name}_small_mb"] = ms
            result[f"{name}_big_mb"] = mb
            result[f"{name}_rss_ratio"] = mb / ms
        # full scans: records per second of the whole process, against a plain
        # json.loads loop over the same file in this process (the floor to beat, 2x)
        t = time.perf_counter()
        with open(big / "journal.jsonl", "rb") as f:
            for line in f:
                json.loads(line)
        loads_rate = result["big_records"] / (time.perf_counter() - t)
        result["json_loads_loop_records_per_s"] = loads_rate
        for name in ("stats", "validate"):
            rate = result["big_records"] / result[f"{name}_big_s"]
            result[f"{name}_records_per_s"] = rate
            result[f"{name}_vs_json_loads"] = rate / loads_rate
        if not args.quick:
            huge = Path(d) / "huge"  # 5M records: full scans stream in bounded memory
            write_step_journal(huge, 1_000_000)
            big.joinpath("journal.jsonl").unlink()
            result.update(_full_scans(huge))
    emit("bench_readers", result, args.json)


def _full_scans(ckpt: Path) -> dict[str, Any]:
    """stats and validate on the 5M-record journal, against a json.loads loop (same run)."""
    out: dict[str, Any] = {}
    n = (ckpt / "journal.jsonl").read_bytes().count(b"\n")
    out["huge_records"] = n
    t = time.perf_counter()
    with open(ckpt / "journal.jsonl", "rb") as f:
        for line in f:
            json.loads(line)
    loads_rate = n / (time.perf_counter() - t)
    out["huge_json_loads_records_per_s"] = loads_rate
    for name in ("stats", "validate"):
        wall, mb = run([str(BIN / "ilab-journal"), name, str(ckpt), "--json"])
        out[f"{name}_huge_s"] = wall
        out[f"{name}_huge_mb"] = mb  # the largest single process
        out[f"{name}_huge_vs_json_loads"] = n / wall / loads_rate
    # both scan parts of a large journal in parallel: the memory of all their processes
    out["full_scan_jobs"] = _jobs(ckpt)
    for name in ("stats", "validate"):
        out[f"{name}_huge_all_processes_mb"] = _peak_of_tree(
            [str(BIN / "ilab-journal"), name, str(ckpt), "--json"]
        )
    return out


def _jobs(ckpt: Path) -> int:
    from journal.read.parallel import default_jobs

    return default_jobs((ckpt / "journal.jsonl").stat().st_size)


def _peak_of_tree(argv: list[str]) -> float:
    """Peak of the memory (MB) of a command and its child processes together, sampled every
    20 ms (for commands that run for seconds): the sum of their proportional set sizes, so
    pages forked children share with their parent count once."""
    import psutil

    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    root, peak = psutil.Process(proc.pid), 0.0
    while proc.poll() is None:
        total = 0
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += p.memory_full_info().pss
        peak = max(peak, total / 2**20)
        time.sleep(0.02)
    return peak


if __name__ == "__main__":
    main()
