"""A run that died (issue 58): no ``train_end``, and nothing left to write one. Its writer is
a real process that holds the journal lock and appends as rank 0 does, killed with
``kill -9`` by the test: ``tail -f`` returns saying so in one line, and a control command is
refused (the CLI: one line, exit 1; the page: 409), nothing left in ``control/``. While the
writer lives, both go on as before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import orjson
import pytest

from tests.helpers import BIN, cli, wait_for

WRITER = textwrap.dedent(
    """
    import sys, time
    from journal.store import open_attempt
    from tests.helpers import begin_payload, log_payload

    w = open_attempt(sys.argv[1], "never", "trainer", wait=5).writer  # as rank 0 opens it
    w.append("train_begin", begin_payload(100))
    for step in (1, 2, 3):
        w.append("log", log_payload(step), step=step)
        w.append("step_end", step=step)
    print("ready", flush=True)
    time.sleep(600)
    """
)


def live_writer(run: Path) -> subprocess.Popen[str]:
    """A process writing ``run``'s journal, holding its lock, at step 3 when this returns."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(run)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_tail_follow_returns_once_the_run_is_known_dead(tmp_path: Path) -> None:
    run = tmp_path / "run"
    writer = live_writer(run)
    tail = subprocess.Popen(
        [str(BIN / "ilab-journal"), "tail", "-f", str(run), "--json", "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    printed: list[dict[str, object]] = []

    def read() -> None:
        assert tail.stdout is not None
        printed.extend(json.loads(line) for line in tail.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: any(r["event"] == "step_end" for r in printed), 30, "tail's records")
        with pytest.raises(subprocess.TimeoutExpired):  # alive: it asked and follows on
            tail.wait(timeout=2.5)
        kill(writer)
        assert tail.wait(timeout=30) == 6  # status's exit code of a stale run
    finally:
        for p in (writer, tail):
            p.kill()
    reader.join(timeout=10)
    assert tail.stderr is not None
    err = tail.stderr.read()
    assert err.splitlines() == [
        f"{run}: the run died at step 3: no train_end, and nothing holds it to write one"
    ]
    assert [r["step"] for r in printed if r["event"] == "step_end"] == [1, 2, 3]


def test_a_command_to_a_run_that_died_is_refused_by_the_cli_and_the_page(tmp_path: Path) -> None:
    pytest.importorskip("starlette", reason="the serve extra is not installed")
    from starlette.testclient import TestClient

    from journal.serve.app import ServeConfig, build_app
    from journal.serve.runs import RunSet

    run = tmp_path / "run"
    writer = live_writer(run)
    app = build_app(ServeConfig(RunSet([("run", run, False)]), True, "t"))
    page = TestClient(app, base_url="http://127.0.0.1:8420")
    headers = {"content-type": "application/json", "x-ilab-token": "t"}

    def press(command: str) -> tuple[int, dict[str, str]]:
        body = orjson.dumps({"command": command})
        got = page.post("/api/runs/run/control", content=body, headers=headers)
        return got.status_code, got.json()

    try:  # while it lives, its commands are taken as ever
        sent = cli("ilab-journal", "control", "save", str(run), "--id", "while-alive")
        assert sent.returncode == 0 and sent.stdout.strip() == "while-alive", sent.stderr
        assert press("evaluate")[0] == 200
        for f in (run / "control").glob("*.json"):
            f.unlink()
    finally:
        kill(writer)
    journal = (run / "journal.jsonl").read_bytes()
    refused = cli("ilab-journal", "control", "stop", str(run))
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.splitlines() == [
        f"Error: {run}: stop refused: the run died at step 3 (no train_end, and nothing holds its "
        "dir): no trainer reads commands"
    ]
    code, body = press("stop")
    assert code == 409 and body["error"].startswith("stop refused: the run died at step 3")
    assert list((run / "control").glob("*.json")) == []
    assert (run / "journal.jsonl").read_bytes() == journal  # a dead attempt's journal as it died
