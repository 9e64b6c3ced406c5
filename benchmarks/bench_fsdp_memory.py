"""Host memory of the FSDP path on 2 CPU ranks, each setting a whole ``ilab-train`` run.

1. Model init: per-rank peak RSS once the model is sharded and loaded, ``--model-init meta``
   (build on the meta device, rank 0 reads and broadcasts into the shards) against ``full``
   (every rank builds the whole model first). The model's share is the peak minus that of
   the same run with a tiny model (imports, data, process group).
2. Gradient accumulation: per-rank peak RSS and step time of the same global batch in 1 and
   in 4 micro-batches, with gradients reduce-scattered every micro-batch (default) or only
   after the last (unsharded grads held meanwhile).
3. Activation checkpointing: peak RSS and step time with and without, on 512-token samples
   (where activations, not weights, dominate).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import bench_parser, emit

BIN = Path(sys.executable).parent
READY = re.compile(r"model ready \((\w+) init\): peak host RSS (\d+) MB")
# glibc keeps freed large blocks in its heap once its mmap threshold has grown, so peak RSS
# would show allocator history rather than live tensors. A fixed threshold maps every block
# of 64 KiB or more on its own and returns it on free: peak RSS then follows live memory.
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536"}
END = re.compile(r"steps in ([\d.]+)s of step time; peak host RSS (\d+) MB")


def run(workdir: Path, name: str, cfg: dict[str, Any], steps: int) -> dict[str, float]:
    """One 2-rank run; rank 1's peak RSS at model-ready and at the end, and step time."""
    ckpt = workdir / name
    conf = workdir / f"{name}.json"
    conf.write_text(json.dumps({"save_final": False, "save_at_epoch_end": False, **cfg}))
    data = [] if "data_path" in cfg else ["--demo"]
    argv = [str(BIN / "ilab-train"), "--config", str(conf), *data, "--ckpt-dir", str(ckpt)]
    argv += ["--nproc-per-node", "2", "--max-steps", str(steps), "--quiet"]
    proc = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **MALLOC}
    )
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    log = (ckpt / "logs" / "rank-1.log").read_text()
    ready, end = READY.search(log), END.search(log)
    assert ready and end, log[-2000:]
    return {
        "ready_mb": float(ready.group(2)),
        "peak_mb": float(end.group(2)),
        "step_s": float(end.group(1)) / steps,
    }


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    big = {"d_model": 512, "n_layers": 8} if args.quick else {"d_model": 768, "n_layers": 16}
    big_params = 12 * big["d_model"] ** 2 * big["n_layers"]
    out: dict[str, Any] = {"model_params_m": big_params / 1e6, "model_fp32_mb": big_params * 4e-6}
    with tempfile.TemporaryDirectory(prefix="bench-fsdp-") as d:
        wd = Path(d)
        tiny = run(wd, "tiny", {"model": {"d_model": 32, "n_layers": 1}}, 1)
        for init in ("meta", "full"):
            r = run(wd, f"init-{init}", {"model": big, "model_init": init}, 1)
            out[f"init_{init}_rank1_ready_mb"] = r["ready_mb"]
            out[f"init_{init}_rank1_model_mb"] = r["ready_mb"] - tiny["ready_mb"]
        out["init_meta_vs_full_model_mb"] = (
            out["init_meta_rank1_model_mb"] / out["init_full_rank1_model_mb"]
        )
        # 64 demo samples (~9 tokens each) per step: 32 per rank in one micro-batch, or 4
        steps = 2 if args.quick else 3
        for micro, max_len in ((1, 2048), (4, 80)):
            for mode in ("every_micro_batch", "last_micro_batch"):
                if micro == 1 and mode == "last_micro_batch":
                    continue  # the same thing with one micro-batch
                cfg = {"model": big, "max_batch_len": max_len, "reduce_grads": mode}
                r = run(wd, f"accum-{micro}-{mode}", cfg, steps)
                key = f"micro{micro}_{mode}"
                out[f"{key}_rank1_peak_mb"] = r["peak_mb"]
                out[f"{key}_step_s"] = r["step_s"]
        # activation checkpointing: 8 samples of 512 tokens a step, 4 per rank
        long_rows = wd / "long.jsonl"
        rng = random.Random(0)
        long_rows.write_text(
            "".join(
                json.dumps({"input_ids": [rng.randrange(256) for _ in range(512)]}) + "\n"
                for _ in range(64)
            )
        )
        for ac in (False, True):
            cfg = {
                "model": {**big, "max_seq_len": 512},
                "data_path": str(long_rows),
                "effective_batch_size": 8,
                "max_batch_len": 4096,
                "activation_checkpointing": ac,
            }
            r = run(wd, f"ac-{ac}", cfg, 2)
            out[f"ac_{'on' if ac else 'off'}_rank1_peak_mb"] = r["peak_mb"]
            out[f"ac_{'on' if ac else 'off'}_step_s"] = r["step_s"]
    out["ac_on_vs_off_peak"] = out["ac_on_rank1_peak_mb"] / out["ac_off_rank1_peak_mb"]
    out["ac_on_vs_off_step_time"] = out["ac_on_step_s"] / out["ac_off_step_s"]
    base = out["micro1_every_micro_batch_rank1_peak_mb"]
    out["micro4_every_vs_micro1_peak"] = out["micro4_every_micro_batch_rank1_peak_mb"] / base
    out["micro4_last_vs_micro1_peak"] = out["micro4_last_micro_batch_rank1_peak_mb"] / base
    out["micro4_last_vs_every_step_time"] = (
        out["micro4_last_micro_batch_step_s"] / out["micro4_every_micro_batch_step_s"]
    )
    emit("bench_fsdp_memory", out, args.json)


if __name__ == "__main__":
    main()
