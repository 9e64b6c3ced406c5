"""What a checkpoint costs training: the time every rank is blocked by a save, synchronous
(``--no-async-save``) and asynchronous (``--async-save``: staged to host memory, written in
the background), the total time of each save, and training throughput with a save every K
steps over throughput without saving. Real ``ilab-train`` runs: 2 gloo ranks on CPU with a
~100M-parameter built-in model (a CUDA GPU when one is present, at the same size). Figures
come from the journal's ``save`` records (``blocked_s``, ``background_s``, ``duration``)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import bench_parser, emit, pct
from journal import read_all

BIN = Path(sys.executable).parent
# ~100M parameters: 12 layers x 12 * 768^2 (attention + 4x MLP) = 85M, + embeddings
MODEL = ("--d-model", "768", "--n-layers", "12", "--n-heads", "12")


def run(ckpt: Path, steps: int, *extra: str) -> dict[str, Any]:
    """One training run; its wall time and its save records."""
    argv = [str(BIN / "ilab-train"), "--demo", "--ckpt-dir", str(ckpt), "--quiet"]
    argv += ["--max-steps", str(steps), "--no-save-hf", "--no-save-at-epoch-end"]
    argv += ["--no-save-final", "--eval-every", "100000", *MODEL, *extra]
    if not _cuda():
        argv += ["--nproc-per-node", "2"]
    t = time.perf_counter()
    proc = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"bench_checkpoint: ilab-train failed: {proc.stderr[-2000:]}")
    recs = read_all(ckpt / "journal.jsonl").records
    steps_s = [r for r in recs if r["event"] == "step_end"]
    t0 = next(r["ts"] for r in recs if r["event"] == "train_begin")
    t1 = recs[-1]["ts"]
    return {
        "wall_s": wall,
        "train_s": t1 - t0,
        "steps": len(steps_s),
        "saves": [r["data"] for r in recs if r["event"] == "save"],
    }


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--every", type=int, default=None, help="steps between saves (K)")
    args = ap.parse_args()
    steps = 8 if args.quick else 20
    every = args.every or (4 if args.quick else 5)
    result: dict[str, Any] = {
        "device": "cuda" if _cuda() else "cpu (2 gloo ranks)",
        "steps": steps,
        "save_every": every,
    }
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as d:
        base = run(Path(d) / "none", steps, "--no-async-save")
        sync = run(Path(d) / "sync", steps, "--save-every", str(every), "--no-async-save")
        asy = run(Path(d) / "async", steps, "--save-every", str(every), "--async-save")
        # with the consolidated export at every save: gathered while every rank waits
        # (sync), or made by rank 0's export thread from the written shards (async)
        hf = ("--save-every", str(every), "--save-hf")
        sync_hf = run(Path(d) / "sync-hf", steps, *hf, "--no-async-save")
        async_hf = run(Path(d) / "async-hf", steps, *hf, "--async-save")
    sync_blocked = [s["blocked_s"] for s in sync["saves"]]
    async_blocked = [s["blocked_s"] for s in asy["saves"]]
    result.update(
        {
            "sync_blocked_s_p50": pct(sync_blocked, 50),
            "async_blocked_s_p50": pct(async_blocked, 50),
            "async_background_s_p50": pct([s["background_s"] for s in asy["saves"]], 50),
            "async_total_s_p50": pct([s["duration"] for s in asy["saves"]], 50),
            "async_waited_s_max": max((s.get("waited_s") or 0.0) for s in asy["saves"]),
            "blocked_ratio_async_over_sync": pct(async_blocked, 50)
            / max(pct(sync_blocked, 50), 1e-9),
            "with_export_sync_blocked_s_p50": pct([s["blocked_s"] for s in sync_hf["saves"]], 50),
            "with_export_async_blocked_s_p50": pct([s["blocked_s"] for s in async_hf["saves"]], 50),
            "throughput_ratio_sync_vs_no_save": base["train_s"] / sync["train_s"],
            "throughput_ratio_async_vs_no_save": base["train_s"] / asy["train_s"],
            "train_s_no_save": base["train_s"],
            "train_s_sync": sync["train_s"],
            "train_s_async": asy["train_s"],
            "throughput_ratio_sync_export_vs_no_save": base["train_s"] / sync_hf["train_s"],
            "throughput_ratio_async_export_vs_no_save": base["train_s"] / async_hf["train_s"],
            "saves": {
                "sync": sync["saves"],
                "async": asy["saves"],
                "sync_export": sync_hf["saves"],
                "async_export": async_hf["saves"],
            },
        }
    )
    emit("bench_checkpoint", result, args.json)


if __name__ == "__main__":
    main()
