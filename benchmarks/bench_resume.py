"""What a resume costs rank 0 in the journal: time and peak memory of opening the journal
for a resumed attempt (the last record, control ids handled before, the best checkpoint),
on a small and a large journal, beside the old way (parse every record into memory) in the
same run. Goal: memory independent of the journal's size."""

from __future__ import annotations

import gc
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import bench_parser, emit, write_step_journal
from journal import read_all
from trainer.journaling.run_journal import RunJournal


def measure(fn: Any) -> tuple[float, float]:
    """(seconds, peak MB allocated by Python) of a call: timed untraced, then traced."""
    gc.collect()
    t = time.perf_counter()
    fn()
    dt = time.perf_counter() - t
    gc.collect()
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return dt, peak / 1e6


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    sizes = {"small": 200, "large": 24_000 if args.quick else 120_000}  # steps (x5+ records)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as d:
        for name, steps in sizes.items():
            ckpt = Path(d) / name
            write_step_journal(ckpt, steps)

            def ours(ckpt: Path = ckpt) -> None:
                journal = RunJournal(ckpt, main=True, role="trainer", keep_best="val_loss:min")
                journal.open(resume=True)  # as after finding a checkpoint to resume from
                journal.close()

            def old(ckpt: Path = ckpt) -> None:
                read_all(ckpt / "journal.jsonl")

            records = len(read_all(ckpt / "journal.jsonl").records)
            t_ours, m_ours = measure(ours)
            t_old, m_old = measure(old)
            result.update(
                {
                    f"{name}_records": records,
                    f"{name}_resume_s": t_ours,
                    f"{name}_resume_peak_mb": m_ours,
                    f"{name}_parse_all_s": t_old,
                    f"{name}_parse_all_peak_mb": m_old,
                }
            )
    result["resume_peak_large_vs_small"] = result["large_resume_peak_mb"] / max(
        result["small_resume_peak_mb"], 1e-9
    )
    emit("bench_resume", result, args.json)


if __name__ == "__main__":
    main()
