"""The mirror (``ilab-watch --mirror``) against a loopback S3 server (SeaweedFS), side by
side in one run:

- throughput: one checkpoint's files sent by the mirror (listing, upload, check, marker)
  against a raw s3fs ``put`` of the same files (goal: >= 0.9x);
- lag from each ``save`` record to its ``.upload_complete`` marker in the store, polled;
- the median step time of 2-rank runs with a mirroring watcher beside them against runs
  without (goal: <= 1.05x; two runs each, in the order without, with, with, without), and
  (without --quick) over a 20 s outage of the store against the rest of that run (goal:
  < 1.10x).

The S3 server runs on this machine at ``nice 10`` (it stands in for storage elsewhere); the
bench polls the store for markers every 0.25 s in every case, with or without a mirror.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import bench_parser, emit
from journal.remote.layout import marked_checkpoints
from journal.remote.store import Store
from tests.helpers import BIN, records, train_argv, train_env
from tests.s3_server import s3_server
from watcher.mirror.checkpoints import upload_checkpoint


def fake_checkpoint(root: Path, shard_mb: int, shards: int) -> Path:
    """A checkpoint's shape: a few large DCP shards and some small files."""
    ckpt = root / "checkpoints" / "step-000001"
    (ckpt / "full_state").mkdir(parents=True)
    (ckpt / "hf").mkdir()
    for i in range(shards):
        (ckpt / "full_state" / f"__{i}_0.distcp").write_bytes(os.urandom(shard_mb << 20))
    for name in ("trainer_state.json", ".metadata", "scheduler.json"):
        (ckpt / "full_state" / name).write_bytes(os.urandom(2048))
    (ckpt / "hf" / "config.json").write_bytes(b"{}")
    return ckpt


def throughput(bucket: str, ckpt: Path, rounds: int) -> dict[str, Any]:
    files = [p for p in ckpt.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    raw_s, mirror_s = [], []
    Store(f"{bucket}/warm").put_bytes("x", b"x")  # connections made before any timing
    for r in range(rounds):  # alternating which goes first: load drift hits both alike
        for kind in ("raw", "mirror") if r % 2 == 0 else ("mirror", "raw"):
            store = Store(f"{bucket}/{kind}{r}")
            t = time.perf_counter()
            if kind == "raw":
                keys = [store.path(p.relative_to(ckpt).as_posix()) for p in files]
                store.fs.put([str(p) for p in files], keys)
                raw_s.append(time.perf_counter() - t)
            else:
                upload_checkpoint(store, ckpt, "checkpoints/step-000001")
                mirror_s.append(time.perf_counter() - t)
    raw, mirror = statistics.median(raw_s), statistics.median(mirror_s)
    return {
        "checkpoint_mb": round(total / 2**20, 1),
        "raw_put_mb_per_s": round(total / 2**20 / raw, 1),
        "mirror_mb_per_s": round(total / 2**20 / mirror, 1),
        "mirror_vs_raw_throughput": round(raw / mirror, 3),
    }


def step_times(ckpt: Path) -> list[tuple[float, float]]:
    """(step_end time, step duration) of every step."""
    begins: dict[int, float] = {}
    out = []
    for r in records(ckpt):
        if r["event"] == "step_begin":
            begins[r["step"]] = r["ts"]
        elif r["event"] == "step_end" and r["step"] - 1 in begins:
            out.append((r["ts"], r["ts"] - begins[r["step"] - 1]))
    return out


#: How often the bench looks for markers (the lag's resolution).
POLL_S = 0.25
#: Steps between saves (--save-every): a 14 MB demo checkpoint every ~4 s at 0.2 s a step.
SAVE_EVERY = 20


def run(
    ckpt: Path, steps: int, save_every: int, bucket: str, uri: str | None, outage: Any = None
) -> dict[str, Any]:
    """A 2-rank demo run, with a mirroring watcher when ``uri`` is given; lags polled."""
    argv = train_argv(
        ckpt, "--max-steps", str(steps), "--save-every", str(save_every), "--keep-last-n", "2"
    )
    job = subprocess.Popen(argv, env=train_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    watcher = None
    seen: dict[str, float] = {}
    # The same polling of the store in every case (with or without a mirror): only the
    # mirroring watcher differs between them.
    store = Store(uri or f"{bucket}/none")
    window: list[float] = []
    if uri is not None:
        watcher = subprocess.Popen(
            [str(BIN / "ilab-watch"), str(ckpt), "--mirror", uri, "-q"], env=train_env()
        )
        if outage is not None:
            threading.Thread(target=outage, args=(store, window), daemon=True).start()
    while job.poll() is None or (watcher is not None and watcher.poll() is None):
        try:
            for name in marked_checkpoints(store.listing("checkpoints/")):
                seen.setdefault(name.rsplit("/", 1)[-1], time.time())
        except Exception:
            pass  # the store is down (the outage case)
        time.sleep(POLL_S)
    _, err = job.communicate()
    if job.returncode != 0:
        raise SystemExit(f"training failed: {err.decode()[-2000:]}")
    out: dict[str, Any] = {"step_s": [d for _, d in step_times(ckpt)]}
    if uri is not None:
        saves = {
            Path(r["data"]["checkpoint_path"]).name: r["ts"]
            for r in records(ckpt)
            if r["event"] == "save"
        }
        out["lag_s"] = [seen[n] - ts for n, ts in saves.items() if n in seen]
        out["window"] = window
        out["timed"] = step_times(ckpt)
    return out


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--save-every", type=int, default=SAVE_EVERY, help="steps between saves")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-mirror-"))
    # nice: the server stands in for storage elsewhere; here it shares training's cores
    with s3_server(root / "s3", nice=10) as s3:
        os.environ.update(s3.env())
        bucket = s3.fresh_uri()
        ckpt = fake_checkpoint(root / "fake", 16 if args.quick else 64, 4)
        result: dict[str, Any] = throughput(bucket, ckpt, 2 if args.quick else 3)
        steps = 40 if args.quick else 100
        # without, with, with, without (ABBA): the machine's drift over the four runs (it
        # moved step times by 15 % between two runs here) weighs on both sides alike
        plain_s: list[float] = []
        mirrored_s: list[float] = []
        lags: list[float] = []
        for i, mirrored in enumerate((False, True, True, False)):
            uri = f"{bucket}/run{i}" if mirrored else None
            out = run(root / f"run{i}", steps, args.save_every, bucket, uri)
            (mirrored_s if mirrored else plain_s).extend(out["step_s"])
            lags.extend(out.get("lag_s", []))
        without, with_mirror = statistics.median(plain_s), statistics.median(mirrored_s)
        result.update(
            {
                "steps": steps,
                "save_every": args.save_every,
                "runs_each": 2,
                "step_s_median_without": round(without, 4),
                "step_s_median_with_mirror": round(with_mirror, 4),
                "step_time_ratio": round(with_mirror / without, 3),
                "save_to_marker_lag_s_median": round(statistics.median(lags), 3),
                "save_to_marker_lag_s_max": round(max(lags), 3),
            }
        )
        if not args.quick:

            def outage(store: Store, window: list[float]) -> None:
                while not marked_checkpoints(store.listing("checkpoints/")):
                    time.sleep(0.1)
                window.append(time.time())
                s3.stop()
                time.sleep(20)  # the outage itself: what this case measures across
                window.append(time.time())
                s3.start()

            down = run(root / "outage", 150, args.save_every, bucket, f"{bucket}/outage", outage)
            lo, hi = down["window"]
            during = [d for ts, d in down["timed"] if lo <= ts <= hi]
            rest = [d for ts, d in down["timed"] if not lo - 1 <= ts <= hi + 1]
            result.update(
                {
                    "outage_steps": len(during),
                    "outage_step_s_median": round(statistics.median(during), 4),
                    "outage_rest_step_s_median": round(statistics.median(rest), 4),
                    "outage_step_time_ratio": round(
                        statistics.median(during) / statistics.median(rest), 3
                    ),
                }
            )
    emit("bench_mirror", result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
