"""``ilab-journal tail -f`` across log rotation (mv, copytruncate), a real tail process
against a journal written by the real writer in this process, and what ``status`` says
of a failure whose error text is a whole traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from journal import JournalWriter
from tests.helpers import BIN, cli, log_payload, wait_for

_TAIL_OPTS = ("-n", "1000", "--interval", "0.02")  # every record from the start


class Tail:
    """``ilab-journal tail -f --json`` in a subprocess; the seqs it printed, as they come."""

    def __init__(self, ckpt: Path) -> None:
        self.proc = subprocess.Popen(
            [str(BIN / "ilab-journal"), "tail", "-f", str(ckpt), "--json", *_TAIL_OPTS],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.seqs: list[int] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.seqs.append(json.loads(line)["seq"])

    def printed(self, seq: int) -> None:
        wait_for(lambda: seq in self.seqs, timeout=30, what=f"tail to print seq {seq}")

    def finish(self) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=30)  # it ends by itself at train_end
        finally:
            self.proc.kill()
        self._reader.join(timeout=10)
        assert self.proc.stderr is not None
        return rc, self.proc.stderr.read()


def _logs(w: JournalWriter, first: int, last: int, *, defer: bool = False) -> None:
    for s in range(first, last + 1):
        w.append("log", log_payload(s), step=s, defer=defer)


def _save(w: JournalWriter, ckpt: Path, step: int) -> None:
    path = str(ckpt / f"checkpoints/step-{step:06d}")
    w.append("save", {"checkpoint_path": path, "kind": ["full_state"], "duration": 0.1}, step=step)


@pytest.mark.parametrize(
    ("rotation", "paused"),
    [
        ("mv", True),  # tail sees the rotation only after everything below was written
        ("mv", False),  # tail sees whatever moment it happens to look at
        ("copytruncate", True),  # the new file stays shorter than where tail was: the hang
        ("copytruncate-regrown", True),  # ... or grows past it before tail looks again
        ("copytruncate", False),
    ],
)
def test_tail_follows_a_rotated_journal_printing_every_seq_once(
    ckpt: Path, rotation: str, paused: bool
) -> None:
    journal = ckpt / "journal.jsonl"
    w = JournalWriter(ckpt)
    w.append("train_begin", {"total_steps": 300})
    _logs(w, 1, 40)
    tail = Tail(ckpt)
    try:
        tail.printed(w.seq - 1)
        if paused:
            tail.proc.send_signal(signal.SIGSTOP)
        _logs(w, 41, 60)  # written before the rotation; tail has not read them (when paused)
        if rotation == "mv":
            os.rename(journal, ckpt / "journal.jsonl.1")
            _logs(w, 61, 65, defer=True)
            w.flush()  # into the moved file: the writer has not looked at its path yet
            _save(w, ckpt, 65)  # a durable record: the writer notices, opens a new journal
            _logs(w, 66, 70)
        else:
            shutil.copyfile(journal, ckpt / "journal.jsonl.1")
            os.truncate(journal, 0)  # the writer appends (O_APPEND) at the new end
            _save(w, ckpt, 60)
            _logs(w, 61, 200 if rotation == "copytruncate-regrown" else 62)
        w.append("train_end", {"status": "completed", "final_checkpoint": None}, step=70)
        w.close()
        if paused:
            tail.proc.send_signal(signal.SIGCONT)
        rc, err = tail.finish()
    finally:
        tail.proc.kill()
    assert rc == 0, err  # the state it followed to: completed
    assert tail.seqs == list(range(w.seq)), err  # every record once, none skipped
    assert "Traceback" not in err


#: What a full disk during a checkpoint save leaves in ``train_end``: torch's
#: CheckpointException carries every rank's traceback in its message (~3 KB).
_RANK_TRACEBACK = """Traceback (most recent call last): (RANK {rank})
  File "/venv/lib/python3.11/site-packages/torch/distributed/checkpoint/utils.py", line 193, in reduce_scatter
    local_data = map_fun()
                 ^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/checkpoint/filesystem.py", line 661, in write_data
    _write_files_from_queue(
  File "/venv/lib/python3.11/site-packages/torch/distributed/checkpoint/filesystem.py", line 384, in _write_files_from_queue
    stream.write(data)
OSError: [Errno 28] No space left on device
"""
_CKPT_ERROR = (
    "CheckpointException ranks:dict_keys([0, 1])\n"
    + "\n".join(_RANK_TRACEBACK.format(rank=r) for r in (0, 1)) * 4
)


def test_status_shows_a_traceback_error_as_one_line_and_show_keeps_it_all(ckpt: Path) -> None:
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"total_steps": 10})
        _logs(w, 1, 3)
        w.append(
            "train_end",
            {
                "status": "failed",
                "reason": "CheckpointException: CheckpointException ranks:dict_keys([0, 1])",
                "final_checkpoint": None,
                "error_type": "CheckpointException",
                "error_message": _CKPT_ERROR,
            },
            step=3,
        )
    proc = cli("ilab-journal", "status", str(ckpt))
    assert proc.returncode == 1, proc.stderr
    (row,) = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("error ")]
    assert len(row) < 300, row  # the meaningful lines, not the traceback
    assert "CheckpointException ranks:dict_keys([0, 1])" in row
    assert "No space left on device" in row and "File " not in row and "\\x0a" not in row
    assert "ilab-journal show" in row  # where the whole text is
    shown = cli("ilab-journal", "show", str(ckpt), "-e", "train_end", "--json")
    assert json.loads(shown.stdout)["data"]["error_message"] == _CKPT_ERROR


def test_status_of_a_journal_truncated_in_place_mid_run_is_running(ckpt: Path) -> None:
    journal = ckpt / "journal.jsonl"
    w = JournalWriter(ckpt)
    w.append("train_begin", {"total_steps": 300})
    _logs(w, 1, 40)
    shutil.copyfile(journal, ckpt / "journal.jsonl.1")
    os.truncate(journal, 0)  # copytruncate: what is left has no train_begin
    _logs(w, 41, 42)
    _save(w, ckpt, 42)
    w.close()
    proc = cli("ilab-journal", "status", str(ckpt), "--json")
    assert proc.returncode == 3, proc.stdout  # running, not "empty": it holds records
    js = json.loads(proc.stdout)
    assert js["state"] == "running" and js["last_step"] == 42
