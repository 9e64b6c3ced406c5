"""Callback pacing's cost (issue 36): the same 2-rank demo run through
``trainer.launch.run_training`` with an in-process ``on_log`` callback of ours (not paced:
it may lag), with InstructLab's ``TrainerCallback`` hooking ``on_log`` (paced: rank 0 waits
before each all-reduce until the callback handled the previous step), and with none, in
interleaved repeats. Steps/s from the journal (first ``step_begin`` to the last
``step_end``) and the ratios to the run without callbacks.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import bench_parser, emit
from journal import read_all


def case_callbacks(case: str) -> list[Any]:
    if case == "none":
        return []
    if case == "ours":
        from watcher import TrainerCallback

        class Ours(TrainerCallback):
            def on_log(self, event: Any, **data: Any) -> None:
                pass

        return [Ours()]
    from instructlab.training.callbacks import TrainerCallback as Theirs

    class Paced(Theirs):
        def on_log(self, context: Any) -> None:
            pass

    return [Paced()]


def steps_per_s(journal: Path) -> float:
    recs = read_all(journal).records
    begins = [r["ts"] for r in recs if r["event"] == "step_begin"]
    ends = [r for r in recs if r["event"] == "step_end"]
    return (len(ends) - 1) / (ends[-1]["ts"] - begins[1]) if len(ends) > 1 else float("nan")


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    try:
        import instructlab.training.callbacks  # noqa: F401
    except ImportError:
        print("bench_callback_pacing: skipped: instructlab-training is not installed")
        return
    from trainer.config import TorchrunArgs, TrainingArgs
    from trainer.launch import run_training

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    steps, repeats = (30, 1) if args.quick else (args.steps, args.repeats)
    cases = ("none", "ours", "instructlab")
    rates: dict[str, list[float]] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            for case in cases:  # interleaved: the machine's load falls on every case
                train_args = TrainingArgs(
                    ckpt_dir=Path(tmp) / f"{case}-{rep}",
                    demo=True,
                    max_steps=steps,
                    save_final=False,
                    save_at_epoch_end=False,
                    callbacks=case_callbacks(case),
                )
                result = run_training(train_args, TorchrunArgs(nproc_per_node=2), echo=False)
                rates[case].append(steps_per_s(result.journal_path))
    base = statistics.median(rates["none"])
    out: dict[str, Any] = {"steps": steps, "repeats": repeats}
    for case in cases:
        med = statistics.median(rates[case])
        out[f"{case}_steps_per_s"] = med
        out[f"{case}_vs_none"] = med / base
    out["runs"] = rates
    emit("bench_callback_pacing", out, args.json)


if __name__ == "__main__":
    main()
