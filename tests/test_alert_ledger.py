"""The alert ledger (issue 59: 1, 2, 3 and 7; docs/alerts.md): alerts page once per incident
however many guards watch a run, a hang is shown while it lasts (the trainer that would
journal its alert is the process that is stuck), a hang that clears is told as recovered
and a later one pages again, and the guards' own health is visible. Real processes: real
``ilab-watch`` and ``ilab-train`` processes, a real HTTP receiver on 127.0.0.1, ranks
stopped and continued with ``kill -STOP``/``-CONT``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from journal.rundir.ledger import beat
from journal.store import guest
from tests.helpers import (
    BIN,
    cli,
    kill_tree,
    records,
    train_argv,
    train_env,
    wait_for,
    write_run,
)
from tests.receiver import Receiver
from tests.test_alerts_notify import needs_apprise
from tests.test_guard import _as_rank, _quiet_run, _sleeps
from watcher.alerts.guard import Guard, GuardOptions
from watcher.alerts.hang import HangRule
from watcher.alerts.processes import this_host
from watcher.alerts.rules import DEFAULT_KINDS
from watcher.alerts.sink import AlertDispatcher

#: A long demo run: it is stopped long before its end.
LONG = ("--num-epochs", "50", "--max-steps", "3000")


def _watch(run: Path, *args: str, wait: bool = True) -> tuple[subprocess.Popen[str], list[str]]:
    """``ilab-watch RUN ARGS...`` started (``wait``: once it follows); its stderr lines as
    they come."""
    proc = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(run), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines: list[str] = []
    threading.Thread(
        target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True
    ).start()  # type: ignore[union-attr]
    if wait:
        wait_for(lambda: any("hook(s) on" in x for x in lines), timeout=60, what="the watcher")
    return proc, lines


def _status(run: Path) -> tuple[int, dict[str, Any]]:
    proc = cli("ilab-journal", "status", str(run), "--json")
    return proc.returncode, json.loads(proc.stdout)


def _alerts(run: Path) -> list[dict[str, Any]]:
    return [r["data"] for r in records(run) if r["event"] == "alert"]


def _posts(got: Receiver, kind: str) -> list[dict[str, Any]]:
    """The messages the receiver got about alerts of ``kind`` (their title names it)."""
    return [b for b in got.bodies if b["title"].startswith(f"[ilab] {kind}: ")]


def _steps(run: Path) -> int:
    return max((r["step"] for r in records(run) if r["event"] == "step_end"), default=0)


def _ranks(run: Path) -> dict[int, int]:
    begin = wait_for(
        lambda: next((r for r in records(run) if r["event"] == "train_begin"), None),
        timeout=240,
        what="train_begin",
    )
    return {r["rank"]: r["pid"] for r in begin["data"]["ranks"]}


@needs_apprise
def test_a_hang_two_guards_see_pages_once_shows_while_it_lasts_and_its_recovery_is_told(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Two ilab-watch --hang-after 3 --notify beside a run whose writer holds its journal,
    as a stuck trainer does, and whose rank (a real process) is stopped with SIGSTOP: one
    hang message; while it lasts status says hung (exit 8) with the alert the journal has
    not got, check judges it, tail -f says it and the page marks the run hung, with both
    guards. A step: one recovered message, status
    running again with one alert (the page: the same). The run fails: one failed message. Each journaled once."""
    [rank] = _sleeps(1)
    run = tmp_path / "run"
    who = {"ranks": [_as_rank(0, rank.pid)], "hostname": this_host(), "pid": rank.pid}
    writer = _quiet_run(run, who, quiet_s=0.0)
    os.kill(rank.pid, signal.SIGSTOP)
    args = ("--hang-after", "3", "--notify", receiver.url)
    watchers = [_watch(run, *args, "--name", f"w{i}", wait=False) for i in range(2)]
    tail = subprocess.Popen(
        [str(BIN / "ilab-journal"), "tail", "-f", "-n", "0", str(run)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: list[str] = []
    threading.Thread(
        target=lambda: said.extend(iter(tail.stderr.readline, "")), daemon=True
    ).start()  # type: ignore[union-attr]
    try:
        with guest(run, role="trainer"):  # held, as a stuck trainer holds it
            wait_for(lambda: len(_status(run)[1]["guards"]) == 2, 60, "both guards' heartbeats")
            wait_for(lambda: _posts(receiver, "hang"), 60, "the hang message")
            code, status = _status(run)
            assert (code, status["state"], status["alerts"]) == (8, "hung", 1), status
            assert status["last_alert"]["kind"] == "hang"
            assert not status["last_alert"]["journaled"]
            assert (
                "state  hung (still running, but a hang alert at step 5"
                in cli("ilab-journal", "status", str(run)).stdout
            )
            gate = cli("ilab-journal", "check", str(run), "-e", "alerts == 0")
            assert gate.returncode == 1 and "FAIL  alerts == 0  (alerts = 1)" in gate.stdout
            wait_for(lambda: any("(not in the journal yet) kind=hang" in x for x in said), 10)
            from tests.test_serve import client  # the serve extra (skips without it)

            page = client(run).get("/api/runs/run?width=100").json()["summary"]
            assert (page["state"], page["stuck"], page["alert_kinds"]) == ("hung", True, ["hang"])
            assert sorted(g["pid"] for g in page["guards"]) == sorted(w.pid for w, _ in watchers)
            os.kill(rank.pid, signal.SIGCONT)
            writer.append("step_end", step=6)
            wait_for(lambda: _posts(receiver, "recovered"), 30, "the recovered message")
            code, status = _status(run)
            assert (code, status["state"], status["alerts"]) == (3, "running", 1), status
            assert status["last_alert"]["recovered_at"], status
            end = {"status": "failed", "error_type": "E", "error_message": "x"}
            writer.append("train_end", end)
            writer.close()
        for proc, lines in watchers:
            assert proc.wait(timeout=60) == 0, "".join(lines)[-3000:]
    finally:
        writer.close()
        for p in [rank, tail, *(w for w, _ in watchers)]:
            p.kill()
            p.wait()
    titles = sorted(b["title"].split(":")[0] for b in receiver.bodies)
    assert titles == ["[ilab] failed", "[ilab] hang", "[ilab] recovered"], titles
    alerts = wait_for(lambda: len(a := _alerts(run)) == 3 and a, 30, "3 alerts journaled")
    [hang] = [a for a in alerts if a["kind"] == "hang"]
    assert [a["resolves"] for a in alerts if a["kind"] == "recovered"] == [hang["id"]]
    assert _status(run)[1]["alerts"] == 2  # a recovery is no alert of its own


@needs_apprise
def test_three_watchers_of_one_run_page_once_and_journal_once(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Three ilab-watch --notify follow one live run (a journal the test writes); it fails
    while they follow: the receiver gets one message, the journal one alert, status 1."""
    run = tmp_path / "run"
    write_run(run, steps=4, save_every=0, end=None)
    watchers = [_watch(run, "--notify", receiver.url, "--name", f"w{i}") for i in range(3)]
    try:
        with guest(run, role="trainer") as w:
            w.append("train_end", {"status": "failed", "error_type": "E", "error_message": "x"})
        for proc, lines in watchers:
            assert proc.wait(timeout=60) == 0, "".join(lines)[-3000:]
    finally:
        for proc, _ in watchers:
            proc.kill()
    assert len(receiver.bodies) == 1, receiver.bodies
    assert [a["kind"] for a in _alerts(run)] == ["failed"]
    assert _status(run)[1]["alerts"] == 1


@needs_apprise
def test_a_guard_stopped_while_its_run_goes_on_says_so_and_status_lists_the_guards(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Two ilab-watch guards beside a live run (its rank a real process): status lists both
    with when each last looked. One stopped with SIGTERM while the run goes on: one
    guard_stopped alert (told, journaled) and its heartbeat gone; the other, killed with
    SIGKILL, leaves a heartbeat that ages."""
    [rank] = _sleeps(1)
    run = tmp_path / "run"
    _quiet_run(run, {"ranks": [_as_rank(0, rank.pid)]}, quiet_s=0.0).close()
    try:
        (term, lines), (killed, _) = [
            _watch(run, "--hang-after", "600", "--notify", receiver.url, "--name", f"w{i}")
            for i in range(2)
        ]
        pids = {term.pid, killed.pid}
        guards = wait_for(
            lambda: (g := _status(run)[1]["guards"]) and {x["pid"] for x in g} == pids and g,
            timeout=30,
            what="both guards' heartbeats",
        )
        assert all(g["source"] == "ilab-watch" and "deaths" in g["watches"] for g in guards)
        text = cli("ilab-journal", "status", str(run)).stdout
        assert f"ilab-watch on {guards[0]['host']} (pid {guards[0]['pid']}; hangs" in text
        term.send_signal(signal.SIGTERM)
        term.wait(timeout=60)
        killed.kill()
        killed.wait()
    finally:
        rank.kill()
        rank.wait()
    [said] = wait_for(lambda: _posts(receiver, "guard_stopped"), 30, "the guard_stopped message")
    assert (
        f"the guard of watcher:{guards[0]['host']}:{term.pid} stopped while attempt 1"
        in (said["message"])
    )
    assert "1 other guard(s) still watch it" in said["message"], "".join(lines)
    [alert] = wait_for(lambda: _alerts(run), 30, "the alert journaled")
    assert alert["kind"] == "guard_stopped"
    [left] = _status(run)[1]["guards"]  # the killed one's heartbeat stays, and ages
    assert left["pid"] == killed.pid
    beat(run, left["host"], left["pid"], {**left, "looked_at": left["looked_at"] - 95})
    assert f"(pid {killed.pid}; hangs" in (text := cli("ilab-journal", "status", str(run)).stdout)
    assert "s ago: gone?" in text  # as it reads 95 s on


@needs_apprise
@pytest.mark.dist
@pytest.mark.extended
def test_a_hang_pages_once_shows_while_it_lasts_and_its_recovery_is_told(
    tmp_path: Path, receiver: Receiver
) -> None:
    """ilab-train --hang-after 5 --notify URL beside two ilab-watch --hang-after 5 --notify
    URL: three guards and three notifiers on one real 2-rank run. Rank 1 stopped: one hang
    message; while it lasts status says hung (exit 8) with the alert the journal has not got,
    check judges it (alerts == 0 fails) and tail -f says it. Rank 1 continued: one recovered
    message; status running again, one alert. A watcher stopped while the run goes on:
    one guard_stopped. The run stopped: one stopped message. Each journaled once."""
    run, url = tmp_path / "run", receiver.url
    job = subprocess.Popen(
        train_argv(run, *LONG, "--hang-after", "5", "--notify", url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=train_env(step_delay=0.05),
    )
    watchers, tail = [], None
    try:
        ranks = _ranks(run)
        wait_for(lambda: _steps(run) >= 5, timeout=240, what="5 steps")
        watchers = [_watch(run, "--hang-after", "5", "--notify", url, "--name", w) for w in "ab"]
        wait_for(lambda: len(_status(run)[1]["guards"]) == 3, 30, "three guards' heartbeats")
        tail = subprocess.Popen(
            [str(BIN / "ilab-journal"), "tail", "-f", "-n", "0", str(run)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        told: list[str] = []
        threading.Thread(
            target=lambda: told.extend(iter(tail.stderr.readline, "")), daemon=True
        ).start()  # type: ignore[union-attr]
        os.kill(ranks[1], signal.SIGSTOP)
        wait_for(lambda: _posts(receiver, "hang"), 60, "the hang message")
        code, status = _status(run)
        assert (code, status["state"], status["alerts"]) == (8, "hung", 1), status
        assert status["last_alert"]["kind"] == "hang" and not status["last_alert"]["journaled"]
        gate = cli("ilab-journal", "check", str(run), "-e", "alerts == 0")
        assert gate.returncode == 1 and "FAIL  alerts == 0  (alerts = 1)" in gate.stdout
        wait_for(lambda: any("alert (not in the journal yet) kind=hang" in x for x in told), 10)
        os.kill(ranks[1], signal.SIGCONT)
        wait_for(lambda: _posts(receiver, "recovered"), 60, "the recovered message")
        code, status = wait_for(lambda: (s := _status(run))[0] == 3 and s, 30, "running again")
        assert status["alerts"] == 1 and status["last_alert"]["recovered_at"], status
        watchers[0][0].send_signal(signal.SIGTERM)
        wait_for(lambda: _posts(receiver, "guard_stopped"), 60, "the guard_stopped message")
        assert cli("ilab-journal", "control", "stop", str(run)).returncode == 0
        _, err = job.communicate(timeout=120)
        assert job.returncode == 0, err[-3000:]
        assert watchers[1][0].wait(timeout=60) == 0, "".join(watchers[1][1])[-3000:]
        wait_for(lambda: _posts(receiver, "stopped"), 30, "the stopped message")
    finally:
        kill_tree(job.pid)
        for proc in [*(w for w, _ in watchers), *([tail] if tail else [])]:
            proc.kill()
    kinds = ["hang", "recovered", "guard_stopped", "stopped"]
    assert sorted(b["title"].split(":")[0] for b in receiver.bodies) == sorted(
        f"[ilab] {k}" for k in kinds
    ), [b["title"] for b in receiver.bodies]
    alerts = wait_for(lambda: len(a := _alerts(run)) == 4 and a, 30, "4 alerts journaled")
    assert sorted(a["kind"] for a in alerts) == sorted(kinds)
    [hang] = [a for a in alerts if a["kind"] == "hang"]
    assert [a["resolves"] for a in alerts if a["kind"] == "recovered"] == [hang["id"]]
    code, status = _status(run)
    assert (code, status["alerts"], status["guards"]) == (4, 3, []), status


@needs_apprise
@pytest.mark.extended
def test_a_hang_that_clears_then_comes_back_pages_again_after_the_minute(
    tmp_path: Path, receiver: Receiver
) -> None:
    """ilab-train --hang-after 5: rank 1 stopped (a hang, paged), continued (recovered,
    told), stopped again at once: a new incident of the same attempt, paged once the
    minute since the first is up (a flapping rank pages at most once a minute)."""
    run = tmp_path / "run"
    job = subprocess.Popen(
        train_argv(run, *LONG, "--hang-after", "5", "--notify", receiver.url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=train_env(step_delay=0.05),
    )
    ranks: dict[int, int] = {}
    try:
        ranks = _ranks(run)
        wait_for(lambda: _steps(run) >= 5, timeout=240, what="5 steps")
        os.kill(ranks[1], signal.SIGSTOP)
        wait_for(lambda: _posts(receiver, "hang"), 60, "the first hang's message")
        os.kill(ranks[1], signal.SIGCONT)
        wait_for(lambda: _posts(receiver, "recovered"), 60, "the recovered message")
        os.kill(ranks[1], signal.SIGSTOP)
        wait_for(lambda: len(_posts(receiver, "hang")) == 2, 120, "the second hang's message")
        assert _status(run)[1]["state"] == "hung"
        os.kill(ranks[1], signal.SIGCONT)
        assert cli("ilab-journal", "control", "stop", str(run)).returncode == 0
        _, err = job.communicate(timeout=120)
        assert job.returncode == 0, err[-3000:]
    finally:
        with contextlib.suppress(KeyError, ProcessLookupError):
            os.kill(ranks[1], signal.SIGCONT)
        kill_tree(job.pid)
    hangs = [a for a in _alerts(run) if a["kind"] == "hang"]
    assert len(hangs) == 2 and hangs[0]["step"] < hangs[1]["step"]
    assert hangs[1]["raised_at"] - hangs[0]["raised_at"] >= 60.0
    assert [b["title"].split(":")[0] for b in receiver.bodies][:3] == [
        "[ilab] hang",
        "[ilab] recovered",
        "[ilab] hang",
    ]


@needs_apprise
def test_notify_on_without_recovered_journals_a_recovery_and_tells_only_the_hang(
    tmp_path: Path, receiver: Receiver
) -> None:
    """--notify-on left recovered out: a hang that clears is told as a hang only, and its
    recovery is still raised and journaled (status needs the hang's end)."""
    [sleep] = _sleeps(1)
    run = tmp_path / "run"
    kinds = DEFAULT_KINDS - {"recovered"}
    sink = AlertDispatcher(run, targets=[receiver.url], run_label=str(run), kinds=kinds)
    try:
        with _quiet_run(run, {"ranks": [_as_rank(0, sleep.pid)]}, quiet_s=0.0) as w:
            guard = Guard(run, sink, GuardOptions(hang=HangRule(1.0)))
            now = time.time() + 2.0
            guard.tick(now)  # on the guard's clock: 2 s of quiet
            w.append("step_end", step=6, ts=now + 0.5)
            guard.tick(now + 1.0)
    finally:
        sink.close(10.0)
        sleep.kill()
        sleep.wait()
    assert [a.kind for a in sink.raised] == ["hang", "recovered"]
    assert [b["title"].split(":")[0] for b in receiver.bodies] == ["[ilab] hang"]
    alerts = wait_for(lambda: len(a := _alerts(run)) == 2 and a, 30, "both journaled")
    assert [bool(a["targets"]) for a in alerts] == [True, False]  # the recovery: told nobody
