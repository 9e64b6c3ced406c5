#!/usr/bin/env python3
"""Evaluate a demo checkpoint: exact-match accuracy on held-out arithmetic problems.

Run by ``ilab-watch --on-save examples/eval_accuracy.py`` on every checkpoint. It reads the
checkpoint from ``ILAB_CHECKPOINT_PATH`` (or ``--checkpoint``), loads the consolidated model
without torchrun, greedy-decodes each held-out problem, prints the accuracy and reports it:
to the watcher through ``$ILAB_REPORT`` when run by one, else straight to the journal with
``journal.submit_report``. The journal then holds ``accuracy`` per checkpoint, for
``--keep-best accuracy:max``, ``ilab-journal query --best``, plots and early stopping. With
``--target-accuracy`` it asks training to stop once the target is reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from journal import CommandRefused, Control, Report, send_command, submit_report
from trainer.model.builtin import greedy_generate, load_consolidated


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--checkpoint",
        default=os.environ.get("ILAB_CHECKPOINT_PATH"),
        help="checkpoint dir (default: $ILAB_CHECKPOINT_PATH)",
    )
    ap.add_argument(
        "--ckpt-dir",
        default=os.environ.get("ILAB_CKPT_DIR"),
        help="run dir with demo_data/heldout.jsonl (default: $ILAB_CKPT_DIR)",
    )
    ap.add_argument("--limit", type=int, default=200, help="problems to evaluate")
    ap.add_argument(
        "--target-accuracy",
        type=float,
        default=None,
        help="request 'stop' once accuracy reaches this (0..1)",
    )
    args = ap.parse_args()
    if not args.checkpoint:
        ap.error("no checkpoint: pass --checkpoint or run me from ilab-watch --on-save")
    ckpt = Path(args.checkpoint)
    run_dir = Path(args.ckpt_dir) if args.ckpt_dir else ckpt.parent.parent
    heldout = run_dir / "demo_data" / "heldout.jsonl"
    if not heldout.is_file():
        print(f"eval: no held-out problems at {heldout}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model, _ = load_consolidated(ckpt)
    problems = [json.loads(line) for line in heldout.read_text().splitlines()][: args.limit]
    correct = sum(
        greedy_generate(model, p["prompt"], max_new_tokens=4) == p["answer"] for p in problems
    )
    acc = correct / len(problems)
    step = int(os.environ.get("ILAB_STEP", "0") or 0)
    print(
        f"eval: step {step} {ckpt.name}: accuracy {acc:.3f} ({correct}/{len(problems)}) "
        f"in {time.perf_counter() - t0:.1f}s"
    )
    metrics = {"accuracy": acc, "eval_problems": len(problems)}
    reached = args.target_accuracy is not None and acc >= args.target_accuracy
    reason = f"eval accuracy {acc:.3f} >= target {args.target_accuracy}"
    if reached:  # first: the trainer reads the stop at its next step boundary
        # "eval:": status's stop_source says an eval stopped the run, not an operator
        try:
            send_command(run_dir, Control.stop(reason), source="eval:eval_accuracy.py")
            reason += ": asked training to stop"
        except CommandRefused as exc:  # too late: the run has ended (journaled as rejected)
            reason += f": {exc}"
    if os.environ.get("ILAB_REPORT") and not reached:  # run by ilab-watch: it journals it
        Path(os.environ["ILAB_REPORT"]).write_text(json.dumps(metrics))
    else:  # straight to the journal; with a stop, at once: journaled by the step that
        # applies it at the latest (before train_end), where a gate and a backtest see it
        submit_report(run_dir, Report(metrics, checkpoint_path=ckpt, step=step), source="eval")
    if reached:
        print(f"eval: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
