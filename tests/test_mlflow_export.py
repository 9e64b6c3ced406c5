"""``ilab-watch --mlflow`` and ``ilab-train --report-to mlflow``: the journal read back from a
real MLflow tracking server (``mlflow server`` on loopback, sqlite backend) and from a file
store with MLflow's own client: one run per journal run, params, metric series with no
duplicate step after a watcher is killed and restarted, reports, checkpoints, status."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from journal import JournalWriter
from tests.helpers import (
    BIN,
    cli,
    free_port,
    kill_tree,
    records,
    train,
    train_argv,
    train_env,
    wait_for,
    write_steps,
)
from watcher.hooks.callbacks import CallbackSpecError

mlflow_tracking = pytest.importorskip("mlflow.tracking")


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server on a free loopback port (sqlite backend store)."""
    with mlflow_server(tmp_path_factory.mktemp("mlflow"), free_port()) as uri:
        yield uri


@contextlib.contextmanager
def mlflow_server(d: Path, port: int) -> Iterator[str]:
    """``mlflow server`` on loopback ``port``, its store in ``d`` (a restart on the same
    ``d`` and port is the same server again); killed (-9) at the end."""
    log = open(d / "server.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            *(str(BIN / "mlflow"), "server"),
            *("--backend-store-uri", f"sqlite:///{d / 'mlflow.db'}"),
            *("--artifacts-destination", str(d / "artifacts")),
            *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is not None or _healthy(uri), 240, "the MLflow server")
        assert proc.poll() is None, (d / "server.log").read_text()[-2000:]
        yield uri
    finally:
        kill_tree(proc.pid)
        log.close()


def only_run(client: Any, experiment: str) -> Any:
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r}"
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


def series(client: Any, run: Any, key: str) -> list[tuple[int, float]]:
    history = client.get_metric_history(run.info.run_id, key)
    return sorted((m.step, m.value) for m in history)


@pytest.mark.extended
def test_demo_reports_to_mlflow_and_a_restarted_watcher_adds_no_duplicates(
    server: str, tmp_path: Path
) -> None:
    ckpt = tmp_path / "run"
    client = mlflow_tracking.MlflowClient(server)
    env = {**train_env(step_delay=0.3), "MLFLOW_TRACKING_URI": server}
    job = subprocess.Popen(
        train_argv(ckpt, "--max-steps", "12", "--save-every", "4", "--report-to", "mlflow"),
        env={**env, "MLFLOW_EXPERIMENT_NAME": "embedded"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    watch_env = {**os.environ, "MLFLOW_EXPERIMENT_NAME": "watcher"}

    def watcher() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [str(BIN / "ilab-watch"), str(ckpt), "--mlflow", server],
            env=watch_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def watcher_losses() -> int:
        exp = client.get_experiment_by_name("watcher")
        runs = client.search_runs([exp.experiment_id]) if exp else []
        return len(series(client, runs[0], "train/loss")) if runs else 0

    w = watcher()
    try:
        wait_for(lambda: watcher_losses() >= 3, 240, "3 loss points from ilab-watch --mlflow")
    finally:
        kill_tree(w.pid)  # kill -9 mid-run: its cursor may lag behind what it wrote
    w = watcher()  # the restart, still live
    try:
        assert job.wait(timeout=300) == 0, job.stderr.read() if job.stderr else ""
        assert w.wait(timeout=120) == 0  # it ends after train_end
    finally:
        job.kill()
        w.kill()
    for step in (4, 8, 12):  # reports written after the end reach the watcher on a replay
        proc = cli(
            "ilab-journal",
            "report",
            str(ckpt),
            f"accuracy={step / 20}",
            "--checkpoint",
            f"step-{step:06d}",
        )
        assert proc.returncode == 0, proc.stderr
    proc = cli("ilab-watch", str(ckpt), "--mlflow", server, "--replay", env=watch_env, timeout=120)
    assert proc.returncode == 0, proc.stderr

    logged = {r["step"]: r["data"]["loss"] for r in records(ckpt) if r["event"] == "log"}
    run_id = records(ckpt)[0]["run_id"]
    for experiment in ("embedded", "watcher"):
        run = only_run(client, experiment)
        assert run.data.tags["ilab.run_id"] == run_id
        losses = series(client, run, "train/loss")
        assert [s for s, _ in losses] == list(range(1, 13))  # each step once
        assert losses == [(s, pytest.approx(v)) for s, v in sorted(logged.items())]
        assert run.data.params["max_steps"] == "12" and run.data.params["save_every"] == "4"
        assert run.data.params["model.d_model"] == "128"
        assert run.info.status == "FINISHED" and run.data.tags["ilab.status"] == "completed"
        assert run.data.tags["checkpoint.step-000008"] == str(ckpt / "checkpoints/step-000008")
    watched = only_run(client, "watcher")
    assert series(client, watched, "report/accuracy") == [
        (4, pytest.approx(0.2)),
        (8, pytest.approx(0.4)),
        (12, pytest.approx(0.6)),
    ]


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_replay_into_a_file_store_continues_one_run_across_a_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt, store = tmp_path / "run", tmp_path / "mlruns"
    kept = ckpt / "checkpoints" / "step-000009"
    kept.mkdir(parents=True)
    (kept / "weights.txt").write_text("w")
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {"lr": 0.001, "model": {"d_model": 8}}, "world_size": 2})
        write_steps(w, 1, 5)
        w.append("train_end", {"status": "interrupted", "reason": "SIGTERM"}, step=5)
    with JournalWriter(ckpt, resume=True) as w:  # attempt 2: same run_id, steps 5.. again
        w.append("train_begin", {"config": {"lr": 0.002, "max_steps": 9}, "world_size": 2})
        write_steps(w, 5, 9)
        w.append(
            "save", {"checkpoint_path": str(kept), "kind": ["full_state"], "duration": 0.1}, step=9
        )
        w.append("train_end", {"status": "completed"}, step=9)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps file stores behind it
    for name, extra in (("first", ["--mlflow-log-artifacts"]), ("again", [])):
        proc = cli(
            "ilab-watch",
            str(ckpt),
            "--replay",
            "--mlflow",
            store.as_uri(),
            "--name",
            name,
            *extra,
            timeout=180,  # importing mlflow alone takes seconds on a loaded machine
        )
        assert proc.returncode == 0, proc.stderr
    client = mlflow_tracking.MlflowClient(store.as_uri())
    run = only_run(client, "ilab-journal")
    # step 5 twice: once per attempt (other times), the replay added nothing
    assert [s for s, _ in series(client, run, "train/loss")] == [1, 2, 3, 4, 5, 5, 6, 7, 8, 9]
    assert [s for s, _ in series(client, run, "eval/val_loss")] == [4, 8]
    assert series(client, run, "report/accuracy") == [
        (4, pytest.approx(0.04)),
        (8, pytest.approx(0.08)),
    ]
    # MLflow params cannot change: the first attempt's value stays, new keys are added
    assert run.data.params == {
        "lr": "0.001",
        "model.d_model": "8",
        "world_size": "2",
        "max_steps": "9",
    }
    assert run.data.tags["ilab.attempt"] == "2"
    # journaled as /c/checkpoints/...: tagged where the run dir keeps it, as status says
    assert run.data.tags["checkpoint.step-000004"] == str(
        ckpt.resolve() / "checkpoints/step-000004"
    )
    assert run.info.status == "FINISHED"
    files = client.list_artifacts(run.info.run_id, "checkpoints/step-000009")
    assert [Path(f.path).name for f in files] == ["weights.txt"]


def test_hooks_run_out_of_order_keep_the_newest_attempt_and_ending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher runs hooks of different events in different threads: a resumed run's
    final train_end may be handled before the train_begins. The run still ends completed,
    tagged with the newest attempt (a replay in the suite lost the tag this way)."""
    from watcher.exporters.mlflow_export import MlflowExport
    from watcher.hooks.callbacks import Event

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = (tmp_path / "mlruns").as_uri()
    export = MlflowExport(store)

    def deliver(seq: int, name: str, attempt: int, **data: Any) -> None:
        rec = {"event": name, "seq": seq, "run_id": "r1", "attempt": attempt, "ts": 1e9 + seq}
        event = Event.from_record({**rec, "data": data}, str(tmp_path / "run"), f"d{seq}")
        getattr(export, f"on_{name}")(event, **data)

    deliver(20, "train_end", 2, status="completed")
    deliver(12, "train_begin", 2, config={"lr": 0.002})
    deliver(8, "train_end", 1, status="interrupted", reason="SIGTERM")
    deliver(0, "train_begin", 1, config={"lr": 0.001})
    client = mlflow_tracking.MlflowClient(store)
    run = only_run(client, "ilab-journal")
    assert run.data.tags["ilab.attempt"] == "2"
    assert run.data.tags["ilab.status"] == "completed" and "ilab.reason" not in run.data.tags
    assert run.info.status == "FINISHED"


def test_an_unreachable_tracking_server_is_one_line(tmp_path: Path) -> None:
    ckpt = tmp_path / "run"
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {}})
    uri = f"http://127.0.0.1:{free_port()}"
    proc = cli("ilab-watch", str(ckpt), "--replay", "--mlflow", uri, timeout=180)
    assert proc.returncode == 2
    assert f"cannot reach the MLflow tracking server at {uri}" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = cli("ilab-watch", str(ckpt), "--replay", "--mlflow-log-artifacts")
    assert proc.returncode == 2 and "--mlflow-log-artifacts needs --mlflow" in proc.stderr


def test_without_the_mlflow_package_the_message_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from watcher.exporters.mlflow_export import MlflowExport

    for name in [m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what an environment without it sees
    with pytest.raises(CallbackSpecError, match=r"pip install 'ilab-journal\[mlflow\]'"):
        MlflowExport("http://127.0.0.1:1")


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_report_to_trackers_that_cannot_work_warns_and_trains_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = tmp_path / "run"
    uri = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("WANDB_MODE", "sideways")
    proc = train(ckpt, "--max-steps", "2", "--report-to", "mlflow,wandb")
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if "--report-to" in ln]
    assert len(warnings) == 2, proc.stderr
    assert f"--report-to mlflow: cannot reach the MLflow tracking server at {uri}" in warnings[0]
    assert warnings[1].startswith("ilab-train: warning: --report-to wandb:")
    assert "Traceback" not in proc.stderr
    assert records(ckpt)[-1]["data"]["status"] == "completed"
    proc = cli("ilab-train", "--demo", "--ckpt-dir", str(ckpt), "--report-to", "neptune")
    assert proc.returncode == 2 and "--report-to" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_a_tracking_server_killed_mid_run_is_one_line_and_the_replay_it_names_repairs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys: Any
) -> None:
    """The launcher's exporter (``--report-to mlflow``) loses its server mid-run: the
    launcher does not wait out its grace period (600 s here) on MLflow's minutes of retries,
    says so in one line (not a line per record), and the replay that line names completes
    the run (status FINISHED, every step)."""
    from watcher.embedded import EmbeddedWatcher, Trackers

    ckpt, store, port = tmp_path / "run", tmp_path / "mlflow", free_port()
    store.mkdir()
    w = JournalWriter(ckpt)
    w.append("train_begin", {"config": {"lr": 0.001}})
    write_steps(w, 1, 4)
    with mlflow_server(store, port) as uri:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        watcher = EmbeddedWatcher(
            ckpt.resolve(),
            hooks={},
            callbacks=[],
            start_offset=0,
            exporters=list(Trackers(ckpt.resolve(), ["mlflow"]).exporters.values()),
        )
        watcher.start()
        client = mlflow_tracking.MlflowClient(uri)

        def losses() -> int:
            exp = client.get_experiment_by_name("ilab-journal")
            runs = client.search_runs([exp.experiment_id]) if exp else []
            return len(series(client, runs[0], "train/loss")) if runs else 0

        wait_for(lambda: losses() == 4, 120, "the first 4 loss points in MLflow")
    write_steps(w, 5, 20)  # the server is gone: 16 steps and the ending cannot reach it
    w.append("train_end", {"status": "completed"}, step=20)
    w.close()
    finished = threading.Event()
    threading.Thread(target=lambda: (watcher.finish(600), finished.set()), daemon=True).start()
    wait_for(finished.is_set, 120, "the launcher to give up on the dead server")

    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    said += capsys.readouterr().err.splitlines()
    assert len(said) == 1, said
    repair = f"ilab-watch {ckpt.resolve()} --mlflow {uri} --replay"
    assert "incomplete" in said[0] and repair in said[0]
    # The repair, on the server's own store (a second server start would double the cost)
    db = f"sqlite:///{store / 'mlflow.db'}"
    proc = cli(*repair.replace(uri, db).split(), timeout=180)
    assert proc.returncode == 0, proc.stderr
    client = mlflow_tracking.MlflowClient(db)
    run = only_run(client, "ilab-journal")
    assert [s for s, _ in series(client, run, "train/loss")] == list(range(1, 21))
    assert run.info.status == "FINISHED" and run.data.tags["ilab.status"] == "completed"


@pytest.mark.extended
def test_the_story_is_tagged_removed_checkpoints_commands_best_and_why_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replayed stopped run (tests/browser.py's story journal: a removed checkpoint, a
    report per save, a stop command) carries each checkpoint with its step, report and
    removal, the command and who sent it, and its reason as the description."""
    from tests.browser import story_journal

    ckpt, store = tmp_path / "run", tmp_path / "mlruns"
    story_journal(ckpt)
    with JournalWriter(ckpt, resume=True) as w:  # the trainer names the best at its end
        w.append(
            "report",
            {
                "checkpoint_path": str(ckpt / "checkpoints/step-000060"),
                "step": 60,
                "metrics": {"accuracy": 0.61},
                "source": "late",
            },
        )
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    proc = cli("ilab-watch", str(ckpt), "--replay", "--mlflow", store.as_uri(), timeout=180)
    assert proc.returncode == 0, proc.stderr
    run = only_run(mlflow_tracking.MlflowClient(store.as_uri()), "ilab-journal")
    tags = run.data.tags
    removed = tags["checkpoint.step-000020.removed"]
    assert removed == "rotation: keep_last_n=1 (at step 40)"
    assert tags["checkpoint.step-000020"].endswith("checkpoints/step-000020")
    assert tags["checkpoint.step-000040.step"] == "40"
    assert tags["checkpoint.step-000040.report"] == "accuracy=0.4 from watcher:eval-accuracy"
    assert tags["checkpoint.step-000060.report"] == "accuracy=0.61 from late"
    assert tags["control.c1"] == "stop applied at step 60 from eval.py: target reached"
    # the kind in status's words (a source not named eval:... is an operator's), and the source
    assert tags["ilab.stop_source"] == "operator" and tags["ilab.stopped_by"] == "eval.py"
    assert tags["ilab.best_checkpoint"].endswith("checkpoints/step-000060")
    assert tags["ilab.best"] == "accuracy=0.61 at step 60"  # the late report: the fold's best
    assert tags["mlflow.note.content"].startswith("stopped: stop command: target")
    assert run.info.status == "FINISHED" and tags["ilab.status"] == "stopped"


def _late_evals_journal(ckpt: Path) -> None:
    """``keep_best accuracy:max``, saves at 10..60; the evals of 10..30 report before
    ``train_end`` (which so names step 30, 0.03, its best then), those of 40..60 after it.
    A watcher elsewhere journaled step 10's removal with a relative path."""
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {"keep_best": "accuracy:max"}})
        for s in range(10, 70, 10):
            (ckpt / "checkpoints" / f"step-{s:06d}").mkdir(parents=True)
            path = str(ckpt / f"checkpoints/step-{s:06d}")
            w.append("save", {"checkpoint_path": path, "kind": ["full_state"]}, step=s)
            if s <= 30:
                w.append(
                    "report",
                    {"checkpoint_path": path, "step": s, "metrics": {"accuracy": s / 1000}},
                    step=s,
                )
        best = {"checkpoint_path": str(ckpt / "checkpoints/step-000030"), "metric": "accuracy"}
        w.append(
            "train_end",
            {
                "status": "stopped",
                "reason": "enough",
                "best_checkpoint": {**best, "value": 0.03, "step": 30},
            },
            step=60,
        )
    (ckpt / "checkpoints/step-000010").rmdir()
    with JournalWriter(ckpt, resume=True) as w:  # after the end: a removal, evals behind
        w.append(
            "checkpoint_removed",
            {"checkpoint_path": "run/checkpoints/step-000010", "reason": "pruned", "by": "watcher"},
            step=60,
        )
        for s in (40, 50):
            path = f"checkpoints/step-{s:06d}"  # relative: the eval ran in the run dir
            w.append(
                "report",
                {"checkpoint_path": path, "step": s, "metrics": {"accuracy": s / 1000}},
                step=60,
            )


@pytest.mark.extended  # the MLflow area keeps its default runs (the hang-aborted tags among them)
def test_the_best_and_the_description_come_from_the_fold_not_train_ends_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reports that land after ``train_end`` change the best: MLflow's ``ilab.best*`` tags and
    the description name what ``status`` names (the run's fold), retagged by a later
    watcher whose cursor starts after the end; a checkpoint spelled relative and absolute
    is one ``checkpoint.<name>`` tag with its canonical path."""
    from journal.read.reader import iter_records
    from journal.views.fold import RunFold

    ckpt, store = tmp_path / "run", tmp_path / "mlruns"
    _late_evals_journal(ckpt)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    watch = ("ilab-watch", str(ckpt), "--replay", "--mlflow", store.as_uri())
    proc = cli(*watch, timeout=180)
    assert proc.returncode == 0, proc.stderr
    client = mlflow_tracking.MlflowClient(store.as_uri())
    tags = only_run(client, "ilab-journal").data.tags
    canonical = str(ckpt.resolve() / "checkpoints/step-000050")
    assert tags["ilab.best_checkpoint"] == canonical  # train_end said step 30
    assert tags["ilab.best"] == "accuracy=0.05 at step 50"
    assert (
        tags["mlflow.note.content"]
        == f"stopped: enough\n\nbest checkpoint: {canonical} (accuracy=0.05 at step 50)"
    )
    assert tags["checkpoint.step-000010"] == str(ckpt.resolve() / "checkpoints/step-000010")
    assert tags["checkpoint.step-000010.removed"] == "pruned (at step 60)"
    assert tags["checkpoint.step-000050.report"] == "accuracy=0.05"
    # one more late report, for a watcher whose cursor is past everything else: the fold
    # is the journal's (read up to the report), the tags follow
    with JournalWriter(ckpt, resume=True) as w:
        path = str(ckpt / "checkpoints/step-000060")
        w.append(
            "report", {"checkpoint_path": path, "step": 60, "metrics": {"accuracy": 0.06}}, step=60
        )
    proc = cli(*watch, timeout=180)
    assert proc.returncode == 0, proc.stderr
    fold = RunFold(ckpt)
    fold.add_batch(list(iter_records(ckpt / "journal.jsonl")))
    best = fold.summary().best_checkpoint
    assert best is not None and best["checkpoint_path"].endswith("step-000060")
    tags = only_run(client, "ilab-journal").data.tags
    assert tags["ilab.best_checkpoint"] == best["checkpoint_path"]
    assert tags["ilab.best"] == "accuracy=0.06 at step 60"
    assert tags["mlflow.note.content"].endswith(f"({tags['ilab.best']})")


def test_a_hang_aborted_attempt_is_tagged_as_status_says_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Who stopped a run comes from the fold: a hang abort (no stop command) is
    ``ilab.stop_source`` ``hang``, by the guard that aborted it, as ``status`` says."""
    from watcher.alerts.guard import hang_end_payload

    ckpt, store = tmp_path / "run", tmp_path / "mlruns"
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {}})
        marker = {"message": "rank 1 stuck", "alert_id": "a1", "source": "ilab-watch:guard"}
        w.append("train_end", hang_end_payload(marker, written_by="launcher"), step=3)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    proc = cli("ilab-watch", str(ckpt), "--replay", "--mlflow", store.as_uri(), timeout=180)
    assert proc.returncode == 0, proc.stderr
    tags = only_run(mlflow_tracking.MlflowClient(store.as_uri()), "ilab-journal").data.tags
    status = cli("ilab-journal", "status", str(ckpt), "--json")
    assert json.loads(status.stdout)["stop_source"] == "hang"
    assert tags["ilab.stop_source"] == "hang" and tags["ilab.stopped_by"] == "ilab-watch:guard"
