"""What bench_slurm.py and bench_ray.py share: N saves appended one at a time to a live
journal, each delivered as a scheduler job by ``ilab-watch --via ...``, and the time from
each save record to its job's start (split into the watcher's own part, save -> submit
answered, and the scheduler's)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from journal import JournalWriter
from tests.helpers import BIN, begin_payload, make_checkpoint, pythonpath, wait_for

#: The eval every job runs: it writes the moment it started, named by the delivery's seq.
JOB = '#!/bin/sh\ndate +%s.%N > "{out}/start-${{ILAB_SEQ:-$1}}"\n'


def watched(root: Path, n: int, env: Mapping[str, str], via: Sequence[str]) -> dict[str, Any]:
    """Saves appended one at a time, each eval a job of ``ilab-watch`` with ``via`` (its
    ``--via`` options) and ``env`` (where the scheduler is) added to the environment.
    ``waits``: save record -> job start; ``own``: the watcher's part; ``scheduler``: the rest."""
    ckpt = root / "run"
    ckpt.mkdir()
    out = root / "watched"
    out.mkdir()
    script = root / "eval.sh"
    script.write_text(JOB.format(out=out))
    script.chmod(0o755)
    w = JournalWriter(ckpt, run_id="bench")
    w.append("train_begin", begin_payload(n, world_size=1, hostname="bench"))
    watcher = subprocess.Popen(
        [
            str(BIN / "ilab-watch"),
            str(ckpt),
            *("--on-save", str(script), "--name", "bench", "--quiet"),
            *via,
        ],
        env={**os.environ, **env, "PYTHONPATH": pythonpath()},
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
    # the watcher's own part: save record -> submitted (the job's PENDING state)
    submitted = {
        r["seq"]: r["jobs"][0]["states"][0]["at"]
        for r in map(json.loads, results.read_text().splitlines())
    }
    own = [submitted[seq] - ts for seq, ts in saved.items()]
    scheduler = [w - o for w, o in zip(waits, own, strict=True)]
    return {"waits": waits, "own": own, "scheduler": scheduler}


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
