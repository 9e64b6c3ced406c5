"""EarlyStopping and DivergenceDetector on synthetic journals."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from journal import Control, JournalWriter
from tests.helpers import cli
from watcher.builtin.steering import DivergenceDetector, EarlyStopping, parse_builtin
from watcher.hooks.callbacks import CallbackSpecError, Event
from watcher.hooks.contract import read_callback


def ev(name: str, step: int, run_id: str = "r1", **data: Any) -> Event:
    rec = {"event": name, "seq": step, "step": step, "run_id": run_id, "data": data}
    return Event.from_record(rec, "/ck", f"d{step}")


def feed_eval(cb: EarlyStopping, values: list[float], run_id: str = "r1") -> list[Control | None]:
    return [
        cb.on_evaluate(ev("evaluate", i, run_id, val_loss=v), val_loss=v)
        for i, v in enumerate(values)
    ]


def test_early_stopping_patience_min_delta_and_fires_once() -> None:
    cb = EarlyStopping(metric="val_loss", patience=3, min_delta=0.01)
    out = feed_eval(cb, [1.0, 0.9, 0.895, 0.92, 0.91, 0.95, 0.96])
    # 0.895 is not an improvement beyond min_delta; the third non-improvement triggers.
    assert [o is not None for o in out] == [False, False, False, False, True, False, False]
    assert out[4].command == "stop" and "did not improve on 0.9" in out[4].reason


def test_early_stopping_max_mode_and_abort() -> None:
    cb = EarlyStopping(metric="val_accuracy", mode="max", patience=2, action="abort")
    vals = [0.5, 0.6, 0.59, 0.58]
    out = [
        cb.on_evaluate(ev("evaluate", i, val_accuracy=v), val_accuracy=v)
        for i, v in enumerate(vals)
    ]
    assert out[:3] == [None, None, None] and out[3].command == "abort"


def test_early_stopping_uses_log_records_for_train_metrics() -> None:
    cb = EarlyStopping(metric="loss", patience=1)
    assert cb.on_evaluate(ev("evaluate", 1, loss=5.0), loss=5.0) is None  # not its event
    assert cb.on_log(ev("log", 1, loss=1.0), loss=1.0) is None
    assert cb.on_log(ev("log", 2, loss=1.5), loss=1.5).command == "stop"


def test_a_new_run_in_the_same_dir_starts_fresh() -> None:
    cb = EarlyStopping(patience=2)
    assert feed_eval(cb, [1.0, 1.1], run_id="old")[-1] is None
    assert feed_eval(cb, [2.0, 2.1], run_id="new") == [None, None]  # no carry-over of best=1.0


def test_replay_rebuilds_patience_like_an_uninterrupted_watcher() -> None:
    values = [1.0, 0.8, 0.85, 0.86, 0.9]
    continuous = feed_eval(EarlyStopping(patience=3), values)
    restarted = EarlyStopping(patience=3)
    restarted.restore_state(
        [{"event": "evaluate", "run_id": "r1", "data": {"val_loss": v}} for v in values[:3]]
    )
    live = [
        restarted.on_evaluate(ev("evaluate", i, val_loss=v), val_loss=v)
        for i, v in enumerate(values[3:], 3)
    ]
    assert [o is not None for o in continuous[3:]] == [o is not None for o in live] == [False, True]


def test_replay_of_an_already_triggered_condition_sends_nothing_more() -> None:
    cb = EarlyStopping(patience=1)
    cb.restore_state(
        [{"event": "evaluate", "run_id": "r1", "data": {"val_loss": v}} for v in (1.0, 1.2)]
    )
    assert cb.on_evaluate(ev("evaluate", 3, val_loss=1.3), val_loss=1.3) is None


def log_feed(det: DivergenceDetector, losses: list[float]) -> list[Control | None]:
    out = []
    for i, loss in enumerate(losses):
        finite = math.isfinite(loss)
        data = {"loss": loss if finite else None, "loss_finite": finite}
        out.append(det.on_log(ev("log", i, **data), **data))
    return out


def test_divergence_nan_triggers_at_once_even_in_warmup() -> None:
    out = log_feed(DivergenceDetector(warmup=100), [3.0, float("nan")])
    assert out[0] is None and "NaN" in out[1].reason


def test_divergence_healthy_run_never_triggers() -> None:
    losses = [10 * 0.97**i + 0.05 * ((-1) ** i) for i in range(300)]
    assert all(o is None for o in log_feed(DivergenceDetector(), losses))


def test_divergence_sustained_spike_triggers_after_patience() -> None:
    losses = [4.0 - 0.1 * i for i in range(20)] + [9.0] * 10
    out = log_feed(
        DivergenceDetector(smoothing=0.5, threshold=1.0, patience=3, warmup=5, action="abort"),
        losses,
    )
    first = next(i for i, o in enumerate(out) if o is not None)
    assert 20 <= first <= 24 and out[first].command == "abort"
    assert sum(o is not None for o in out) == 1


def test_divergence_relative_threshold_only() -> None:
    det = DivergenceDetector(
        threshold=None, relative_threshold=1.5, patience=2, warmup=2, smoothing=1.0
    )
    out = log_feed(det, [2.0, 1.0, 1.0, 1.4, 1.6, 1.7])
    assert [o is not None for o in out] == [False, False, False, False, False, True]


@pytest.mark.parametrize(
    ("kind", "spec", "message"),
    [
        ("early-stopping", "patience=0", "patience"),
        ("early-stopping", "mode=sideways", "mode"),
        ("early-stopping", "bogus=1", "unknown setting"),
        ("divergence", "threshold=none", "threshold"),
        ("divergence", "smoothing=2", "smoothing"),
        ("divergence", "action=explode", "action"),
        ("divergence", "patience", "key=value"),
        # numbers: finite and of their kind, or refused naming the setting (not a TypeError)
        ("early-stopping", "min_delta=nan", "min_delta=nan: expected a finite number, 0 or more"),
        ("early-stopping", "patience=2.9", "patience=2.9: expected a whole number, 1 or more"),
        ("early-stopping", "patience=abc", "patience=abc"),
        ("early-stopping", "patience=inf", "patience=inf"),
        ("early-stopping", "patience=nan", "patience=nan"),
        ("early-stopping", "patience=" + "9" * 5000, "patience=9999"),
        ("divergence", "warmup=nan", "warmup=nan: expected a whole number, 0 or more"),
        ("divergence", "threshold=nan", "threshold=nan"),
        ("divergence", "threshold=-1", "threshold=-1"),
        ("divergence", "relative_threshold=inf", "relative_threshold=inf"),
        ("divergence", "smoothing=nan", "smoothing=nan"),
    ],
)
def test_bad_settings_are_clear_errors(kind: str, spec: str, message: str) -> None:
    with pytest.raises(CallbackSpecError, match=message):
        if kind == "divergence" and spec == "threshold=none":
            parse_builtin(kind, "threshold=none,relative_threshold=none")
        else:
            parse_builtin(kind, spec)


def test_ilab_watch_early_stopping_keeps_patience_across_restarts(ckpt: Path) -> None:
    w = JournalWriter(ckpt)  # open: the run is live, so a stop is for an attempt to apply
    for i, v in enumerate([1.0, 0.8, 0.85]):
        w.append(
            "evaluate", {"val_loss": v, "val_num_tokens": 10, "duration": 0.1}, step=(i + 1) * 10
        )
    w.flush()
    args = ("--replay", "--early-stopping", "metric=val_loss,patience=2", "--name", "es")
    first = cli("ilab-watch", str(ckpt), *args)
    assert first.returncode == 0 and not (ckpt / "control").exists()  # one bad eval: no action yet
    w.append("evaluate", {"val_loss": 0.9, "val_num_tokens": 10, "duration": 0.1}, step=40)
    w.flush()
    second = cli("ilab-watch", str(ckpt), *args)  # a new process, same cursor name
    w.close()
    assert second.returncode == 0, second.stderr
    cmds = [json.loads(p.read_text()) for p in (ckpt / "control").glob("*.json")]
    assert (
        len(cmds) == 1
        and cmds[0]["command"] == "stop"
        and "did not improve on 0.8" in cmds[0]["reason"]
    )


def test_ilab_watch_rejects_bad_builtin_settings(ckpt: Path) -> None:
    proc = cli("ilab-watch", str(ckpt), "--divergence", "smoothing=7")
    assert proc.returncode == 2 and "smoothing" in proc.stderr and "Traceback" not in proc.stderr


def test_the_python_api_judges_numbers_as_the_options_do() -> None:
    with pytest.raises(CallbackSpecError, match=r"patience=2\.9: expected a whole number"):
        EarlyStopping(patience=2.9)  # type: ignore[arg-type]
    with pytest.raises(CallbackSpecError, match="min_delta=nan"):
        EarlyStopping(min_delta=math.nan)
    with pytest.raises(CallbackSpecError, match="threshold=inf"):
        DivergenceDetector(threshold=math.inf)
    assert EarlyStopping(patience=3.0).patience == 3  # a whole float is a whole number


def test_ilab_watch_refuses_min_delta_nan_instead_of_stopping_an_improving_run(
    ckpt: Path,
) -> None:
    """min_delta=nan made every comparison false: a run improving at every eval was stopped."""
    with JournalWriter(ckpt) as w:
        for i, v in enumerate([1.0, 0.8, 0.6, 0.4, 0.2]):
            data = {"val_loss": v, "val_num_tokens": 10, "duration": 0.1}
            w.append("evaluate", data, step=(i + 1) * 10)
        w.append("train_end", {"status": "completed"}, step=50)
    spec = "metric=val_loss,patience=2,min_delta=nan"
    proc = cli("ilab-watch", str(ckpt), "--early-stopping", spec, "--poll", "0.05")
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]  # after click's usage banner
    assert line.startswith("Error: --early-stopping min_delta=nan: expected a finite number")
    assert "Traceback" not in proc.stderr and not (ckpt / "control").exists()


def test_early_stopping_on_a_metric_that_never_appears_warns_once(ckpt: Path) -> None:
    with JournalWriter(ckpt) as w:
        for i, v in enumerate([1.0, 0.8, 0.85]):
            w.append("evaluate", {"val_loss": v, "val_num_tokens": 10, "duration": 0.1}, step=i)
    proc = cli("ilab-watch", str(ckpt), "--replay", "--early-stopping", "metric=val_acc")
    assert proc.returncode == 0, proc.stderr
    warning = "'val_acc' is not in evaluate records (they have: duration, val_loss, val_num_tokens)"
    assert proc.stderr.count(warning) == 1, proc.stderr


# -- a metric the run's configuration never produces (issue 18, item 15) -------------------


def begin(config: dict[str, Any], run_id: str = "r1") -> dict[str, Any]:
    return {"event": "train_begin", "seq": 0, "run_id": run_id, "data": {"config": config}}


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"data_path": "t.jsonl", "val_data_path": None, "eval_every": None}, "no validation"),
        ({"data_path": "t.jsonl", "val_data_path": None, "eval_every": 50}, "no validation"),
        ({"demo": True, "val_data_path": None, "eval_every": None}, "no eval_every"),
        ({"val_data_path": "v.jsonl", "eval_every": None}, "no eval_every"),
        ({"val_data_path": "v.jsonl", "eval_every": 50}, None),
        ({"demo": True, "val_data_path": None, "eval_every": 50}, None),
        # A bridge's train_begin (HF Trainer's arguments): not ilab-train's settings.
        ({"output_dir": "out", "eval_strategy": "steps", "eval_steps": 50}, None),
    ],
)
def test_early_stopping_on_val_loss_warns_when_the_run_does_not_evaluate(
    caplog: pytest.LogCaptureFixture, config: dict[str, Any], says: str | None
) -> None:
    cb = EarlyStopping(metric="val_loss")
    rec = begin(config)
    event = Event.from_record(rec, "/ck", "d0")
    with caplog.at_level("WARNING", logger="watcher"):
        assert cb.on_train_begin(event, **rec["data"]) is None
        cb.on_train_begin(event, **rec["data"])  # a second look at the same run: no repeat
    warnings = [r.getMessage() for r in caplog.records]
    if says is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and says in warnings[0] and "val_loss" in warnings[0]


def test_a_watcher_started_after_train_begin_warns_from_history(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cb = EarlyStopping(metric="val_loss")
    with caplog.at_level("WARNING", logger="watcher"):
        cb.restore_state(
            [
                begin({"val_data_path": None, "eval_every": None}, "old"),
                begin({"demo": True, "val_data_path": None, "eval_every": None}, "new"),
            ]
        )
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "no eval_every" in warning  # the newest run's configuration counts


def test_metrics_from_log_or_report_records_do_not_look_at_the_config() -> None:
    hooked = read_callback(EarlyStopping(metric="val_loss")).methods
    assert set(hooked) == {"train_begin", "evaluate"}
    assert set(read_callback(EarlyStopping(metric="accuracy", mode="max")).methods) == {"report"}
    assert set(read_callback(DivergenceDetector()).methods) == {"log"}


def test_ilab_watch_early_stopping_warns_once_at_start_for_a_run_without_evaluation(
    ckpt: Path,
) -> None:
    with JournalWriter(ckpt) as w:  # ilab-train's settings: no validation data, no eval_every
        config = {"data_path": "train.jsonl", "val_data_path": None, "eval_every": None}
        w.append("train_begin", {"config": config})
        w.append("train_end", {"status": "completed"})
    proc = cli("ilab-watch", str(ckpt), "--replay", "--early-stopping", "metric=val_loss")
    assert proc.returncode == 0, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if "val_loss" in x]
    assert len(lines) == 1 and "no validation data" in lines[0], proc.stderr
    # Reading train_begin adds a hook, not a new default cursor name: a watcher restarted
    # after an upgrade finds the cursor it saved before (else it would deliver everything
    # again).
    assert "cursor 'evaluate-watcher-builtins-EarlySt-6b81a17d'" in proc.stderr
