"""A control command that arrives after the run ended (issue 34): ``ilab-watch`` says so,
one line per command, and ``ilab-journal status`` counts them; nothing is journaled or
moved (a record after ``train_end`` would make the next attempt continue this run)."""

from __future__ import annotations

import json
from pathlib import Path

from journal import send_command
from journal.control import unapplied_commands
from journal.writer import JournalWriter
from tests.helpers import cli, records


def ended_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    with JournalWriter(run) as w:
        w.append("train_begin", {"config": {}})
        w.append("log", {"loss": 1.0}, step=5)
        w.append("train_end", {"status": "completed", "reason": "reached step 5"}, step=5)
    return run


def test_commands_after_train_end_are_reported_by_the_watcher_and_status(tmp_path: Path) -> None:
    run = ended_run(tmp_path)
    assert unapplied_commands(run) == (5, [])
    assert "arrived after" not in cli("ilab-journal", "status", str(run)).stdout
    send_command(run, "stop", reason="accuracy reached", command_id="late-1")
    send_command(run, "save", command_id="late-2")
    before = (run / "journal.jsonl").read_bytes()

    status = cli("ilab-journal", "status", str(run))
    assert status.returncode == 0, status.stderr
    assert "2 control command(s) arrived after the run ended: not applied" in status.stdout
    as_json = json.loads(cli("ilab-journal", "status", str(run), "--json").stdout)
    assert as_json["unapplied_commands"] == 2

    watch = cli("ilab-watch", str(run), "--replay", "--on-save", "true")
    assert watch.returncode == 0, watch.stderr
    assert "control stop (id late-1) arrived after the run ended at step 5: not applied" in (
        watch.stderr
    )
    assert "control save (id late-2) arrived after the run ended at step 5: not applied" in (
        watch.stderr
    )
    # read only: the journal is the trainer's, the files stay for the next attempt to reject
    assert (run / "journal.jsonl").read_bytes() == before
    assert [r["event"] for r in records(run)][-1] == "train_end"
    assert sorted(p.name for p in (run / "control").glob("*.json")) == [
        "late-1.json",
        "late-2.json",
    ]


def test_a_running_or_resumed_run_has_none(tmp_path: Path) -> None:
    run = ended_run(tmp_path)
    send_command(run, "stop", command_id="c1")
    with JournalWriter(run, resume=True) as w:  # a resumed attempt reads control/ itself
        w.append("train_begin", {"config": {}})
    assert unapplied_commands(run) == (None, [])
    assert "arrived after" not in cli("ilab-journal", "status", str(run)).stdout
