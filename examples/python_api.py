#!/usr/bin/env python3
"""The flat Python API: callbacks run in this process, nothing is serialized into workers.

python examples/python_api.py --ckpt-dir runs/api --max-steps 200
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from journal import Control
from trainer.config import TorchrunArgs, TrainingArgs
from trainer.launch import run_training
from watcher import EarlyStopping, TrainerCallback


class CheckpointLog(TrainerCallback):
    """A class-based callback with constructor arguments and state."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.seen: list[str] = []

    def on_save(self, event: Any, checkpoint_path: str, **data: Any) -> None:
        self.seen.append(checkpoint_path)
        print(f"{self.prefix} step {event.step}: {checkpoint_path}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ckpt-dir", type=Path, default=Path("runs/api"))
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--target-val-loss", type=float, default=0.2)
    args = ap.parse_args()
    target = args.target_val_loss

    def on_evaluate(event: Any, val_loss: float, **data: Any) -> Control | None:
        # A closure over `target`: this could never be shipped into a torchrun worker.
        if val_loss < target:
            return Control.stop(f"val_loss {val_loss:.3f} < {target} at step {event.step}")
        return None

    log = CheckpointLog("[checkpoint]")
    result = run_training(
        TrainingArgs(
            ckpt_dir=args.ckpt_dir,
            demo=True,
            max_steps=args.max_steps,
            num_epochs=10,
            eval_every=max(1, args.max_steps // 10),
            save_every=max(1, args.max_steps // 5),
            on_evaluate=on_evaluate,
            callbacks=[log, EarlyStopping(patience=3)],
        ),
        TorchrunArgs(nproc_per_node=2),
        echo=False,
    )
    print(f"status: {result.status} ({result.reason}); final checkpoint: {result.final_checkpoint}")
    for cb in result.callbacks:
        print(f"  {cb['callback']} on {cb['event']}: {cb['ok']} ok, {cb['failed']} failed")
    print(f"checkpoints seen by the callback object: {len(log.seen)}")


if __name__ == "__main__":
    main()
