"""The store as the one door: its tail answers the end of a run by one rule, and
``open_attempt`` decides an attempt's run from one read of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from journal.rundir.lock import JournalLock, JournalLocked
from journal.store import guest, open_attempt, tail
from tests.helpers import write_run


def test_tail_sees_the_end_past_records_others_append_after_it(tmp_path: Path) -> None:
    """A late report and a watcher's alert after ``train_end`` do not make the run a
    running one; a resumed attempt's ``train_begin`` does."""
    write_run(tmp_path, steps=2, save_every=0)
    with guest(tmp_path, role="test") as w:
        w.append("report", {"metrics": {"acc": 0.5}, "checkpoint_path": None})
        w.append("alert", {"kind": "completed", "message": "done"})
    end = tail(tmp_path)
    assert end.ended and end.trainer is not None and end.trainer["event"] == "train_end"
    assert end.last is not None and end.last["event"] == "alert"
    assert end.run_id == end.trainer["run_id"]
    write_run(tmp_path, steps=1, save_every=0, end=None, resume=True)
    assert not tail(tmp_path).ended
    assert not tail(tmp_path / "missing").ended and tail(tmp_path / "missing").last is None


def test_open_attempt_continues_the_run_and_knows_its_answered_commands(tmp_path: Path) -> None:
    """A killed run (no ``train_end``) goes on with its next attempt under the lock, and the
    attempt learns the command ids the journal answered; ``never`` starts a new run."""
    write_run(tmp_path, steps=2, save_every=0, end=None)
    run_id = tail(tmp_path).run_id
    with guest(tmp_path, role="test") as w:
        w.append("control", {"command": "stop", "id": "c1", "source": "t", "accepted": True})
    attempt = open_attempt(tmp_path, "auto", "trainer")
    try:
        assert attempt.writer is not None and attempt.run_id == run_id
        assert attempt.writer.attempt == 2 and attempt.commands_seen == {"c1"}
        assert attempt.resume_from is None  # no checkpoint on disk
        with pytest.raises(JournalLocked):
            JournalLock(tmp_path, role="other").acquire(timeout=0)
    finally:
        attempt.writer.close()
        attempt.lock.release()
    fresh = open_attempt(tmp_path, "never", "trainer", records=False)
    fresh.lock.release()
    assert fresh.writer is None and fresh.run_id != run_id and not fresh.commands_seen
