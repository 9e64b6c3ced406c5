"""A control command sent to a run that has ended is a refused verdict (issue 61): journaled
as rejected, nothing left in ``control/``, from ``send_command``, ``ilab-journal control``
and a callback's ``Control`` alike. A command file there all the same (dropped by hand or
by an older client, issue 34): ``ilab-watch`` says so, one line per command, and
``ilab-journal status`` counts them; nothing is journaled or moved for it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from journal import CommandRefused, Control, send_command
from journal.channels.control import unapplied_commands
from journal.write.writer import JournalWriter
from tests.helpers import cli, make_checkpoint, records


def ended_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    with JournalWriter(run) as w:
        w.append("train_begin", {"config": {}})
        w.append("log", {"loss": 1.0}, step=5)
        path = str(make_checkpoint(run, 5, w.run_id))
        w.append("save", {"checkpoint_path": path}, step=5)
        w.append("train_end", {"status": "completed", "reason": "reached step 5"}, step=5)
    return run


def drop(run: Path, cid: str, command: str) -> None:
    """A command file left as a hand or an older client leaves it, asking no verdict."""
    (run / "control").mkdir(mode=0o750, exist_ok=True)
    body = {"command": command, "id": cid, "source": "old-client:1", "reason": None, "ts": 0}
    (run / "control" / f"{cid}.json").write_text(json.dumps(body))


def test_a_command_sent_to_an_ended_run_is_a_refused_verdict(tmp_path: Path) -> None:
    """From ``send_command`` (an eval script, as the demo's, whose stop came after the
    end), ``ilab-journal control`` and a callback's ``Control`` (a real ``ilab-watch``):
    each journaled as rejected, nothing in ``control/``, so ``status`` counts no unapplied
    command and the demo's gate ``check -e 'unapplied_commands == 0'`` holds."""
    run = ended_run(tmp_path)
    why = "the run has ended (completed at step 5)"
    with pytest.raises(CommandRefused) as refused:
        send_command(run, Control.stop("accuracy reached"), source="eval:eval_accuracy.py")
    assert str(refused.value) == f"stop rejected: {why}"
    by_cli = cli("ilab-journal", "control", "stop", str(run), "--id", "from-cli")
    assert by_cli.returncode == 1
    assert by_cli.stderr.splitlines() == [f"Error: from-cli: stop rejected: {why}"]
    mod = tmp_path / "ours.py"
    mod.write_text(
        textwrap.dedent(
            """
            from journal import Control

            class StopOnSave:
                def on_save(self, event, **data):
                    return Control.stop("enough")
            """
        )
    )
    watch = cli("ilab-watch", str(run), "--replay", "--callback", f"{mod}:StopOnSave")
    assert watch.returncode == 0, watch.stderr
    assert f"ours.StopOnSave.on_save: stop rejected: {why}" in watch.stderr
    verdicts = [r["data"] for r in records(run) if r["event"] == "control"]
    assert [(v["id"], v["command"], v["accepted"], v["reason"]) for v in verdicts[:2]] == [
        (refused.value.command_id, "stop", False, why),
        ("from-cli", "stop", False, why),
    ]
    assert verdicts[0]["source"] == "eval:eval_accuracy.py" and len(verdicts) == 3
    assert verdicts[2]["source"].endswith("ours.StopOnSave.on_save")
    assert not list((run / "control").glob("*.json"))
    status = json.loads(cli("ilab-journal", "status", str(run), "--json").stdout)
    assert (status["state"], status["unapplied_commands"]) == ("completed", 0)
    gate = cli("ilab-journal", "check", str(run), "-e", "unapplied_commands == 0")
    assert gate.returncode == 0, gate.stdout + gate.stderr


def test_commands_after_train_end_are_reported_by_the_watcher_and_status(tmp_path: Path) -> None:
    run = ended_run(tmp_path)
    assert unapplied_commands(run) == (5, [])
    assert "arrived after" not in cli("ilab-journal", "status", str(run)).stdout
    drop(run, "late-1", "stop")
    drop(run, "late-2", "save")
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
    drop(run, "c1", "stop")
    with JournalWriter(run, resume=True) as w:  # a resumed attempt reads control/ itself
        w.append("train_begin", {"config": {}})
    assert unapplied_commands(run) == (None, [])
    assert "arrived after" not in cli("ilab-journal", "status", str(run)).stdout


def test_commands_are_reported_when_late_reports_follow_train_end(tmp_path: Path) -> None:
    """A late eval's report (and a scheduler job's state) after ``train_end`` leaves the
    run ended: the commands that came after it are still said, by status and the watcher,
    and ``control --wait`` says at once that no attempt runs (issue 43)."""
    run = ended_run(tmp_path)
    # A real late report: an eval that outlived the run, journaled after train_end
    late = cli("ilab-journal", "report", str(run), "--checkpoint", "step-000005", "accuracy=0.9")
    assert late.returncode == 0, late.stderr
    drop(run, "late-1", "stop")
    assert [r["event"] for r in records(run)][-2:] == ["train_end", "report"]

    assert unapplied_commands(run)[0] == 5
    status = cli("ilab-journal", "status", str(run))
    assert status.returncode == 0, status.stderr
    assert "1 control command(s) arrived after the run ended: not applied" in status.stdout
    watch = cli("ilab-watch", str(run), "--replay", "--on-report", "true")
    assert watch.returncode == 0, watch.stderr
    assert "control stop (id late-1) arrived after the run ended at step 5" in watch.stderr

    # and ilab-journal control says at once that the run has ended, journaling so
    wait = cli("ilab-journal", "control", "save", str(run), "--wait", "30", timeout=20)
    assert wait.returncode == 1 and "the run has ended" in wait.stderr, wait.stderr
    assert records(run)[-1]["data"]["accepted"] is False
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
