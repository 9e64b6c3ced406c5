"""ilab-watch under a burst of signals (issue "Hardening 4", item 1): every SIGTERM or
SIGINT asks for the same graceful stop, however many arrive at once. A handler that took a
lock (``threading.Event.set``) deadlocked when a second signal ran it inside the first."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import BIN, wait_for, write_run

BURST = 300
TRIALS = 5
#: Between two kills: about the time the old handler took, so that signals land inside it
#: (back to back, most of the 300 coalesce before the watcher's main thread runs).
GAP_S = 2e-6


def _burst_stops(argv: list[str], ready: str, tmp_path: Path) -> None:
    """Start ``argv`` (its stderr to a file), wait for its ``ready`` line, send it BURST
    SIGTERMs in a tight loop: it must exit 130 (interrupted) within a deadline."""
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as f:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=f,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    try:
        started = wait_for(lambda: ready in err.read_text() or proc.poll() is not None, 60, ready)
        assert started and proc.poll() is None, err.read_text()
        for _ in range(BURST):
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                break  # it already stopped (only after the first ones: fine)
            sent = time.perf_counter()
            while time.perf_counter() - sent < GAP_S:
                pass  # a busy wait: a sleep would take far longer than GAP_S
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{argv[1:]} hung after {BURST} SIGTERMs; stderr:\n{err.read_text()}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.read_text()
    assert code == 130, text
    assert "Traceback" not in text, text


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_burst_of_sigterms_stops_the_watcher_once(ckpt: Path, tmp_path: Path, trial: int) -> None:
    write_run(ckpt, steps=4, save_every=0, end=None)  # no train_end: it follows until stopped
    argv = [str(BIN / "ilab-watch"), str(ckpt), "--on-evaluate", "true"]
    argv += ["--state-dir", str(tmp_path / "state")]
    _burst_stops(argv, "hook(s) on", tmp_path)


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_burst_of_sigterms_stops_the_mirror_once(ckpt: Path, tmp_path: Path, trial: int) -> None:
    write_run(ckpt, steps=4, save_every=0, end=None)
    uri = f"file://{tmp_path}/store/run"
    argv = [str(BIN / "ilab-watch"), str(ckpt), "--mirror", uri]
    _burst_stops(argv, "mirroring", tmp_path)
