"""Control commands judged on the trainer's clock, and `ilab-journal control --wait`.

A command is fresh when its file arrives in ``control/`` after the training attempt began
(rank 0 lists ``control/`` once when it starts); one already there is stale, whatever its
``ts`` says: the writer's clock may be behind or ahead. The trainer's side runs in-process
here (the RunJournal and ControlPoller its rank 0 uses); tests/test_control.py runs it in
a real 2-rank run. ``--wait`` runs as a real subprocess against a real journal and lock.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from journal import JournalWriter, read_all
from journal.rundir.lock import JournalLock
from tests.helpers import BIN, cli, wait_for
from trainer.journaling.run_journal import RunJournal
from trainer.steering.policy import ABORT, SAVE, STOP


def drop_command(ckpt: Path, cid: str, command: str, ts: float) -> None:
    """A command file as ``send_command`` writes it, from a host whose clock reads ``ts``."""
    cdir = ckpt / "control"
    cdir.mkdir(mode=0o750, exist_ok=True)
    body = {"command": command, "id": cid, "source": "other-host:1", "reason": None, "ts": ts}
    (cdir / f".{cid}.tmp").write_text(json.dumps(body))
    os.rename(cdir / f".{cid}.tmp", cdir / f"{cid}.json")


def verdicts(ckpt: Path) -> dict[str, dict[str, Any]]:
    recs = read_all(ckpt / "journal.jsonl").records
    return {r["data"]["id"]: r["data"] for r in recs if r["event"] == "control"}


def test_staleness_is_judged_by_arrival_not_by_the_writers_clock(
    ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Left over from an earlier attempt: one from a clock ahead (its ts is in the future).
    drop_command(ckpt, "leftover", "abort", time.time())
    drop_command(ckpt, "ahead", "save", time.time() + 3600)
    j = RunJournal(ckpt, main=True, role="test")
    j.open(resume="never")
    try:
        # During the attempt, from a host whose clock is 2 minutes behind.
        drop_command(ckpt, "behind", "stop", time.time() - 120)
        with caplog.at_level(logging.INFO):
            mask = j.inbox.poll_control()
            j.inbox.journal_control()
    finally:
        j.close()
    assert mask == STOP and not mask & (ABORT | SAVE)
    got = verdicts(ckpt)
    assert got["behind"]["accepted"] is True
    for cid in ("leftover", "ahead"):
        assert got[cid]["accepted"] is False and got[cid]["reason"].startswith("stale"), got[cid]
    # Each rejection is one console line (rank 0's log), naming the command and why.
    lines = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(lines) == 2 and all("\n" not in line and "stale" in line for line in lines)
    assert any("leftover" in line and "abort" in line for line in lines)


def test_a_command_file_replaced_after_the_attempt_began_is_fresh(ckpt: Path) -> None:
    """Same name, new file (an id reused by a script): what counts is the file that arrived."""
    drop_command(ckpt, "nightly", "save", time.time())
    j = RunJournal(ckpt, main=True, role="test")
    j.open(resume="never")
    try:
        os.unlink(ckpt / "control" / "nightly.json")
        drop_command(ckpt, "nightly", "save", time.time() - 120)
        assert j.inbox.poll_control() == SAVE
        j.inbox.journal_control()
    finally:
        j.close()
    assert verdicts(ckpt)["nightly"]["accepted"] is True


# -- ilab-journal control --wait ----------------------------------------------------------------


def running_trainer(ckpt: Path) -> tuple[JournalLock, JournalWriter]:
    """What a running attempt looks like from outside: the journal lock held, a journal."""
    lock = JournalLock(ckpt, role="trainer")
    lock.acquire(timeout=5)
    w = JournalWriter(ckpt)
    w.append("train_begin", {"config": {}, "world_size": 2, "total_steps": 100})
    return lock, w


def wait_cli(ckpt: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(BIN / "ilab-journal"), "control", *args, str(ckpt), "--id", "c1", "--wait", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.parametrize(
    ("accepted", "code", "expected"),
    [(True, 0, "c1: stop applied at step 7"), (False, 1, "c1: stop rejected: stale: because")],
)
def test_wait_prints_the_verdict_and_exits_by_it(
    ckpt: Path, accepted: bool, code: int, expected: str
) -> None:
    lock, w = running_trainer(ckpt)
    try:
        proc = wait_cli(ckpt, "stop")
        wait_for(
            lambda: (ckpt / "control" / "c1.json").exists() or proc.poll() is not None,
            what="the command file",
        )
        w.append("step_end", step=7)
        w.append(
            "control",
            {
                "command": "stop",
                "id": "c1",
                "source": "x",
                "accepted": accepted,
                "reason": None if accepted else "stale: because",
                "applied_at_step": 7 if accepted else None,
            },
            step=7,
        )
        out, err = proc.communicate(timeout=60)
    finally:
        w.close()
        lock.release()
    assert proc.returncode == code, err
    assert out.splitlines() == [expected]


def test_wait_times_out_with_its_own_code(ckpt: Path) -> None:
    lock, w = running_trainer(ckpt)
    try:
        proc = cli("ilab-journal", "control", "save", str(ckpt), "--wait", "0.5")
    finally:
        w.close()
        lock.release()
    assert proc.returncode == 124, proc.stderr
    assert len(proc.stdout.splitlines()) == 1 and "no verdict within 0.5 s" in proc.stdout


def test_wait_with_no_trainer_running_says_so_at_once(ckpt: Path) -> None:
    # a run dir with no attempt yet: the command waits there, and --wait says so at once
    proc = cli("ilab-journal", "control", "stop", str(ckpt), "--wait", timeout=30)
    assert proc.returncode == 124, proc.stderr
    assert "no training attempt is running" in proc.stdout
    assert len(proc.stdout.splitlines()) == 1


def test_a_command_to_an_ended_run_is_refused(ckpt: Path) -> None:
    """A run that has ended (and nobody holds) reads no more commands: refused in one line,
    exit 1, no file left for ``status`` to count (it printed an id and exited 0)."""
    w = JournalWriter(ckpt)
    w.append("train_begin", {"config": {}, "world_size": 2, "total_steps": 100})
    w.append("train_end", {"status": "completed", "reason": None, "final_checkpoint": None})
    w.close()
    for wait in ((), ("--wait",)):
        proc = cli("ilab-journal", "control", "stop", str(ckpt), *wait, timeout=30)
        assert proc.returncode == 1 and proc.stdout == "", (proc.stdout, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert "the run has ended (completed at step 0)" in proc.stderr
    assert not (ckpt / "control").exists()
    assert (
        json.loads(cli("ilab-journal", "status", str(ckpt), "--json").stdout)["unapplied_commands"]
        == 0
    )


def test_an_id_already_used_is_refused(ckpt: Path) -> None:
    """A reused id would never be applied again (at most once per id): say so instead."""
    lock, w = running_trainer(ckpt)
    try:
        w.append(
            "control",
            {
                "command": "save",
                "id": "nightly",
                "source": "x",
                "accepted": True,
                "reason": None,
                "applied_at_step": 3,
            },
        )
        proc = cli("ilab-journal", "control", "save", str(ckpt), "--id", "nightly")
    finally:
        w.close()
        lock.release()
    assert proc.returncode == 2 and "nightly" in proc.stderr and "already" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (ckpt / "control" / "nightly.json").exists()
