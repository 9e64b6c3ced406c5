"""A journal deleted during a run (issue 18, item 12): the writer notices, says so in one
line, and starts a new journal whose first record (a ``journal_gap``) says what was lost;
the run then ends normally and every reader works on the new file."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from journal import JournalWriter, read_all
from journal.views.validate import validate_journal
from tests.helpers import cli, records, train_argv, train_env, wait_for, write_run


def _save(w: JournalWriter, step: int) -> None:
    """A durable record: the writer checks its path before every one."""
    data = {"checkpoint_path": f"ck/step-{step:06d}", "kind": ["full_state"], "duration": 0.1}
    w.append("save", data, step=step)


def test_a_deleted_journal_is_started_again_with_a_record_of_the_loss(
    ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = JournalWriter(ckpt)
    for s in range(5):
        w.append("step_end", {"loss": 1.0}, step=s)
    (ckpt / "journal.jsonl").unlink()
    with caplog.at_level(logging.WARNING, logger="journal.write.writer"):
        _save(w, 5)
        w.append("step_end", {"loss": 1.0}, step=5)
    w.close()
    recs = read_all(ckpt / "journal.jsonl").records
    assert [r["event"] for r in recs] == ["journal_gap", "save", "step_end"]
    gap = recs[0]
    assert gap["seq"] == 5 and gap["step"] == 5 and gap["run_id"] == w.run_id
    assert gap["data"] == {
        "dropped": 5,
        "first_seq": 0,
        "last_seq": 4,
        "error": "journal.jsonl was deleted while the run was writing it",
        "cause": "journal_deleted",
    }
    assert [r["seq"] for r in recs] == [5, 6, 7]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "was deleted while this run was writing it" in warnings[0]
    assert "seq 0..4 went with the old file" in warnings[0]
    assert validate_journal(ckpt / "journal.jsonl").problems == []


def test_deleted_twice_names_only_what_the_second_file_held(ckpt: Path) -> None:
    w = JournalWriter(ckpt)
    _save(w, 1)  # seq 0
    (ckpt / "journal.jsonl").unlink()
    _save(w, 2)  # gap (seq 1, lost 0..0), save seq 2
    (ckpt / "journal.jsonl").unlink()
    _save(w, 3)  # gap (seq 3, lost 1..2), save seq 4
    w.close()
    gap = read_all(ckpt / "journal.jsonl").records[0]
    assert (gap["seq"], gap["data"]["first_seq"], gap["data"]["last_seq"]) == (3, 1, 2)


def test_a_deleted_run_dir_is_made_again(ckpt: Path) -> None:
    w = JournalWriter(ckpt)
    _save(w, 1)
    shutil.rmtree(ckpt)
    _save(w, 2)
    w.close()
    assert [r["event"] for r in read_all(ckpt / "journal.jsonl").records] == ["journal_gap", "save"]


def test_a_replaced_journal_is_written_on_after_its_records(ckpt: Path, tmp_path: Path) -> None:
    """A journal put back (say, from a backup) is appended to, seq going on above both."""
    w = JournalWriter(ckpt)
    _save(w, 1)
    backup = tmp_path / "backup"
    write_run(backup, steps=10)  # seqs up to ~30: above ours
    top = read_all(backup / "journal.jsonl").records[-1]["seq"]
    os.replace(backup / "journal.jsonl", ckpt / "journal.jsonl")
    _save(w, 2)
    w.close()
    recs = read_all(ckpt / "journal.jsonl").records
    gap, save = recs[-2:]
    assert gap["event"] == "journal_gap" and gap["data"]["cause"] == "journal_replaced"
    assert (gap["seq"], save["seq"]) == (top + 1, top + 2)


def test_a_symlink_put_in_its_place_is_not_followed(
    ckpt: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"secret\n")
    w = JournalWriter(ckpt)
    _save(w, 1)
    (ckpt / "journal.jsonl").unlink()
    (ckpt / "journal.jsonl").symlink_to(victim)
    with caplog.at_level(logging.WARNING, logger="journal.write.writer"):
        _save(w, 2)
        _save(w, 3)
    w.close()
    assert victim.read_bytes() == b"secret\n"
    [warning] = [r.getMessage() for r in caplog.records]  # once, not per record
    assert "cannot be started again" in warning and "symbolic link" in warning


@pytest.mark.extended
@pytest.mark.dist
def test_deleting_the_journal_during_a_run_loses_no_ending(tmp_path: Path) -> None:
    """A real 2-rank run whose journal is deleted mid-run: the new journal starts with the
    gap record, the run ends completed (not "failed" with one launcher record), and status
    and validate read it."""
    run = tmp_path / "run"
    job = subprocess.Popen(
        train_argv(run, "--max-steps", "30", "--log-every", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=train_env(step_delay=0.2),
    )
    try:
        wait_for(
            lambda: any(r["event"] == "step_end" and r["step"] >= 3 for r in records(run)),
            what="step 3",
        )
        (run / "journal.jsonl").unlink()
        _, err = job.communicate(timeout=240)
    finally:
        job.kill()
    assert job.returncode == 0, err[-2000:]
    recs = records(run)
    gap, end = recs[0], recs[-1]
    assert gap["event"] == "journal_gap" and gap["data"]["cause"] == "journal_deleted"
    assert gap["data"]["first_seq"] == 0 and gap["data"]["last_seq"] == gap["seq"] - 1
    assert end["event"] == "train_end" and end["data"]["status"] == "completed"
    assert end["step"] == 30 and end["run_id"] == gap["run_id"]
    log = (run / "logs" / "rank-0.log").read_text()
    assert log.count("was deleted while this run was writing it") == 1
    assert cli("ilab-journal", "status", str(run)).returncode == 0
    proc = cli("ilab-journal", "validate", str(run))
    assert proc.returncode == 0, proc.stdout + proc.stderr
