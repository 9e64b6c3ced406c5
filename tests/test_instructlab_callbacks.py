"""InstructLab's own TrainerCallback objects run unchanged in run_training's embedded watcher
(docs/instructlab.md, "Callbacks"): same objects, their TrainingContext, our Control."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from journal import Control
from tests.helpers import records
from tests.test_instructlab import processed_data, tiny_llama
from trainer.instructlab import run_training

ilab = pytest.importorskip("instructlab.training", reason="instructlab-training is not installed")
from instructlab.training.callbacks import TrainerCallback, TrainingContext  # noqa: E402

pytestmark = pytest.mark.dist


def ilab_args(tmp_path: Path, **over: Any) -> tuple[Any, Any]:
    """InstructLab's own TorchrunArgs/TrainingArgs for 2 CPU ranks on a tiny Llama: 96
    processed rows, 10 held out, 16 a step (6 steps), saves every 32 samples, evaluation
    every 2 steps."""
    tiny_llama(tmp_path / "model")
    processed_data(tmp_path / "processed")
    fields: dict[str, Any] = {
        "model_path": str(tmp_path / "model"),
        "data_path": str(tmp_path / "processed" / "data.jsonl"),
        "data_output_dir": str(tmp_path / "processed"),
        "ckpt_output_dir": str(tmp_path / "run"),
        "max_seq_len": 64,
        "max_batch_len": 1024,
        "num_epochs": 1,
        "effective_batch_size": 16,
        "learning_rate": 1e-3,
        "save_samples": 32,
        "checkpoint_at_epoch": False,
        "validation_split": 0.1,
        "validation_frequency": 2,
        **over,
    }
    return ilab.TorchrunArgs(nproc_per_node=2, nnodes=1, node_rank=0, rdzv_id=1), ilab.TrainingArgs(
        **fields
    )


def test_a_local_callback_object_runs_unchanged_and_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    seen: list[tuple[str, TrainingContext]] = []  # the closure's list
    pid = os.getpid()
    stop_at = 3

    class Counting(TrainerCallback):  # local: InstructLab itself could not serialize it
        def __init__(self) -> None:
            self.counts: dict[str, int] = {}
            self.pids: set[int] = set()

        def _see(self, hook: str, ctx: TrainingContext) -> None:
            self.counts[hook] = self.counts.get(hook, 0) + 1
            self.pids.add(os.getpid())
            seen.append((hook, ctx))

        def on_train_begin(self, context: TrainingContext) -> None:
            self._see("on_train_begin", context)

        def on_log(self, context: TrainingContext) -> Any:
            self._see("on_log", context)
            if context.step == stop_at:
                return Control.stop("enough")
            return None

        def on_evaluate(self, context: TrainingContext) -> None:
            self._see("on_evaluate", context)

        def on_save(self, context: TrainingContext) -> None:
            self._see("on_save", context)

        def on_train_end(self, context: TrainingContext) -> None:
            self._see("on_train_end", context)

    class Broken(TrainerCallback):
        def on_log(self, context: TrainingContext) -> None:
            raise RuntimeError("callback bug")

    cb = Counting()
    torch_args, train_args = ilab_args(tmp_path, callbacks=[cb, Broken()])
    result = run_training(torch_args, train_args, echo=False)

    assert result.status == "stopped"
    recs = records(tmp_path / "run")
    by_event = {e: [r for r in recs if r["event"] == e] for e in ("log", "evaluate", "save")}
    assert cb.counts == {
        "on_train_begin": 1,
        "on_log": len(by_event["log"]),
        "on_evaluate": len(by_event["evaluate"]),
        "on_save": len(by_event["save"]),
        "on_train_end": 1,
    }
    assert cb.pids == {pid}  # once, in this process
    # every rank stopped at the step after the one whose on_log returned the stop
    end = next(r for r in recs if r["event"] == "train_end")
    assert end["step"] in (stop_at, stop_at + 1)
    control = next(r for r in recs if r["event"] == "control")
    assert control["data"]["command"] == "stop" and control["step"] in (stop_at, stop_at + 1)

    logs = [c for h, c in seen if h == "on_log"]
    assert [(c.step, c.loss) for c in logs] == [
        (r["step"], r["data"]["loss"]) for r in by_event["log"]
    ]
    assert [c.val_metrics["val_loss"] for h, c in seen if h == "on_evaluate"] == [
        r["data"]["val_loss"] for r in by_event["evaluate"]
    ]
    saves = [c for h, c in seen if h == "on_save"]
    assert saves and all(c.checkpoint_path and Path(c.checkpoint_path).is_dir() for c in saves)
    assert [c.step for c in saves] == [r["step"] for r in by_event["save"]]
    first = seen[0][1]
    assert (first.hook_name, first.world_size, first.max_epochs) == ("on_train_begin", 2, 1)
    assert first.is_world_process_zero and first.output_dir == str(tmp_path / "run")
    assert logs[-1].total_samples == by_event["log"][-1]["data"]["samples_seen"]
    assert logs[0].batch_metrics["total_samples"] == 16
    # the broken callback's exceptions were isolated: logged, counted, training went on
    broken = next(c for c in result.callbacks if c["callback"].endswith("Broken.on_log"))
    assert broken["failed"] == len(by_event["log"]) and "callback bug" in broken["errors"][0]
