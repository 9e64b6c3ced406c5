"""Replay in batches (issue 35): a ``kill -9`` in the middle of a replay, then a restart,
delivers every record at least once and repeats at most one batch; a callable's plain
successes share one results line per batch; an exporter writes once per batch."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers import BIN, wait_for, write_log_journal
from watcher.engine.queues import TAKE_MAX

#: ``on_log`` counts each call of a seq in a memory-mapped file (one byte per seq), which
#: survives a ``kill -9``; with HOLD_AT set it stops at that seq until it is killed.
MARK_CALLBACK = """\
import mmap, os, time

class Mark:
    def __init__(self):
        fd = os.open({marks!r}, os.O_RDWR)
        self.marks = mmap.mmap(fd, 0)
        self.hold_at = int(os.environ.get("HOLD_AT", "-1"))

    def on_log(self, event, **data):
        self.marks[event.seq] += 1
        while event.seq == self.hold_at:  # held here until the test kills the watcher
            time.sleep(0.05)
"""


def _replay(ckpt: Path, cb: Path, **env: str) -> subprocess.Popen[bytes]:
    argv = [str(BIN / "ilab-watch"), str(ckpt), "--callback", f"{cb}:Mark"]
    argv += ["--queue", "log=all", "--replay", "-q", "--name", "marks"]
    return subprocess.Popen(
        argv,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _kill_mid_replay_and_restart(tmp_path: Path, n: int) -> None:
    ckpt = tmp_path / "run"
    write_log_journal(ckpt, n, run_id="kill")
    marks = tmp_path / "marks"
    marks.write_bytes(bytes(n + 2))  # seq 0 is train_begin, 1..n the logs
    cb = tmp_path / "cb.py"
    cb.write_text(MARK_CALLBACK.format(marks=str(marks)))
    hold = n * 2 // 3
    first = _replay(ckpt, cb, HOLD_AT=str(hold))
    try:
        wait_for(lambda: marks.read_bytes()[hold] == 1 or first.poll() is not None, 600, "seq")
        assert first.poll() is None, first.stderr.read() if first.stderr else ""
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
    again = _replay(ckpt, cb)
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, err.decode()
    counts = marks.read_bytes()[1 : n + 1]
    assert min(counts) >= 1  # every record delivered at least once
    twice = sum(1 for c in counts if c > 1)
    assert max(counts) <= 2 and twice <= TAKE_MAX  # at most one batch twice
    assert twice >= 1  # the held record was called before the kill and again after it


def test_kill_9_mid_replay_repeats_at_most_one_batch(tmp_path: Path) -> None:
    _kill_mid_replay_and_restart(tmp_path, 30_000)


@pytest.mark.extended
def test_kill_9_mid_replay_of_a_million_records(tmp_path: Path) -> None:
    _kill_mid_replay_and_restart(tmp_path, 1_000_000)


def test_plain_successes_share_a_results_line_per_batch(tmp_path: Path) -> None:
    """10,000 logs to a callable that returns nothing: the results file holds a handful of
    lines whose counts add up to every delivery, each naming its first and last seq."""
    ckpt = tmp_path / "run"
    n = 10_000
    write_log_journal(ckpt, n, run_id="lines")
    cb = tmp_path / "cb.py"
    cb.write_text("class Quiet:\n    def on_log(self, event, **data):\n        pass\n")
    argv = [str(BIN / "ilab-watch"), str(ckpt), "--callback", f"{cb}:Quiet"]
    out = subprocess.run(
        [*argv, "--queue", "log=all", "--replay", "--name", "q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert f"done: {n} ok, 0 failed" in out.stderr
    lines = [json.loads(x) for x in (ckpt / "watch" / "q.results.jsonl").read_text().splitlines()]
    assert sum(r["count"] for r in lines) == n
    assert len(lines) <= 2 * n // TAKE_MAX + 4  # per batch, not per delivery
    seqs = sorted((r["seq"], r["last_seq"] or r["seq"]) for r in lines)
    assert seqs[0][0] == 1 and seqs[-1][1] == n
    assert all(a[1] < b[0] for a, b in itertools.pairwise(seqs))  # no overlap
    assert all(r["status"] == "ok" and r["kind"] == "callable" for r in lines)
