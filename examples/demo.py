#!/usr/bin/env python3
"""The project's main job (``make demo``): train, react, steer, summarize.

1. ``ilab-watch`` starts beside training: on the newest checkpoint it runs
   ``examples/eval_accuracy.py`` (held-out exact-match accuracy, asks for ``stop`` at the
   target accuracy), plus built-in early stopping on val_loss and divergence detection.
   ``--queue save=latest``: when an eval ends, the next one takes the newest checkpoint and
   skips older ones.
2. ``ilab-train --demo`` trains the built-in model on generated arithmetic with FSDP on
   2 CPU ranks (gloo), journaling every lifecycle event. ``--max-leased-checkpoints 1``:
   before each save, training waits while the eval still holds the previous checkpoint's
   lease, so a ``stop`` from the eval of one checkpoint is applied at the next save,
   however slow the machine.
3. A summary: accuracy per checkpoint, why training ended, where everything is.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--run-dir", type=Path, default=None, help="default: runs/demo-<time>")
    ap.add_argument("--max-steps", type=int, default=400)
    ap.add_argument("--save-every", type=int, default=40)
    ap.add_argument("--target-accuracy", type=float, default=0.8)
    ap.add_argument("--nproc-per-node", type=int, default=2)
    args = ap.parse_args()
    run = (args.run_dir or ROOT / "runs" / time.strftime("demo-%Y%m%d-%H%M%S")).resolve()
    run.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    eval_cmd = f"{ROOT / 'examples' / 'eval_accuracy.py'} --target-accuracy {args.target_accuracy}"
    t0 = time.monotonic()
    print(f"== ilab-journal demo: run dir {run}\n", flush=True)
    watcher = subprocess.Popen(
        [
            str(BIN / "ilab-watch"),
            str(run),
            "--on-save",
            eval_cmd,
            # the newest pending save only: a queue of every save lagged training on a
            # loaded machine until the stop arrived after the run had ended
            "--queue",
            "save=latest",
            "--early-stopping",
            "metric=val_loss,patience=5,min_delta=0.001",
            "--divergence",
            "threshold=1.0,patience=3,warmup=20",
        ],
        env=env,
        cwd=ROOT,
    )
    train = subprocess.run(
        [
            str(BIN / "ilab-train"),
            "--demo",
            "--ckpt-dir",
            str(run),
            "--nproc-per-node",
            str(args.nproc_per_node),
            "--max-steps",
            str(args.max_steps),
            "--demo-samples",
            "30000",
            "--save-every",
            str(args.save_every),
            "--eval-every",
            "20",
            "--log-every",
            "20",
            "--keep-last-n",
            "2",
            "--keep-best",
            "accuracy:max",
            # at most one save ahead of the eval: its stop never arrives after the end
            "--max-leased-checkpoints",
            "1",
        ],
        env=env,
        cwd=ROOT,
    )
    try:
        watcher_code = watcher.wait(timeout=300)
    except subprocess.TimeoutExpired:
        watcher.terminate()
        watcher_code = watcher.wait()
    summarize(run, time.monotonic() - t0, train.returncode, watcher_code)
    return 0 if train.returncode == 0 and watcher_code == 0 else 1


def summarize(run: Path, wall: float, train_code: int, watcher_code: int) -> None:
    """Everything below comes from the journal: evaluate and report records per checkpoint,
    rotation, the best checkpoint, and how training ended."""
    from journal.read.reader import read_all
    from journal.rundir.paths import journal_path, logs_dir, watch_dir
    from journal.views.best import MetricGoal
    from journal.views.query import find_best

    path = journal_path(run)
    recs = read_all(path).records
    end = next((r for r in reversed(recs) if r["event"] == "train_end"), None)
    controls = [r["data"] for r in recs if r["event"] == "control" and r["data"].get("accepted")]
    val_loss = {r["step"]: r["data"]["val_loss"] for r in recs if r["event"] == "evaluate"}
    accuracy = {
        r["data"]["step"]: r["data"]["metrics"]["accuracy"]
        for r in recs
        if r["event"] == "report" and "accuracy" in r["data"]["metrics"]
    }
    saves = {r["step"]: r["data"]["checkpoint_path"] for r in recs if r["event"] == "save"}
    removed = {r["data"]["checkpoint_path"] for r in recs if r["event"] == "checkpoint_removed"}
    best = find_best(path, MetricGoal.parse("accuracy:max"))
    print("\n== summary (from the journal)")
    print(f"{'step':>6}  {'val_loss':>8}  {'accuracy':>8}  checkpoint")
    for step, ckpt in sorted(saves.items()):
        vl, acc = val_loss.get(step), accuracy.get(step)
        state = "removed by rotation" if ckpt in removed else "on disk"
        if best and ckpt == best.checkpoint_path:
            state += ", best"
        print(
            f"{step:>6}  {'-' if vl is None else f'{vl:.4f}':>8}  "
            f"{'-' if acc is None else f'{acc:.3f}':>8}  {Path(ckpt).name} ({state})"
        )
    if best:
        print(f"\nbest checkpoint by accuracy: {best.checkpoint_path} ({best.value:.3f})")
    if end:
        d = end["data"]
        print(f"training ended: {d['status']} at step {end['step']}: {d.get('reason')}")
        for c in controls:
            print(
                f"  control '{c['command']}' from {c.get('source')} applied at step "
                f"{c['applied_at_step']}" + (f": {c['reason']}" if c.get("reason") else "")
            )
        print(f"final checkpoint: {d.get('final_checkpoint')}")
    print(f"journal: {path} ({len(recs)} records)")
    print(f"logs: {logs_dir(run)}   watcher results: {watch_dir(run)}")
    print(f"exit codes: ilab-train {train_code}, ilab-watch {watcher_code}; wall time {wall:.0f}s")
    print(f"\nnext: ilab-journal status {run}  |  ilab-journal query {run} --best accuracy:max")
    print(f"see it: ilab-journal serve {run}   (then open the address it prints; docs/serve.md)")


if __name__ == "__main__":
    sys.exit(main())
