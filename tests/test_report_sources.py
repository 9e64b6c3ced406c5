"""Issue 43, case 0: a report is never dropped for who sent it. A hook's source
(``watcher:<cursor>:<its command line>``) is cut where it is built and where a report file
is journaled, so a hook with a 2,000-character command line reports its metric and
``--keep-best`` keeps that checkpoint, in a replay and beside real 2-rank training; a report
refused for any other reason is said by the watcher that made it, and counted by ``status``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from journal import JournalWriter, read_all
from journal.channels.reports import ingest, pending
from journal.rundir.inbox import MAX_NAME_CHARS
from journal.rundir.lock import JournalLock
from tests.helpers import (
    BIN,
    begin_payload,
    cli,
    make_checkpoint,
    records,
    train_argv,
    train_env,
    wait_for,
)

#: The eval a save hook runs: accuracy 0.9 for the first checkpoint, less for later ones.
EVAL = textwrap.dedent(
    """
    import json, os
    step = int(os.environ["ILAB_STEP"])
    with open(os.environ["ILAB_REPORT"], "w") as f:
        json.dump({"accuracy": 0.9 if step == FIRST else 0.1}, f)
    """
)


def long_hook(tmp_path: Path, first: int) -> str:
    """``python eval.py --note xxxx...``: a command line of 2,000 characters."""
    script = tmp_path / "eval.py"
    script.write_text(EVAL.replace("FIRST", str(first)))
    head = f"{sys.executable} {script} --note "
    return head + "x" * (2000 - len(head))


def reports_of(ckpt: Path) -> list[dict[str, Any]]:
    return [r["data"] for r in records(ckpt) if r["event"] == "report"]


def refusals(ckpt: Path) -> list[dict[str, Any]]:
    return [
        r["data"]
        for r in records(ckpt)
        if r["event"] == "control" and r["data"]["accepted"] is False
    ]


def ended_run(ckpt: Path, saves: tuple[int, ...], keep_best: str = "accuracy:max") -> None:
    """A finished run that keeps the newest checkpoint and the best, with ``saves`` on disk
    (the older ones kept because a watcher held them when the run saved the next)."""
    with JournalWriter(ckpt, run_id="run43") as w:
        begin = begin_payload(max(saves))
        begin["config"] = {"keep_last_n": 1, "keep_best": keep_best}
        w.append("train_begin", begin)
        for step in saves:
            path = make_checkpoint(ckpt, step, "run43")
            w.append("save", {"checkpoint_path": str(path), "kind": ["full_state"]}, step=step)
        end = {"status": "completed", "reason": None, "final_checkpoint": str(path)}
        w.append("train_end", end, step=max(saves))


def test_a_hook_with_a_2000_character_command_line_reports_and_keeps_the_best_in_a_replay(
    tmp_path: Path,
) -> None:
    """Was: every report refused ("source must be a string of at most 256 characters"),
    the console said "ok -> 1 report(s)", and releasing the lease pruned step-000010, the
    only checkpoint that scored, as "not the best"."""
    ckpt = tmp_path / "run"
    ended_run(ckpt, (10, 20))
    hook = long_hook(tmp_path, first=10)
    proc = cli("ilab-watch", str(ckpt), "--replay", "--on-save", hook)
    assert proc.returncode == 0, proc.stderr
    got = reports_of(ckpt)
    assert [(r["step"], r["metrics"]["accuracy"]) for r in got] == [(10, 0.9), (20, 0.1)]
    for r in got:  # who reported: cut, saying so, never the reason to drop the metrics
        assert len(r["source"]) <= MAX_NAME_CHARS and r["source"].startswith("watcher:")
        assert "truncated" in r["source"]
    assert refusals(ckpt) == []
    best = str(ckpt / "checkpoints" / "step-000010")
    assert Path(best, "full_state").is_dir()  # kept as the best when the lease was released
    query = cli("ilab-journal", "query", str(ckpt), "--best", "accuracy:max")
    assert query.returncode == 0 and query.stdout.strip() == best


def test_a_report_file_with_an_over_long_source_is_journaled_with_the_source_cut(
    tmp_path: Path,
) -> None:
    """A report file written by an older watcher (or by hand) with a 2,000-character source:
    the trainer's ingest journals its metrics, the source cut to 256 characters."""
    ckpt = tmp_path / "run"
    ended_run(ckpt, (10,))
    (ckpt / "reports").mkdir(mode=0o750)
    report = {
        "id": "old-watcher",
        "checkpoint_path": str(ckpt / "checkpoints" / "step-000010"),
        "step": 10,
        "metrics": {"accuracy": 0.9},
        "source": "watcher:save-x:" + "y" * 2000,
        "delivery_id": "d" * 300,
        "reported_at": time.time(),
    }
    (ckpt / "reports" / "old-watcher.json").write_text(json.dumps(report))
    with JournalLock(ckpt, role="test").hold(timeout=5), JournalWriter(ckpt, join=True) as w:
        assert ingest(ckpt, w.append_at_last_position) == 1  # the trainer's own step
    assert pending(ckpt) == [] and not (ckpt / "reports" / "rejected").exists()
    (got,) = reports_of(ckpt)
    assert got["metrics"] == {"accuracy": 0.9}
    for key in ("source", "delivery_id"):  # cut, saying so
        assert len(got[key]) <= MAX_NAME_CHARS and "truncated" in got[key], got[key]
    assert got["source"].startswith("watcher:save-x:yyy")


def test_a_refused_report_is_said_by_the_watcher_that_made_it_and_counted_by_status(
    tmp_path: Path,
) -> None:
    """The trainer (here the test, holding the journal lock as rank 0 does) refuses a hook's
    report because its checkpoint was deleted before the next step boundary. The delivery
    itself was "ok"; the watcher then says the refusal in one line naming the hook and the
    reason, and ``status`` counts the refused report."""
    ckpt = tmp_path / "run"
    with JournalWriter(ckpt, run_id="run43") as w:
        w.append("train_begin", begin_payload(20))
    path = make_checkpoint(ckpt, 10, "run43")
    script = tmp_path / "eval.py"
    script.write_text(EVAL.replace("FIRST", "10"))
    trainer_lock = JournalLock(ckpt, role="trainer")
    trainer_lock.acquire(timeout=5)
    watch = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--on-save", f"{sys.executable} {script}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with JournalWriter(ckpt, join=True) as w:  # the trainer's save record
            w.append("save", {"checkpoint_path": str(path), "kind": ["full_state"]}, step=10)
        # the hook ran; its report waits in reports/ for the trainer's next step boundary
        wait_for(lambda: pending(ckpt), timeout=60, what="the hook's report file")
        shutil.rmtree(path)  # gone by the trainer's next step boundary
        with JournalWriter(ckpt, join=True) as w:
            assert ingest(ckpt, w.append_at_last_position) == 0
            end = {"status": "completed", "reason": None, "final_checkpoint": None}
            w.append("train_end", end, step=20)
    finally:
        trainer_lock.release()
    _, err = watch.communicate(timeout=60)
    assert watch.returncode == 0, err
    assert len(refusals(ckpt)) == 1
    lines = [line for line in err.splitlines() if "refused by the journal's writer" in line]
    assert len(lines) == 1, err
    assert "eval.py" in lines[0] and "save step 10" in lines[0]
    assert "no such checkpoint" in lines[0]
    status = json.loads(cli("ilab-journal", "status", str(ckpt), "--json").stdout)
    assert status["refused_reports"] == 1
    text = cli("ilab-journal", "status", str(ckpt)).stdout
    assert "1 report(s) refused when journaled" in text


@pytest.mark.extended
@pytest.mark.dist
def test_live_a_2000_character_hook_reports_and_the_trainer_keeps_the_best(
    tmp_path: Path,
) -> None:
    """Beside real 2-rank training with ``--keep-last-n 1 --keep-best accuracy:max``: rank 0
    journals the hook's report for step 5 at a step boundary (before ``train_end``), and its
    rotation keeps step-000005, the best, to the end of the run."""
    ckpt = tmp_path / "run"
    hook = long_hook(tmp_path, first=5)
    policy = ("--keep-last-n", "1", "--keep-best", "accuracy:max", "--max-leased-checkpoints", "1")
    argv = train_argv(ckpt, "--max-steps", "15", "--save-every", "5", *policy)
    trainer = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=train_env())
    watch = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--on-save", hook],
        stderr=subprocess.PIPE,
        text=True,
        env=train_env(),
    )
    _, train_err = trainer.communicate(timeout=300)
    assert trainer.returncode == 0, train_err[-3000:]
    _, watch_err = watch.communicate(timeout=120)
    assert watch.returncode == 0, watch_err
    recs = read_all(ckpt / "journal.jsonl").records
    events = [r["event"] for r in recs]
    first = next(i for i, r in enumerate(recs) if r["event"] == "report" and r["data"]["step"] == 5)
    assert first < events.index("train_end")  # journaled by the trainer, live
    assert refusals(ckpt) == [] and "refused" not in watch_err
    best = str(ckpt / "checkpoints" / "step-000005")
    end = recs[events.index("train_end")]["data"]
    assert end["best_checkpoint"]["checkpoint_path"] == best
    assert Path(best, "full_state").is_dir()
    removed = [r["data"]["checkpoint_path"] for r in recs if r["event"] == "checkpoint_removed"]
    assert best not in removed
