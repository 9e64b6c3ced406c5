"""``ilab-journal backtest`` on hand-built journals: built-in early stopping swept over
patience, the eval's own target, retention that deletes the later-best checkpoint, a user
callback class fed the same records in the same order as ``ilab-watch`` feeds it, and
nothing written into the run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from journal import JournalWriter
from journal.cli.main import main
from tests.helpers import BIN, begin_payload, cli, log_payload

BEGIN = begin_payload(80, world_size=2, config={"keep_best": "accuracy:max", "keep_last_n": 2})
#: val_loss and the reported accuracy of each checkpoint (every 10 steps).
VAL = [1.0, 0.8, 0.9, 0.85, 0.95, 0.7, 0.99, 0.98]
ACC = [0.1, 0.5, 0.6, 0.4, 0.3, 0.9, 0.7, 0.8]


def build(run: Path, *, late_best: bool = False) -> None:
    """80 steps; every 10: evaluate, save, the checkpoint's report. ``late_best``: the
    report of step 20 (the best, 0.95) comes only after train_end."""
    t = time.time() - 1000.0
    with JournalWriter(run) as w:
        w.append("train_begin", BEGIN, ts=t)
        for step in range(1, 81):
            t += 1.0
            bm = {"total_samples": 8, "total_length": 100, "num_loss_counted_tokens": 90,
                  "accumulated_loss": 1.0, "grad_accum_steps": 1, "num_minibatches": 1}  # fmt: skip
            w.append("log", {"loss": 1.0, "lr": 1e-3, "batch_metrics": bm}, step=step, ts=t)
            if step % 10:
                w.append("step_end", {"loss": 1.0}, step=step, samples_seen=8 * step, ts=t)
                continue
            i = step // 10 - 1
            w.append("evaluate", {"val_loss": VAL[i]}, step=step, ts=t)
            w.append("step_end", {"loss": 1.0}, step=step, samples_seen=8 * step, ts=t)
            path = str(run / "checkpoints" / f"step-{step:06d}")
            w.append("save", {"checkpoint_path": path, "kind": ["full_state"], "duration": 1.0}, step=step, ts=t)  # fmt: skip
            if not (late_best and step == 20):
                w.append("report", _report(path, step, ACC[i], t + 0.5), step=step, ts=t + 0.5)
        w.append(
            "train_end", {"status": "completed", "reason": "reached step 80"}, step=80, ts=t + 1
        )
        if late_best:
            path = str(run / "checkpoints" / "step-000020")
            w.append("report", _report(path, 20, 0.95, t + 2), step=80, ts=t + 2)


def _report(path: str, step: int, acc: float, at: float) -> dict[str, object]:
    return {"id": f"r{step}", "checkpoint_path": path, "step": step, "metrics": {"accuracy": acc},
            "source": "eval", "delivery_id": None, "reported_at": at}  # fmt: skip


def backtest(*args: str) -> tuple[int, str]:
    got = CliRunner().invoke(main, ["backtest", *args])
    return got.exit_code, got.output


def test_a_patience_sweep_one_row_per_value(tmp_path: Path) -> None:
    build(tmp_path / "a")
    build(tmp_path / "b")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    journal = (tmp_path / "a" / "journal.jsonl").read_bytes()
    code, out = backtest(str(tmp_path / "a"), str(tmp_path / "b"), "--early-stopping",
                         "metric=val_loss,patience=1..3", "--json")  # fmt: skip
    assert code == 0, out
    runs = [json.loads(line) for line in out.splitlines()]
    stops = {s["policy"]: s for s in runs[0]["stops"]}
    # val_loss 1.0 0.8 0.9: patience 1 answers the evaluate of step 30, applied at 31
    p1 = stops["early_stopping patience=1"]
    assert (p1["trigger_step"], p1["stop_step"], p1["steps_saved"]) == (30, 31, 49)
    assert (p1["samples_saved"], p1["tokens_saved"]) == (8 * 49, 100 * 49)
    assert p1["would_have"][0]["what"] == "stop" and p1["kind"] == "early_stopping"
    # judged by the run's keep_best: 0.6 was the best by step 31; the run's best 0.9
    assert (p1["best_at_stop"], p1["best_value"]) == (0.6, 0.9)
    assert p1["lost"] == pytest.approx(0.3)
    assert stops["early_stopping patience=2"]["stop_step"] == 41  # 0.9, 0.85 after 0.8
    assert stops["early_stopping patience=3"]["stop_step"] == 51
    # nothing written: no control/ file, no report, the journal byte for byte
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "a" / "journal.jsonl").read_bytes() == journal
    code, out = backtest(str(tmp_path / "a"), str(tmp_path / "b"), "--early-stopping",
                         "metric=val_loss,patience=1..3")  # fmt: skip
    rows = [line for line in out.splitlines() if line.startswith("early_stopping patience=")]
    assert len(rows) == 3 and rows[0].split()[2:4] == ["2", "2"]  # runs, stopped


def test_the_evals_own_target_stops_when_its_result_is_known(tmp_path: Path) -> None:
    build(tmp_path)
    code, out = backtest(str(tmp_path), "--target", "accuracy>=0.55", "--json")
    stop = json.loads(out)["stops"][0]
    # step 30's accuracy 0.6 was reported 0.5 s after step 30's end: applied at step 31
    assert (code, stop["trigger_step"], stop["stop_step"], stop["kind"]) == (0, 30, 31, "eval")


def test_a_target_known_before_the_end_but_journaled_after_it_stops_where_the_run_did(
    tmp_path: Path,
) -> None:
    """The eval sends its stop, then its report; the trainer reads the stop at its last
    step boundary and ends before the report lands, which the watcher journals after
    ``train_end`` (the demo's race, seen in CI): the policy stops where the run did."""
    t = time.time() - 100.0
    path = str(tmp_path / "checkpoints" / "step-000010")
    with JournalWriter(tmp_path) as w:
        w.append("train_begin", BEGIN, ts=t)
        for step in range(1, 13):
            w.append("step_end", {"loss": 1.0}, step=step, samples_seen=8 * step, ts=t + step)
            if step == 10:
                w.append("save", {"checkpoint_path": path, "kind": ["full_state"], "duration": 1.0}, step=10, ts=t + 10)  # fmt: skip
        w.append("control", {"command": "stop", "id": "c", "source": "eval", "accepted": True}, step=12, ts=t + 11.9)  # fmt: skip
        w.append("train_end", {"status": "stopped", "reason": "stop command"}, step=12, ts=t + 12.5)
        w.append("report", _report(path, 10, 0.9, t + 12.2), step=12, ts=t + 14)
    code, out = backtest(str(tmp_path), "--target", "accuracy>=0.8", "--json")
    stop = json.loads(out)["stops"][0]
    assert (code, stop["trigger_step"], stop["stop_step"], stop["steps_saved"]) == (0, 10, 12, 0)


def test_retention_that_deletes_the_later_best(tmp_path: Path) -> None:
    build(tmp_path, late_best=True)
    code, out = backtest(str(tmp_path), "--keep-last-n", "[1,8]", "--json")
    assert code == 0, out
    kept = {r["keep_last_n"]: r for r in json.loads(out)["retention"]}
    assert kept[1]["best"] == "step-000020" and kept[1]["best_deleted"]
    assert "step-000020" in kept[1]["removed"] and len(kept[1]["kept"]) == 2  # + the best so far
    assert not kept[8]["best_deleted"] and kept[8]["removed"] == []


CALLBACK = '''
import json, os
from journal import Control
from watcher.hooks.callbacks import TrainerCallback

class Recorder(TrainerCallback):
    """Writes each record it gets; asks to stop at the evaluate of step 40."""
    def _note(self, event):
        with open(os.environ["RECORDED"], "a") as f:
            f.write(json.dumps([event.name, event.seq, event.step]) + "\\n")
    def on_evaluate(self, event, **data):
        self._note(event)
        return Control.stop("seen enough") if event.step == 40 else None
    def on_save(self, event, **data):
        self._note(event)
    def on_report(self, event, **data):
        self._note(event)
    def on_train_end(self, event, **data):
        self._note(event)
'''


def test_a_callback_sees_what_the_watcher_gives_it(tmp_path: Path) -> None:
    build(tmp_path / "run")
    shutil.copytree(tmp_path / "run", tmp_path / "watched")
    (tmp_path / "cb.py").write_text(CALLBACK)
    watched = tmp_path / "watched.jsonl"
    proc = cli("ilab-watch", str(tmp_path / "watched"), "--callback", "cb.py:Recorder",
               cwd=tmp_path, env={"RECORDED": str(watched)}, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    replayed = tmp_path / "replayed.jsonl"
    os.environ["RECORDED"] = str(replayed)
    try:
        code, out = backtest(str(tmp_path / "run"), "--callback", str(tmp_path / "cb.py") + ":Recorder", "--json")  # fmt: skip
    finally:
        del os.environ["RECORDED"]
    assert code == 0, out
    assert replayed.read_text().splitlines() == watched.read_text().splitlines()
    assert len(watched.read_text().splitlines()) == 8 * 3 + 1
    stop = json.loads(out)["stops"][0]
    assert (stop["policy"], stop["stop_step"], stop["kind"]) == ("callbacks", 41, "callback")
    assert not (tmp_path / "run" / "control").exists()  # recorded as would-have, never sent


@pytest.mark.parametrize(
    "args",
    [
        ["--early-stopping", "patience=0"],
        ["--early-stopping", "patience=5..1"],
        ["--keep-last-n", "0"],
        ["--target", "accuracy=0.8"],
        ["--callback", "nosuch.py:Cb"],
        ["--on-evaluate", "python eval.py"],
        ["--keep-best", "accuracy"],
        # numbers in sweeps go through the setting's own rule: no TypeError, no int() limit
        ["--early-stopping", "patience=1.5..3"],
        ["--early-stopping", "patience=[1,2.9]"],
        ["--early-stopping", "min_delta=[0,nan]"],
        ["--divergence", "threshold=nan"],
        ["--keep-last-n", "9" * 5000],
    ],
)
def test_a_bad_policy_is_one_line_exit_2(tmp_path: Path, args: list[str]) -> None:
    build(tmp_path)
    code, out = backtest(str(tmp_path), *args)
    assert code == 2 and len(out.strip().splitlines()) == 1 and "Traceback" not in out, out


def test_a_function_hook_and_a_swept_retention(tmp_path: Path) -> None:
    """``--on-evaluate file.py:func`` runs like ``watch(on_evaluate=func)``: its keyword
    arguments are the payload; the Control it returns is a would-have stop."""
    build(tmp_path / "run")
    (tmp_path / "fn.py").write_text(
        "from journal import Control\n"
        "def rising(event, val_loss, **data):\n"
        "    if event.step > 10 and val_loss > 0.96:\n"
        "        return Control.stop(f'val_loss {val_loss}')\n"
    )
    code, out = backtest(str(tmp_path / "run"), "--on-evaluate", f"{tmp_path / 'fn.py'}:rising",
                         "--keep-last-n", "1..2")  # fmt: skip
    assert code == 0, out
    assert "callbacks: would stop at step 71 (answering seq" in out  # val_loss 0.99 at 70
    assert "stop: val_loss 0.99" in out
    assert "keep_last_n=1 keep_best=accuracy:max: keeps" in out
    assert "keep_last_n=2 keep_best=accuracy:max: keeps" in out


@pytest.mark.extended  # importing instructlab-training and training_hub: about 12 s
def test_instructlab_and_training_hub_callbacks_run_as_the_watcher_runs_them(
    tmp_path: Path,
) -> None:
    """InstructLab's TrainerCallback returning our Control, training_hub's setting
    should_training_stop, each with its own context (the watcher's adapter): their stops
    are would-haves; nothing is written."""
    pytest.importorskip("instructlab.training", reason="instructlab-training is not installed")
    pytest.importorskip("training_hub", reason="training-hub is not installed")
    build(tmp_path / "run")
    (tmp_path / "theirs.py").write_text(
        "from instructlab.training.callbacks import TrainerCallback\n"
        "from training_hub import TrainingHubCallback\n"
        "from journal import Control\n"
        "class IlabStop(TrainerCallback):\n"
        "    def on_log(self, context):\n"
        "        return Control.stop('ilab') if context.step == 30 else None\n"
        "class HubStop(TrainingHubCallback):\n"
        "    def on_log(self, context):\n"
        "        if context.step == 50:\n"
        "            context.control.should_training_stop = True\n"
    )
    for name, step in (("IlabStop", 30), ("HubStop", 50)):
        spec = f"{tmp_path / 'theirs.py'}:{name}"
        code, out = backtest(str(tmp_path / "run"), "--callback", spec, "--json")
        assert code == 0, out
        stop = json.loads(out)["stops"][0]
        assert (stop["policy"], stop["trigger_step"], stop["stop_step"]) == (
            "callbacks",
            step,
            step + 1,
        )
    assert "should_training_stop" in stop["reason"]
    assert not (tmp_path / "run" / "control").exists()


def test_only_the_current_run_is_replayed_as_it_is_read(tmp_path: Path) -> None:
    """A journal that holds an earlier run before the current one, and a torn final line of
    yet another: the backtest (its callbacks too) sees only the current run, and says what
    it says of that run alone; judged by a logged metric as well."""
    build(tmp_path / "alone")
    run = tmp_path / "run"
    with JournalWriter(run, run_id="earlier") as w:
        w.append("train_begin", BEGIN, ts=time.time() - 5000.0)
        for step in (10, 20, 30):
            w.append("evaluate", {"val_loss": 0.1 * step, "loss": 9.0}, step=step)
            w.append("log", {"loss": 9.0}, step=step)
    torn = b'{"v":1,"seq":9999,"run_id":"torn","event":"train_begin","step":0,"data":{}}'
    (run / "journal.jsonl").write_bytes(
        (run / "journal.jsonl").read_bytes()
        + (tmp_path / "alone" / "journal.jsonl").read_bytes()
        + torn
    )
    (tmp_path / "cb.py").write_text(CALLBACK)
    outs = []
    for name in ("alone", "run"):
        os.environ["RECORDED"] = str(tmp_path / f"{name}.recorded")
        try:
            code, out = backtest(str(tmp_path / name), "--early-stopping",
                                 "metric=val_loss,patience=1..3", "--divergence", "metric=loss",
                                 "--target", "accuracy>=0.55", "--metric", "loss:min",
                                 "--callback", f"{tmp_path / 'cb.py'}:Recorder", "--json")  # fmt: skip
        finally:
            del os.environ["RECORDED"]
        assert code == 0, out
        got = json.loads(out)
        del got["journal"]
        outs.append(got)
    assert outs[0]["run_id"] != "earlier" and outs[0] == outs[1]
    stops = {s["policy"]: s for s in outs[1]["stops"]}
    assert stops["early_stopping patience=1"]["stop_step"] == 31
    assert stops["target accuracy>=0.55"]["stop_step"] == 31
    assert (stops["callbacks"]["stop_step"], stops["callbacks"]["final_value"]) == (41, 1.0)
    recorded = (tmp_path / "run.recorded").read_text()
    assert recorded == (tmp_path / "alone.recorded").read_text() and recorded.count("\n") == 25


def _peak_rss_mb(*argv: str) -> float:
    """The peak RSS of a command run to its end (its process and theirs), in MB."""
    code = (
        "import resource, subprocess, sys; "
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stdout) / 1024


def write_long_journal(run: Path, steps: int) -> None:
    """A finished step-detail run written straight with orjson (fast: no writer): per step a
    ``log`` and a ``step_end``; every 20 steps an ``evaluate``, every 40 a ``save`` and its
    ``report``."""
    run.mkdir(parents=True)
    t, seq = time.time() - 10 * steps, 0
    with open(run / "journal.jsonl", "wb") as f:

        def put(event: str, data: dict, step: int, samples: int = 0) -> None:
            nonlocal seq
            f.write(orjson.dumps({"v": 1, "seq": seq, "run_id": "long", "attempt": 1, "ts": t,
                                  "event": event, "step": step, "epoch": 0,
                                  "samples_seen": samples, "data": data}) + b"\n")  # fmt: skip
            seq += 1

        put("train_begin", BEGIN, 0)
        for s in range(1, steps + 1):
            t += 0.5
            put("log", log_payload(s, 1.0 + (s % 7) / 10), s, 8 * s)
            if s % 20 == 0:
                put("evaluate", {"val_loss": 1.0 + ((s * 7919) % 100) / 100}, s)
            put("step_end", {"loss": 1.0}, s, 8 * s)
            if s % 40 == 0:
                path = str(run / "checkpoints" / f"step-{s:06d}")
                put("save", {"checkpoint_path": path, "kind": ["full_state"], "duration": 1.0}, s)
                put("report", _report(path, s, (s % 97) / 100, t), s)
        put("train_end", {"status": "completed", "reason": "done"}, steps)


@pytest.mark.extended
def test_a_long_journal_is_backtested_in_memory_that_does_not_grow_with_it(
    tmp_path: Path,
) -> None:
    """420k records (130 MB) take less memory than their file (kept whole, as they were,
    they took four times it): only step boundaries, the metrics asked for and one record
    per eval or save are kept. benchmarks/bench_backtest.py measures 1M records."""
    build(tmp_path / "short")
    write_long_journal(tmp_path / "long", 200_000)
    argv = [str(BIN / "ilab-journal"), "backtest", "--early-stopping",
            "metric=val_loss,patience=1..8", "--divergence", "metric=loss", "--json"]  # fmt: skip
    short = _peak_rss_mb(*argv, str(tmp_path / "short"))
    long = _peak_rss_mb(*argv, str(tmp_path / "long"))
    size = (tmp_path / "long" / "journal.jsonl").stat().st_size / 1e6
    assert long - short < size, f"{long:.0f} MB for {size:.0f} MB of journal, {short:.0f} MB short"


def test_retention_with_the_runs_own_settings_is_what_the_run_kept(tmp_path: Path) -> None:
    """Issue 52's run (keep_last_n=2, keep_best=acc:max; the evals behind the saves): the
    trainer removes 10 and 20 at its saves (step 30 kept as the best known then, 40 held
    by a lease at step 60), the watcher removes 30 and 40 after the end, when the late
    reports make 60 the best. The backtest said "keeps step-000030, step-000050,
    step-000060"; the run kept 50 and 60. Its status, stop source and best are the fold's."""
    from tests.test_run_fold import _late_eval_run

    run = tmp_path / "runs" / "b"
    run.mkdir(parents=True)
    _late_eval_run(run, tmp_path)
    code, out = backtest(str(run), "--json")
    assert code == 0, out
    got = json.loads(out)
    kept = got["retention"][0]
    assert kept["kept"] == sorted(os.listdir(run / "checkpoints")) == ["step-000050", "step-000060"]
    assert sorted(kept["removed"]) == [f"step-0000{s}0" for s in (1, 2, 3, 4)]
    assert (kept["best"], kept["held"]) == ("step-000060", [])
    assert (got["status"], got["stop_source"]) == ("completed", None)
    assert Path(got["best_checkpoint"]["checkpoint_path"]).name == "step-000060"
    code, out = backtest(str(run))
    assert "keep_last_n=2 keep_best=acc:max: keeps step-000050, step-000060; removes 4" in out


def test_a_refused_launch_leaves_nothing_and_backtest_skips_a_dir_without_a_journal(
    tmp_path: Path,
) -> None:
    """``ilab-train`` refusing a bad ``--notify`` leaves no run dir (was: one holding an
    empty ``run.lock``); ``backtest runs/*`` skips a dir without a journal in one line and
    judges the rest (was: exit 2 on it); a lone such dir is still one line, exit 2."""
    runs = tmp_path / "runs"
    with JournalWriter(runs / "done") as w:
        w.append("train_begin", begin_payload(4))
        w.append("step_end", step=4)
        w.append("train_end", {"status": "completed"}, step=4)
    refused = cli("ilab-train", "--demo", "--ckpt-dir", str(runs / "refused"), "--notify", "no://x")
    assert refused.returncode == 2 and "--notify #1" in refused.stderr, refused.stderr
    assert os.listdir(runs) == ["done"]
    (runs / "later").mkdir()  # a run not started yet
    judged = cli("ilab-journal", "backtest", str(runs / "done"), str(runs / "later"))
    assert judged.returncode == 0, judged.stderr
    assert judged.stderr.splitlines() == [
        f"ilab-journal backtest: skipped {runs / 'later'}: no journal.jsonl in this directory "
        "(not started yet?)"
    ]
    assert f"{runs / 'done' / 'journal.jsonl'}: completed at step 4" in judged.stdout
    alone = cli("ilab-journal", "backtest", str(runs / "later"))
    assert alone.returncode == 2 and len(alone.stderr.splitlines()) == 1, alone.stderr


@pytest.mark.parametrize(
    ("raised_s", "says"),
    [(4.0, "1 alarm(s), 0 false"), (None, "1 alarm(s), 1 false"), (-3.0, "1 alarm(s), 1 false")],
    ids=["alerted-in-the-gap", "no-alert", "alerted-before-the-gap"],
)
def test_a_hang_the_live_guard_alerted_is_found_and_counted_real(
    tmp_path: Path, raised_s: float | None, says: str
) -> None:
    """As ilab-train writes it: rank 0 holds a step's records back, and step 6 sat 20 s in
    its collective; at its boundary the trainer journals the guard's hang alert, which
    brings the step's records written after the hang with it. The backtest finds the gap
    (it looks before every record that brings progress), and counts it real when a hang
    alert of the attempt was raised during it; without one, or with one raised before it
    (another incident), it is a false alarm."""
    run = tmp_path / "run"
    t0 = time.time() - 1000.0
    with JournalWriter(run) as w:
        w.append("train_begin", BEGIN, ts=t0)
        t = t0
        for step in range(1, 11):
            w.append("step_begin", step=step, ts=t + 0.01, defer=True)
            t += 20.0 if step == 6 else 1.0
            w.append("after_optimizer_step", step=step, ts=t, defer=True)
            if step == 6 and raised_s is not None:  # raised_s after step 5's end
                alert = {"id": "a1", "kind": "hang", "message": "hang: no step progress",
                         "step": 5, "attempt": 1, "raised_at": t0 + 5.2 + raised_s}  # fmt: skip
                w.append("alert", alert, step=step, ts=t + 0.1)
            w.append("step_end", {"loss": 1.0}, step=step, ts=t + 0.2)
        w.append(
            "train_end", {"status": "completed", "reason": "reached step 10"}, step=10, ts=t + 1
        )
    code, out = backtest(str(run), "--hang-after", "3")
    assert code == 0 and says in out, out
    assert ("(alerted live)" in out) == (says.endswith("0 false")), out
