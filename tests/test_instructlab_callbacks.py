"""InstructLab's own TrainerCallback objects run unchanged in run_training's embedded watcher
(docs/instructlab.md, "Callbacks"): same objects, their TrainingContext, our Control."""

from __future__ import annotations

import os
import time
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
            if context.step < stop_at:
                time.sleep(0.5)  # a slow consumer: training must not run ahead of it
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


@pytest.mark.extended
def test_per_micro_batch_hooks_record_micro_batches_and_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    calls: list[tuple[str, int]] = []

    class PerMicroBatch(TrainerCallback):
        def on_before_forward(self, context: TrainingContext) -> None:
            calls.append(("on_before_forward", context.step))

        def on_after_backward(self, context: TrainingContext) -> None:
            calls.append(("on_after_backward", context.step))

        def on_pre_optimizer_step(self, context: TrainingContext) -> None:
            calls.append(("on_pre_optimizer_step", context.step))

    torch_args, train_args = ilab_args(
        tmp_path, callbacks=[PerMicroBatch()], max_batch_len=64, save_samples=0
    )
    assert run_training(torch_args, train_args, echo=False).status == "completed"
    recs = records(tmp_path / "run")
    begin = next(r for r in recs if r["event"] == "train_begin")["data"]
    assert begin["journal_detail"] == "microbatch"
    assert begin["config"]["callbacks_named"]["microbatch_hooks"] == [
        f"{PerMicroBatch.__module__}.{PerMicroBatch.__qualname__}.{h}"
        for h in ("on_before_forward", "on_after_backward")
    ]
    wanted = {
        "before_forward": "on_before_forward",
        "after_backward": "on_after_backward",
        "before_optimizer_step": "on_pre_optimizer_step",
    }
    expect = [(wanted[r["event"]], r["step"]) for r in recs if r["event"] in wanted]
    assert calls == expect
    assert len([c for c in calls if c[0] == "on_before_forward"]) > len(
        [c for c in calls if c[0] == "on_pre_optimizer_step"]
    )  # several micro-batches a step


@pytest.mark.extended
def test_instructlab_tracker_fields_feed_a_real_mlflow_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers import free_port
    from tests.test_mlflow_export import mlflow_server, mlflow_tracking, only_run, series

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "mlflow").mkdir()
    with mlflow_server(tmp_path / "mlflow", free_port()) as uri:
        torch_args, train_args = ilab_args(
            tmp_path,
            mlflow_tracking_uri=uri,
            mlflow_experiment_name="ilab-exp",
            mlflow_run_name="my-run",
            tensorboard_log_dir=str(tmp_path / "tb"),
        )
        result = run_training(torch_args, train_args, echo=False)
        assert result.status == "completed"
        assert result.trackers == {"mlflow": "ok", "tensorboard": "ok"}
        assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))
        client = mlflow_tracking.MlflowClient(uri)
        run = only_run(client, "ilab-exp")
        assert run.info.run_name == "my-run" and run.info.status == "FINISHED"
        logs = [r for r in records(tmp_path / "run") if r["event"] == "log"]
        assert series(client, run, "train/loss") == [(r["step"], r["data"]["loss"]) for r in logs]


@pytest.mark.extended
def test_a_tracker_that_cannot_start_never_touches_training_and_says_how_to_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers import free_port

    pytest.importorskip("mlflow")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    torch_args, train_args = ilab_args(tmp_path, mlflow_tracking_uri=dead, save_samples=0)
    result = run_training(torch_args, train_args, echo=False)
    assert result.status == "completed"
    note = result.trackers["mlflow"]
    assert note.startswith("not started: ")
    assert f"replay: ilab-watch {tmp_path / 'run'} --mlflow {dead} --replay" in note


POST_HOC = """
import json
from instructlab.training.callbacks import TrainerCallback
from training_hub import TrainingHubCallback

OUT = {out!r}


def note(*row):
    with open(OUT, "a") as f:
        f.write(json.dumps(row) + "\\n")


class IlabCb(TrainerCallback):
    def on_log(self, context):
        note("ilab", "on_log", context.step, context.loss, context.total_samples)

    def on_save(self, context):
        note("ilab", "on_save", context.step, context.checkpoint_path)


class HubCb(TrainingHubCallback):
    def on_save(self, context):
        note("hub", "on_save", context.step, context.metrics.get("checkpoint_path"))

    def on_log(self, context):
        if context.step == 3:
            context.control.should_training_stop = True
"""


@pytest.mark.extended
def test_ilab_watch_runs_instructlab_and_hub_callback_classes_post_hoc(tmp_path: Path) -> None:
    import json

    from tests.helpers import cli, write_run

    pytest.importorskip("training_hub", reason="training-hub is not installed")
    ckpt = tmp_path / "run"
    write_run(ckpt, steps=6, save_every=3)
    mod = tmp_path / "their_callbacks.py"
    mod.write_text(POST_HOC.format(out=str(tmp_path / "seen.jsonl")))
    proc = cli(
        "ilab-watch",
        str(ckpt),
        "--replay",
        "--callback",
        f"{mod}:IlabCb",
        "--callback",
        f"{mod}:HubCb",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    recs = records(ckpt)
    logs = [r for r in recs if r["event"] == "log"]
    saves = [r for r in recs if r["event"] == "save"]
    assert [s[2:] for s in seen if s[:2] == ["ilab", "on_log"]] == [
        [r["step"], r["data"]["loss"], r["samples_seen"]] for r in logs
    ]  # every record: never coalesced
    paths = [[r["step"], r["data"]["checkpoint_path"]] for r in saves]
    assert [s[2:] for s in seen if s[:2] == ["ilab", "on_save"]] == paths
    assert [s[2:] for s in seen if s[:2] == ["hub", "on_save"]] == paths
    # The run has ended: its stop request is refused in one line, and nothing is queued.
    assert not list((ckpt / "control").glob("*.json"))
    assert "HubCb.on_log: stop rejected: the run has ended (completed at step 6)" in proc.stderr


@pytest.mark.extended
def test_training_hub_sft_with_backend_ilab_journal_runs_hub_callbacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """training_hub.sft(..., backend="ilab-journal"): a tiny Llama on 2 CPU ranks; a local
    hub callback sees on_save with the checkpoint path in its metrics, and its
    should_training_stop stops the run at the next step."""
    pytest.importorskip("training_hub", reason="training-hub is not installed")
    import training_hub
    from training_hub import TrainingHubCallback, TrainingHubContext

    import trainer.instructlab.hub  # noqa: F401  (registers the backend)

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    tiny_llama(tmp_path / "model")
    processed_data(tmp_path / "processed")

    class Hub(TrainingHubCallback):
        def __init__(self) -> None:
            self.saved: list[tuple[int, str]] = []
            self.logged: list[tuple[int, float | None]] = []

        def on_log(self, context: TrainingHubContext) -> None:
            self.logged.append((context.step, context.loss))
            assert context.is_main_process and "total_samples" in context.metrics
            if context.step == 3:
                assert context.control is not None
                context.control.should_training_stop = True

        def on_save(self, context: TrainingHubContext) -> None:
            self.saved.append((context.step, context.metrics["checkpoint_path"]))

        def on_train_end(self, context: TrainingHubContext) -> None:
            assert context.control is not None
            context.control.should_save = True  # too late: the run has ended

    hub = Hub()
    result = training_hub.sft(
        model_path=str(tmp_path / "model"),
        data_path=str(tmp_path / "processed" / "data.jsonl"),
        ckpt_output_dir=str(tmp_path / "run"),
        backend="ilab-journal",
        nproc_per_node=2,
        callbacks=[hub],
        num_epochs=1,
        effective_batch_size=16,
        learning_rate=1e-3,
        max_seq_len=64,
        save_samples=32,
        checkpoint_at_epoch=False,
    )
    assert result.status == "stopped"
    recs = records(tmp_path / "run")
    end = next(r for r in recs if r["event"] == "train_end")
    assert end["step"] in (3, 4)
    saves = [r for r in recs if r["event"] == "save"]
    assert [s for s, _ in hub.saved] == [r["step"] for r in saves] and len(saves) >= 2
    assert all(Path(p).is_dir() for _, p in hub.saved)
    assert hub.logged == [(r["step"], r["data"]["loss"]) for r in recs if r["event"] == "log"]
    # the save asked for at on_train_end gets its verdict (was: a file left in control/)
    late = [r["data"] for r in recs[recs.index(end) :] if r["event"] == "control"]
    assert [(c["command"], c["accepted"]) for c in late] == [("save", False)]
    assert late[0]["reason"] == f"the run had ended (train_end at step {end['step']})"
    assert not list((tmp_path / "run" / "control").glob("*.json"))


def test_a_hub_parameter_training_here_cannot_honour_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("training_hub", reason="training-hub is not installed")
    from trainer.instructlab import InstructLabConfigError
    from trainer.instructlab.hub import hub_to_instructlab

    base = {"model_path": "m", "data_path": "d.jsonl", "ckpt_output_dir": str(tmp_path)}
    torch, train = hub_to_instructlab(
        {**base, "max_tokens_per_gpu": 512, "beta1": 0.8, "beta2": 0.9, "nproc_per_node": 2}
    )
    assert (train["max_batch_len"], train["adamw_betas"], torch["nproc_per_node"]) == (
        512,
        (0.8, 0.9),
        2,
    )
    assert train["data_output_dir"] == str(tmp_path / "data")
    for params, line in [
        ({"is_pretraining": True, "block_size": 8}, "is_pretraining: not supported here"),
        ({"checkpoint_storage": "s3://b/p"}, "checkpoint_storage: mirroring checkpoints to s3"),
        ({"beta1": 0.8}, "beta1, beta2: give both"),
    ]:
        with pytest.raises(InstructLabConfigError, match=line) as err:
            hub_to_instructlab({**base, **params})
        assert "\n" not in str(err.value)


def test_the_context_is_filled_from_the_records_as_instructlab_fills_it(tmp_path: Path) -> None:
    """ForeignCallback alone, on a written journal: what each hook's context holds."""
    from tests.helpers import write_run
    from watcher.builtin.foreign import ForeignCallback
    from watcher.hooks.callbacks import Event

    got: list[TrainingContext] = []

    class Seen(TrainerCallback):
        def on_train_begin(self, context: TrainingContext) -> None:
            got.append(context)

        def on_log(self, context: TrainingContext) -> None:
            got.append(context)

        def on_save(self, context: TrainingContext) -> None:
            got.append(context)

    ckpt = tmp_path / "run"
    write_run(ckpt, steps=4, save_every=2)
    adapter = ForeignCallback(Seen())
    assert adapter.subscribed_events == {"train_begin", "log", "evaluate", "save"}
    recs = records(ckpt)
    for rec in recs:
        if rec["event"] in adapter.subscribed_events:
            adapter.handle(Event.from_record(rec, str(ckpt), "d"), **rec["data"])
    begin, logs = got[0], [c for c in got if c.hook_name == "on_log"]
    assert (begin.step, begin.world_size, begin.output_dir) == (1, 2, str(ckpt))
    log_recs = [r for r in recs if r["event"] == "log"]
    assert [(c.step, c.loss, c.learning_rate) for c in logs] == [
        (r["step"], r["data"]["loss"], r["data"]["lr"]) for r in log_recs
    ]
    lengths = [r["data"]["batch_metrics"]["total_length"] for r in log_recs]
    assert [c.total_tokens for c in logs] == [sum(lengths[: i + 1]) for i in range(len(logs))]
    assert logs[0].batch_metrics == {
        k: v for k, v in log_recs[0]["data"]["batch_metrics"].items() if k != "accumulated_loss"
    }
    saves = [c for c in got if c.hook_name == "on_save"]
    assert [c.checkpoint_path for c in saves] == [
        r["data"]["checkpoint_path"] for r in recs if r["event"] == "save"
    ]
    assert saves[0].loss == logs[1].loss  # the context carries the last log's values
    assert all(c.is_world_process_zero and c.is_local_process_zero for c in got)
