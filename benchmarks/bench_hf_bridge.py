"""Cost of the HF Trainer bridge (``JournalCallback``): the same HF ``Trainer`` run (the
bench_hf_peer model and data, 2 CPU ranks) with and without it, alternated, plus the time
inside the callback measured directly (journal appends, control checks, the per-step
all_reduce that makes every rank apply a command at the same step)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_hf_peer import make_inputs, run_hf
from benchmarks.common import bench_parser, emit


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    steps, rounds = (20, 1) if args.quick else (60, 2)
    out: dict[str, Any] = {"steps": steps, "rounds": rounds}
    plain, journaled, direct = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-hf-bridge-") as tmp:
        for i in range(rounds):
            d = Path(tmp) / f"round{i}"
            d.mkdir()
            model, data = make_inputs(d, steps)
            plain.append(run_hf(d, model, data, steps)["runtime_s"])
            r = run_hf(d, model, data, steps, journal=True)
            journaled.append(r["runtime_s"])
            lines = (r["out"] / "journal.jsonl").read_text().splitlines()
            direct.append(json.loads(lines[-1])["data"]["journal"])
    out["hf_runtime_s"] = min(plain)
    out["hf_with_journal_runtime_s"] = min(journaled)
    out["with_vs_without_runtime"] = min(journaled) / min(plain)
    cost = direct[-1]
    out["callback_overhead_fraction"] = cost["overhead_fraction"]
    out["append_us_per_step"] = cost["append_ns_per_step"] / 1e3
    out["control_check_us_per_step"] = cost["control_ns_per_step"] / 1e3
    out["agree_all_reduce_us_per_step"] = cost["agree_ns_per_step"] / 1e3
    out["step_ms"] = cost["train_wall_s"] / steps * 1e3
    emit("bench_hf_bridge", out, args.json)


if __name__ == "__main__":
    main()
