"""What a checkpoint costs training: the time every rank is blocked by a save, synchronous
(``--no-async-save``) and asynchronous (``--async-save``: staged to host memory, written in
the background), the total time of each save, and training throughput with a save every K
steps over throughput without saving. Real ``ilab-train`` runs; figures come from the
journal's ``save`` records (``blocked_s``, ``background_s``, ``waited_s``, ``duration``) and
its ``step_end`` times.

Models (``--model``)
  demo-100m        the built-in model at ~100M parameters, 2 gloo ranks on CPU (the default
                   without CUDA); 20 steps, a save every 5
  tinyllama-1.1b   the TinyLlama-1.1B architecture of benchmarks/bench_gpu.py (random init
                   saved in bf16; fp32 master weights and AdamW state: ~17.6 GB a save), one
                   GPU, 8 x 2048 tokens a step (the default with CUDA); 160 steps, a save
                   every 50, so a save's background write overlaps the next interval
  tiny-llama       the same path with a tiny Llama on 2 CPU ranks: proves the harness

Runs (``--runs``, comma-separated; split them across calls where one call has a time limit):
``none`` (no saves), ``sync``, ``async``, ``sync-hf`` and ``async-hf`` (with the
consolidated export at every save). Throughput is measured two ways: ``train_s`` (train_begin
to the last record: includes start-up and the last write) and ``steady_s`` (from the
``step_end`` of the first steps, a warm-up and compilation, to the last ``step_end``), each
as the no-save run's time over the run's; ``later`` is the steady time from the step after
the first save (which allocates and pins the host buffers that later saves reuse).
"""

from __future__ import annotations

import os
import random
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
DEMO_MODEL = ("--d-model", "768", "--n-layers", "12", "--n-heads", "12")
RUNS = {
    "none": (),
    "sync": ("--no-async-save",),
    "async": ("--async-save",),
    # with the consolidated export at every save: gathered while every rank waits (sync),
    # or made by rank 0's export thread from the written shards (async)
    "sync-hf": ("--no-async-save", "--save-hf"),
    "async-hf": ("--async-save", "--save-hf"),
}
MODELS = ("demo-100m", "tinyllama-1.1b", "tiny-llama")


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def prepare_llama(d: Path, model: str, steps: int, cuda: bool) -> tuple[str, ...]:
    """The HF model dir and fixed-length data of bench_gpu; the ilab-train flags for them."""
    from benchmarks import bench_gpu as g

    config = g.TINYLLAMA if model == "tinyllama-1.1b" else g.TINY
    model_dir = d / "model"
    spec = {"cuda": cuda, "model_config": config, "model_dir": str(model_dir)}
    g.run_child("prepare", spec, d / "prepare", timeout=900)
    data = d / "fixed.jsonl"
    rows = (steps + 2) * g.FIXED_BATCH
    g.write_rows(data, [g.SEQ if cuda else 128] * rows, config["vocab_size"], random.Random(0))
    flags = ("--model-path", str(model_dir), "--data", str(data), "--lr", str(g.LR))
    flags += ("--batch-size", str(g.FIXED_BATCH), "--max-batch-len", str(g.MAX_BATCH_LEN))
    return flags


def run(
    ckpt: Path, steps: int, warm: int, later: int, base: tuple[str, ...], *extra: str, gpu: bool
) -> dict[str, Any]:
    """One training run: its wall time, train and steady-state times, and its saves."""
    argv = [str(BIN / "ilab-train"), "--ckpt-dir", str(ckpt), "--quiet", *base]
    argv += ["--max-steps", str(steps), "--no-save-hf", "--no-save-at-epoch-end"]
    argv += ["--no-save-final", "--eval-every", "100000", "--keep-last-n", "2", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks, also on a GPU machine
    t = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"bench_checkpoint: ilab-train failed: {proc.stderr[-2000:]}")
    recs = read_all(ckpt / "journal.jsonl").records
    ends = {r["step"]: r["ts"] for r in recs if r["event"] == "step_end"}
    t0 = next(r["ts"] for r in recs if r["event"] == "train_begin")
    return {
        "wall_s": wall,
        "train_s": recs[-1]["ts"] - t0,
        "steady_s": ends[max(ends)] - ends[warm],
        # after the first save (which allocates and pins the host buffers later saves reuse)
        "later_s": ends[max(ends)] - ends[later] if later in ends else float("nan"),
        "steps": len(ends),
        "saves": [r["data"] for r in recs if r["event"] == "save"],
    }


def summarise(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Blocked and background time per save (p50, max), and throughput against ``none``."""
    out: dict[str, Any] = {}
    for name, r in runs.items():
        key = name.replace("-", "_")
        out[f"train_s_{key}"] = r["train_s"]
        out[f"steady_s_{key}"] = r["steady_s"]
        out[f"later_s_{key}"] = r["later_s"]
        if name == "none":
            continue
        blocked = [s["blocked_s"] for s in r["saves"]]
        out[f"{key}_saves"] = len(blocked)
        out[f"{key}_blocked_s_p50"] = pct(blocked, 50)
        out[f"{key}_blocked_s_max"] = max(blocked, default=float("nan"))
        if name.startswith("async"):
            out[f"{key}_background_s_p50"] = pct([s["background_s"] for s in r["saves"]], 50)
            out[f"{key}_waited_s_max"] = max((s.get("waited_s") or 0.0) for s in r["saves"])
        if "none" in runs:
            out[f"throughput_ratio_{key}_vs_no_save"] = runs["none"]["train_s"] / r["train_s"]
            out[f"steady_throughput_ratio_{key}_vs_no_save"] = (
                runs["none"]["steady_s"] / r["steady_s"]
            )
            out[f"later_throughput_ratio_{key}_vs_no_save"] = runs["none"]["later_s"] / r["later_s"]
    for hf in ("", "_hf"):
        if f"sync{hf}_blocked_s_p50" in out and f"async{hf}_blocked_s_p50" in out:
            out[f"blocked_ratio_async{hf}_over_sync{hf}"] = out[f"async{hf}_blocked_s_p50"] / max(
                out[f"sync{hf}_blocked_s_p50"], 1e-9
            )
    out["saves"] = {name: r["saves"] for name, r in runs.items() if name != "none"}
    return out


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument(
        "--model", choices=MODELS, help="default: tinyllama-1.1b with CUDA, else demo-100m"
    )
    ap.add_argument("--runs", default=",".join(RUNS), help="which runs (default: all five)")
    ap.add_argument("--steps", type=int, help="steps a run (default: per model)")
    ap.add_argument("--every", type=int, default=None, help="steps between saves (K)")
    args = ap.parse_args()
    cuda = _cuda()
    model = args.model or ("tinyllama-1.1b" if cuda else "demo-100m")
    if model == "tinyllama-1.1b" and not cuda:
        raise SystemExit("bench_checkpoint: --model tinyllama-1.1b needs a CUDA GPU")
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    if unknown := [n for n in names if n not in RUNS]:
        raise SystemExit(f"bench_checkpoint: unknown run(s) {unknown}; choose from {list(RUNS)}")
    big = model == "tinyllama-1.1b"
    steps = args.steps or ((60 if args.quick else 160) if big else (8 if args.quick else 20))
    every = args.every or ((25 if args.quick else 50) if big else (4 if args.quick else 5))
    warm = min(10, steps // 4)
    result: dict[str, Any] = {
        "device": "cuda" if cuda and big else "cpu (2 gloo ranks)",
        "model": model,
        "steps": steps,
        "save_every": every,
        "steady_from_step": warm,
        "later_from_step": every + 1,
    }
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as d:
        if model == "demo-100m":
            base: tuple[str, ...] = ("--demo", *DEMO_MODEL)
        else:
            base = prepare_llama(Path(d), model, steps, cuda and big)
        if not (cuda and big):
            base += ("--nproc-per-node", "2", "--backend", "gloo", "--mixed-precision", "fp32")
        else:
            base += ("--nproc-per-node", "1")
        runs = {}
        for name in names:
            saving = () if name == "none" else ("--save-every", str(every))
            extra = (*saving, *RUNS[name])
            runs[name] = run(Path(d) / name, steps, warm, every + 1, base, *extra, gpu=cuda and big)
    result.update(summarise(runs))
    emit("bench_checkpoint", result, args.json)


if __name__ == "__main__":
    main()
