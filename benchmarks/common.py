"""Shared helpers for the benchmarks: percentiles, machine notes, result output."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from journal import JournalWriter

RESULTS = Path(__file__).resolve().parent / "results"


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an unsorted list."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))
    return s[k]


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
    }


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every bench takes (``run_all.py`` passes them): ``--quick`` for a
    shorter run, ``--json`` to print one JSON object. Add a bench's own options to it."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument(
        "--quick", action="store_true", help="a shorter run (make bench BENCH_ARGS=--quick)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


def emit(name: str, result: dict[str, Any], as_json: bool) -> None:
    """Print the result (one JSON object with --json, else a table) and save it."""
    result = {"bench": name, **result, "machine": machine()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    if as_json:
        print(json.dumps(result))
        return
    print(f"== {name}")
    for k, v in result.items():
        if k in ("bench", "machine"):
            continue
        if isinstance(v, float):
            v = f"{v:,.3f}"
        elif isinstance(v, (list, dict)):
            v = f"({len(v)} entries: see {RESULTS.name}/{name}.json)"
        print(f"  {k:<34} {v}")
    sys.stdout.flush()


def write_step_journal(
    ckpt: Path, steps: int, log: Callable[[int, int], dict[str, Any]] | None = None
) -> None:
    """A step-detail run: 5 records a step, a save and a control every 100 steps; every
    record valid against the schema (``validate`` finds nothing). ``log(step, steps)``
    makes each ``log`` payload (default: ``tests.helpers.log_payload``)."""
    # imported here: the other benches (bench_gpu on a bare GPU machine) need no test deps
    from tests.helpers import begin_payload, log_payload

    begin = begin_payload(steps, world_size=2, hostname="bench")
    with JournalWriter(ckpt, run_id="bench") as w:
        w.append("train_begin", begin)
        for s in range(1, steps + 1):
            w.append("step_begin", step=s)
            w.append("before_optimizer_step", step=s)
            w.append("after_optimizer_step", step=s)
            w.append("log", log(s, steps) if log else log_payload(s), step=s)
            if s % 100 == 0:
                path = f"/c/step-{s:06d}"
                save = {"checkpoint_path": path, "kind": ["full_state", "hf"], "duration": 1.5}
                w.append("save", {**save, "hf_path": f"{path}/hf", "trigger": "interval"}, step=s)
                w.append("control", {"command": "log", "id": f"c{s}", "accepted": True}, step=s)
            w.append("step_end", step=s)
