"""Hangs and deaths of real 2-rank gloo runs (docs/alerts.md).

A hang is ``kill -STOP`` of rank 1: rank 0 then blocks in its next collective, and the
guard's py-spy stack of rank 0 must show it. A death is ``kill -9`` of every process of
the run. No test hook: the trainer runs as a user runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from journal.rundir.phase import read_phase
from tests.helpers import BIN, cli, kill_tree, records, train, train_argv, train_env, wait_for

#: A long demo run: it is stopped, aborted or killed long before its end.
LONG = ("--num-epochs", "50", "--max-steps", "3000")
#: rank 0's stack blocked in a collective: a torch.distributed call, under the loop's step
COLLECTIVE = re.compile(
    r"(all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*) \(torch/distributed/"
)


def _begin(run: Path) -> dict[str, Any]:
    return wait_for(
        lambda: next((r for r in records(run) if r["event"] == "train_begin"), None),
        timeout=240,
        what="train_begin",
    )


def _steps(run: Path) -> int:
    return max((r["step"] for r in records(run) if r["event"] == "step_end"), default=0)


def _start(run: Path, *extra: str, delay: float = 0.05) -> subprocess.Popen[str]:
    return subprocess.Popen(
        train_argv(run, *LONG, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=train_env(step_delay=delay),
    )


def _ends(run: Path) -> list[dict[str, Any]]:
    return [r for r in records(run) if r["event"] == "train_end"]


def _alerts(run: Path) -> list[dict[str, Any]]:
    return [r for r in records(run) if r["event"] == "alert"]


def test_a_stopped_rank_raises_a_hang_alert_with_stacks_then_is_aborted(
    tmp_path: Path,
) -> None:
    """ilab-train --hang-after 3 --on-hang abort: rank 1 stopped; rank 0 blocks in a
    collective; the alert carries both stacks and the launcher's view of the processes;
    the attempt is ended and journaled as a hang (status, check, backtest agree)."""
    run = tmp_path / "run"
    job = _start(run, "--hang-after", "3", "--on-hang", "abort", "--save-every", "10")
    try:
        ranks = {r["rank"]: r["pid"] for r in _begin(run)["data"]["ranks"]}
        assert sorted(ranks) == [0, 1] and all(isinstance(p, int) for p in ranks.values())
        wait_for(lambda: _steps(run) >= 12, timeout=240, what="12 steps")
        os.kill(ranks[1], signal.SIGSTOP)
        _, err = job.communicate(timeout=120)
    finally:
        kill_tree(job.pid)
    assert job.returncode == 1, err[-3000:]
    [end] = _ends(run)
    data = end["data"]
    assert data["status"] == "failed" and data["aborted_for"] == "hang", data
    alert_id = data["alert_id"]
    where = run / "alerts" / alert_id
    stack0 = (where / "rank-0.txt").read_text()
    assert COLLECTIVE.search(stack0), stack0[:3000]  # blocked in the collective
    assert "Trainer.train_step (trainer/rank/loop.py" in stack0
    assert (where / "rank-1.txt").is_file()  # the stopped rank, read without pausing it
    listing = (where / "processes.txt").read_text()
    assert f"rank 1: pid {ranks[1]}: stopped" in listing
    assert "torchrun agent: pid" in listing and "launcher: pid" in listing
    assert "hang" in err and alert_id in err  # said on the console
    [alert] = _alerts(run)
    assert alert["data"]["kind"] == "hang" and alert["data"]["id"] == alert_id
    said = alert["data"]["message"]  # the stuck rank, and what follows
    assert said.startswith("no step progress for ") and f"; stuck: rank 1 (pid {ranks[1]}) " in said
    assert said.endswith(
        "; aborting the attempt (--on-hang abort); no relaunch follows (--max-restarts 0)"
    )
    assert f"alert: hang at step {alert['step']}: no step progress" in err  # kind said once
    assert f"alerts/{alert_id}/rank-0.txt" in alert["data"]["evidence"]
    assert alert["seq"] < end["seq"]
    status = cli("ilab-journal", "status", str(run), "--json")
    assert json.loads(status.stdout)["stop_source"] == "hang", status.stdout
    gate = cli("ilab-journal", "check", str(run), "-e", "stop_source == hang")
    assert gate.returncode == 0, gate.stdout + gate.stderr
    back = cli("ilab-journal", "backtest", str(run), "--hang-after", "3")
    assert back.returncode == 0 and "1 alarm(s), 0 false" in back.stdout, back.stdout
    # gloo keeps no NCCL flight recorder: its directory is made only by a rank that does
    assert all(p.is_file() for p in (run / "logs").iterdir())


def test_a_run_whose_processes_are_all_killed_is_reported_dead(tmp_path: Path) -> None:
    """kill -9 of the launcher, torchrun and both ranks: no train_end will come; the
    watcher's guard reports the death within 30 s and stops following."""
    run = tmp_path / "run"
    job = _start(run, delay=0.05)
    watch = None
    try:
        _begin(run)
        wait_for(lambda: _steps(run) >= 2, timeout=240, what="2 steps")
        watch = subprocess.Popen(
            [str(BIN / "ilab-watch"), str(run), "--hang-after", "60"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=train_env(),
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(watch.stderr.readline, "")))  # type: ignore[union-attr]
        reader.start()
        wait_for(lambda: any("hook(s) on" in x for x in lines), timeout=60, what="the watcher")
        killed_at = time.time()
        kill_tree(job.pid)
        assert watch.wait(timeout=60) == 0, "".join(lines)[-3000:]
        reader.join(timeout=10)
    finally:
        kill_tree(job.pid)
        if watch is not None and watch.poll() is None:
            watch.kill()
    assert not _ends(run)  # nobody wrote one: that is the point
    [alert] = _alerts(run)
    assert alert["data"]["kind"] == "died", alert
    assert alert["data"]["raised_at"] - killed_at <= 30.0
    assert alert["data"]["message"].startswith("every process of attempt 1 is gone")
    assert any(f"alert: died at step {alert['step']}: every process" in x for x in lines)


@pytest.mark.extended
def test_a_25s_lease_wait_is_no_hang(tmp_path: Path) -> None:
    """--max-leased-checkpoints 1 and a lease released 25 s after rank 0 began to wait for
    it, with --hang-after 5 guarding: no alert, and the backtest finds no false alarm."""
    run = tmp_path / "run"
    first = train(run, "--max-steps", "2", "--save-every", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    held = cli("ilab-journal", "lease", str(run), "step-000002", "--ttl", "3600")
    assert held.returncode == 0, held.stderr
    argv = ["--max-steps", "6", "--save-every", "2", "--max-leased-checkpoints", "1"]
    job = subprocess.Popen(
        train_argv(run, *argv, "--hang-after", "5"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=train_env(),
    )
    try:
        waiting = wait_for(
            lambda: (p := read_phase(run)) is not None and p.name == "lease_wait" and p,
            timeout=240,
            what="rank 0 waiting for the lease",
        )
        wait_for(lambda: time.time() >= waiting.since + 25, timeout=40, what="a 25 s pause")
        assert cli("ilab-journal", "release", str(run), held.stdout.strip()).returncode == 0
        _, err = job.communicate(timeout=240)
    finally:
        kill_tree(job.pid)
    assert job.returncode == 0, err[-3000:]
    saves = {r["step"]: r for r in records(run) if r["event"] == "save"}
    assert saves[4]["data"]["lease_wait_s"] >= 25.0  # it did wait, far past the threshold
    assert not _alerts(run) and not (run / "alerts").exists()
    back = cli("ilab-journal", "backtest", str(run), "--hang-after", "5")
    assert "0 alarm(s), 0 false" in back.stdout, back.stdout


@pytest.mark.extended
def test_an_aborted_attempt_is_relaunched_and_resumes(tmp_path: Path) -> None:
    """--max-restarts 1: the hang-aborted attempt is launched again; it resumes from the
    newest checkpoint and the run completes."""
    run = tmp_path / "run"
    argv = ["--hang-after", "3", "--on-hang", "abort", "--max-restarts", "1"]
    job = subprocess.Popen(
        train_argv(run, "--max-steps", "60", "--save-every", "10", *argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=train_env(step_delay=0.05),
    )
    try:
        ranks = {r["rank"]: r["pid"] for r in _begin(run)["data"]["ranks"]}
        wait_for(lambda: _steps(run) >= 22, timeout=240, what="22 steps")
        os.kill(ranks[1], signal.SIGSTOP)
        _, err = job.communicate(timeout=300)
    finally:
        kill_tree(job.pid)
    assert job.returncode == 0, err[-3000:]
    assert "restart 1 of 1" in err
    [alert] = _alerts(run)
    assert alert["data"]["message"].endswith(
        "; a relaunch from the newest checkpoint follows (restart 1 of 1)"
    )
    first, second = _ends(run)
    assert first["data"]["aborted_for"] == "hang" and second["data"]["status"] == "completed"
    begins = [r for r in records(run) if r["event"] == "train_begin"]
    assert [b["attempt"] for b in begins] == [1, 2]
    assert begins[1]["data"]["resumed_from"].endswith("step-000020")
    resumed = next(r for r in records(run) if r["event"] == "step_end" and r["attempt"] == 2)
    assert resumed["step"] == 21 and resumed["ts"] - first["ts"] <= 60.0


@pytest.mark.extended
def test_a_watcher_aborts_a_hung_run_and_the_launcher_journals_the_hang(
    tmp_path: Path,
) -> None:
    """ilab-watch --hang-after 3 --on-hang abort beside a plain ilab-train: the watcher's
    guard ends the ranks; the launcher's train_end says it was a hang, by that watcher."""
    run = tmp_path / "run"
    job = _start(run)
    watch = None
    try:
        ranks = {r["rank"]: r["pid"] for r in _begin(run)["data"]["ranks"]}
        watch = subprocess.Popen(
            [str(BIN / "ilab-watch"), str(run), "--hang-after", "3", "--on-hang", "abort"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=train_env(),
        )
        wait_for(lambda: _steps(run) >= 5, timeout=240, what="5 steps")
        os.kill(ranks[1], signal.SIGSTOP)
        _, err = job.communicate(timeout=120)
        assert watch.wait(timeout=60) == 0
    finally:
        kill_tree(job.pid)
        if watch is not None and watch.poll() is None:
            watch.kill()
    assert job.returncode == 1, err[-3000:]
    [end] = _ends(run)
    assert end["data"]["aborted_for"] == "hang" and end["data"]["written_by"] == "launcher"
    assert end["data"]["aborted_by"].startswith("watcher:")
