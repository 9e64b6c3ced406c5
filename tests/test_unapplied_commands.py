"""A control command that arrives after the run ended (issue 34): ``ilab-watch`` says so,
one line per command, and ``ilab-journal status`` counts them; nothing is journaled or
moved (a record after ``train_end`` would make the next attempt continue this run)."""

from __future__ import annotations

import json
from pathlib import Path

from journal import send_command
from journal.channels.control import unapplied_commands
from journal.write.writer import JournalWriter
from tests.helpers import cli, make_checkpoint, records


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


def test_commands_are_reported_when_late_reports_follow_train_end(tmp_path: Path) -> None:
    """A late eval's report (and a scheduler job's state) after ``train_end`` leaves the
    run ended: the commands that came after it are still said, by status and the watcher,
    and ``control --wait`` says at once that no attempt runs (issue 43)."""
    run = ended_run(tmp_path)
    run_id = records(run)[0]["run_id"]
    make_checkpoint(run, 5, run_id)
    # A real late report: an eval that outlived the run, journaled after train_end
    late = cli("ilab-journal", "report", str(run), "--checkpoint", "step-000005", "accuracy=0.9")
    assert late.returncode == 0, late.stderr
    send_command(run, "stop", reason="accuracy reached", command_id="late-1")
    assert [r["event"] for r in records(run)][-2:] == ["train_end", "report"]

    assert unapplied_commands(run)[0] == 5
    status = cli("ilab-journal", "status", str(run))
    assert status.returncode == 0, status.stderr
    assert "1 control command(s) arrived after the run ended: not applied" in status.stdout
    watch = cli("ilab-watch", str(run), "--replay", "--on-report", "true")
    assert watch.returncode == 0, watch.stderr
    assert "control stop (id late-1) arrived after the run ended at step 5" in watch.stderr

    # and ilab-journal control says at once that the run has ended, writing nothing
    wait = cli("ilab-journal", "control", "save", str(run), "--wait", "30", timeout=20)
    assert wait.returncode == 1 and "the run has ended" in wait.stderr, wait.stderr
    assert len(unapplied_commands(run)[1]) == 1


def test_a_command_id_is_one_printable_word(tmp_path: Path) -> None:
    """An id names a file and is printed in one line: a newline, a slash or a terminal
    escape in it is refused in one line (exit 2), nothing written."""
    run = ended_run(tmp_path)
    for bad in ("a\nb", "a/b", "\x1b[31mred", "-x", ".hidden", "x" * 201, "a b"):
        proc = cli("ilab-journal", "control", "stop", str(run), "--id", bad)
        assert proc.returncode == 2, (bad, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "invalid command id" in proc.stderr and "\x1b" not in proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (run / "control").exists() or not any((run / "control").iterdir())
    run.joinpath("journal.jsonl").unlink()  # no attempt yet: the command waits for one
    ok = cli("ilab-journal", "control", "stop", str(run), "--id", "eval-42_retry.1")
    assert ok.returncode == 0 and ok.stdout.strip() == "eval-42_retry.1", ok.stderr
