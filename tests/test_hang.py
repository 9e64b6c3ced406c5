"""Hangs and deaths of real 2-rank gloo runs (docs/alerts.md).

A hang is ``kill -STOP`` of rank 1: rank 0 then blocks in its next collective, and the
guard's py-spy stack of rank 0 must show it. A death is ``kill -9`` of every process of
the run. No test hook: the trainer runs as a user runs it."""

from __future__ import annotations

import importlib
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
from tests.helpers import (
    BIN,
    cli,
    kill_tree,
    launch_bridge_script,
    records,
    train,
    train_argv,
    train_env,
    wait_for,
)

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


def _claims(run: Path) -> list[Path]:
    """The alerts claimed under ``alerts/`` (the guards' heartbeats aside)."""
    return [p for p in (run / "alerts").glob("**/*") if p.is_file() and p.parent.name != "guards"]


def _watch(run: Path, *args: str) -> tuple[subprocess.Popen[str], list[str]]:
    """``ilab-watch RUN ARGS...`` started, once it follows; its stderr lines as they come."""
    watch = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(run), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=train_env(),
    )
    lines: list[str] = []
    threading.Thread(
        target=lambda: lines.extend(iter(watch.stderr.readline, "")), daemon=True
    ).start()  # type: ignore[union-attr]
    wait_for(lambda: any("hook(s) on" in x for x in lines), timeout=60, what="the watcher")
    return watch, lines


def test_a_stopped_rank_raises_a_hang_alert_with_stacks_then_is_aborted(
    tmp_path: Path,
) -> None:
    """ilab-train --hang-after auto --on-hang abort: rank 1 stopped; rank 0 blocks in a
    collective; the alert carries both stacks and the launcher's view of the processes;
    the attempt is ended and journaled as a hang (status, check, backtest agree)."""
    run = tmp_path / "run"
    job = _start(run, "--hang-after", "auto", "--on-hang", "abort", "--save-every", "10")
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
    assert re.search(r" \(rank 0 waits in (all_reduce|all_gather\w*|broadcast\w*)\); ", said)
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
    back = cli("ilab-journal", "backtest", str(run), "--hang-after", "auto")
    assert back.returncode == 0 and "1 alarm(s), 0 false" in back.stdout, back.stdout
    # gloo keeps no NCCL flight recorder: its directory is made only by a rank that does
    assert all(p.is_file() for p in (run / "logs").iterdir())


@pytest.mark.extended
def test_a_hang_that_clears_is_found_by_the_backtest_and_counted_real(tmp_path: Path) -> None:
    """ilab-train --hang-after auto (report): rank 1 stopped until the guard's alert, then
    continued, and the run completes. The trainer journals the alert at the stuck step's
    boundary, with the records it held back: the backtest with the same rule finds that
    hang and counts it real (alerted live), not false."""
    run = tmp_path / "run"
    argv = train_argv(run, "--max-steps", "24", "--hang-after", "auto")
    job = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=train_env(0.05)
    )
    lines: list[str] = []
    threading.Thread(
        target=lambda: lines.extend(iter(job.stderr.readline, "")), daemon=True
    ).start()  # type: ignore[union-attr]
    try:
        ranks = {r["rank"]: r["pid"] for r in _begin(run)["data"]["ranks"]}
        wait_for(lambda: _steps(run) >= 12, timeout=240, what="12 steps")
        os.kill(ranks[1], signal.SIGSTOP)
        wait_for(lambda: any("alert: hang" in x for x in lines), 120, "the hang alert")
        os.kill(ranks[1], signal.SIGCONT)
        job.wait(timeout=240)
    finally:
        kill_tree(job.pid)
    assert job.returncode == 0, "".join(lines)[-3000:]
    hang, recovered = (a["data"] for a in _alerts(run))  # the incident, then its end
    assert hang["kind"] == "hang" and "left as it is" in hang["message"]
    assert recovered["kind"] == "recovered" and recovered["resolves"] == hang["id"]
    assert _ends(run)[0]["data"]["status"] == "completed"
    back = cli("ilab-journal", "backtest", str(run), "--hang-after", "auto")
    assert back.returncode == 0 and "1 alarm(s), 0 false" in back.stdout, back.stdout
    assert "(alerted live)" in back.stdout, back.stdout


@pytest.mark.extended
def test_a_dead_run_is_reported_and_its_relaunch_is_watched(tmp_path: Path) -> None:
    """kill -9 of the launcher, torchrun and both ranks: no train_end will come; the
    watcher's guard reports the death within 30 s and goes on following the run, so the
    user's relaunch (the same run, attempt 2) has its saves delivered; the watcher ends with
    it."""
    run, seen = tmp_path / "run", tmp_path / "seen.txt"
    job = _start(run, delay=0.05)
    watch = None
    try:
        _begin(run)
        wait_for(lambda: _steps(run) >= 2, timeout=240, what="2 steps")
        on_save = f"sh -c 'echo {{step}} >> {seen}'"
        watch, lines = _watch(run, "--hang-after", "60", "--on-save", on_save)
        killed_at = time.time()
        kill_tree(job.pid)
        wait_for(lambda: _alerts(run), timeout=60, what="the died alert")
        again = train(run, "--max-steps", "2", "--save-every", "2")
        assert again.returncode == 0, again.stderr[-3000:]
        assert watch.wait(timeout=60) == 0, "".join(lines)[-3000:]
    finally:
        kill_tree(job.pid)
        if watch is not None and watch.poll() is None:
            watch.kill()
    [died] = _alerts(run)
    assert died["data"]["kind"] == "died" and died["attempt"] == 1, died
    assert died["data"]["raised_at"] - killed_at <= 30.0
    assert died["data"]["message"].startswith("every process of attempt 1 is gone")
    assert any(f"alert: died at step {died['step']}: every process" in x for x in lines)
    begins = [r for r in records(run) if r["event"] == "train_begin"]
    assert [(b["run_id"], b["attempt"]) for b in begins] == [
        (begins[0]["run_id"], 1),
        (begins[0]["run_id"], 2),
    ]
    assert seen.read_text().split() == ["2"]  # the relaunch's save, delivered
    assert _ends(run)[-1]["data"]["status"] == "completed"


#: Each bridge's real loop under torchrun (2 ranks): its test module, script and package.
BRIDGES = [
    pytest.param(
        "test_accelerate_bridge",
        "DOCS_LOOP",
        "accelerate",
        id="accelerate",
        marks=pytest.mark.extended,
    ),
    pytest.param("test_hf_bridge", "SCRIPT", "transformers", id="hf", marks=pytest.mark.extended),
    pytest.param(
        "test_lightning_bridge", "SCRIPT", "lightning", id="lightning", marks=pytest.mark.extended
    ),
]


@pytest.mark.parametrize(("module", "script", "package"), BRIDGES)
def test_a_bridge_running_past_the_first_step_limit_is_no_hang(
    tmp_path: Path, module: str, script: str, package: str
) -> None:
    """ilab-watch --hang-after 30 --first-step-limit 20 beside a bridge's loop that runs 24 s
    and more: its first step ended with its first record of step 1 (the Accelerate bridge
    writes no step_end), so no hang is raised and the watcher ends with the run. (The limit
    leaves room for a first step slowed by a loaded machine: tests/test_guard.py holds the
    rule itself.)"""
    pytest.importorskip(package)
    out = tmp_path / "out"
    out.mkdir()
    watch, lines = _watch(out, "--hang-after", "30", "--first-step-limit", "20")
    job = None
    try:
        code = getattr(importlib.import_module(f"tests.{module}"), script)
        job = launch_bridge_script(tmp_path, code, 30, delay=0.8)
        _, err = job.communicate(timeout=240)
        assert job.returncode == 0, err[-3000:]
        assert watch.wait(timeout=60) == 0, "".join(lines)[-3000:]
    finally:
        for proc in (job, watch):
            if proc is not None and proc.poll() is None:
                kill_tree(proc.pid)
    recs = records(out)
    assert recs[-1]["event"] == "train_end" and recs[-1]["data"]["status"] == "completed"
    assert recs[-1]["ts"] - recs[0]["ts"] >= 22.0  # the guard looked past the limit
    assert not _alerts(out) and not any("alert:" in x for x in lines), "".join(lines)


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
    assert not _alerts(run) and not _claims(run)  # no alert, none even claimed
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
        "; a relaunch from the newest checkpoint follows (restart 1 of 1, the last)"
    )
    first, second = _ends(run)
    assert first["data"]["aborted_for"] == "hang" and second["data"]["status"] == "completed"
    begins = [r for r in records(run) if r["event"] == "train_begin"]
    assert [b["attempt"] for b in begins] == [1, 2]
    assert begins[1]["data"]["resumed_from"].endswith("step-000020")
    resumed = next(r for r in records(run) if r["event"] == "step_end" and r["attempt"] == 2)
    assert resumed["step"] == 21 and resumed["ts"] - first["ts"] <= 60.0


@pytest.mark.extended
def test_relaunches_stay_one_run_a_watcher_follows_them_and_the_last_failure_is_said(
    tmp_path: Path,
) -> None:
    """--max-restarts 1 with --notify-on: attempt 1 hangs before its first save (rank 1
    stopped) and is aborted; the relaunch is the same run's attempt 2 (from the start, no
    checkpoint yet), whose rank 1 is killed after its first save. An ilab-watch started
    beside it delivers that save across the relaunch and ends after the last train_end;
    the last failure is alerted once, with both attempts' causes; status and check count
    the run's alerts."""
    run, seen = tmp_path / "run", tmp_path / "seen.txt"
    argv = ["--max-steps", "3000", "--save-every", "20", "--max-restarts", "1"]
    argv += ["--hang-after", "10", "--on-hang", "abort", "--notify-on", "failed,hang"]
    run.mkdir()  # followed before the trainer starts
    watch, lines = _watch(run, "--on-save", f"sh -c 'echo {{attempt}}:{{step}} >> {seen}'")
    job = subprocess.Popen(
        train_argv(run, *argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=train_env(step_delay=0.05),
    )
    try:
        ranks = {r["rank"]: r["pid"] for r in _begin(run)["data"]["ranks"]}
        wait_for(lambda: _steps(run) >= 3, timeout=240, what="3 steps")
        os.kill(ranks[1], signal.SIGSTOP)  # a hang before the first save
        second = wait_for(
            lambda: next(
                (r for r in records(run) if r["event"] == "train_begin" and r["attempt"] == 2), None
            ),
            timeout=240,
            what="the relaunch",
        )
        wait_for(lambda: seen.exists(), timeout=240, what="the relaunch's save delivered")
        rank1 = {r["rank"]: r["pid"] for r in second["data"]["ranks"]}[1]
        os.kill(rank1, signal.SIGKILL)
        _, err = job.communicate(timeout=240)
        assert watch.wait(timeout=60) == 0, "".join(lines)[-3000:]
    finally:
        for proc in (job, watch):
            if proc.poll() is None:
                kill_tree(proc.pid)
    assert job.returncode == 1 and "restart 1 of 1" in err, err[-3000:]
    begins = [r for r in records(run) if r["event"] == "train_begin"]
    assert [(b["run_id"], b["attempt"], b["data"]["restart"]) for b in begins] == [
        (begins[0]["run_id"], 1, 0),
        (begins[0]["run_id"], 2, 1),
    ]
    delivered = seen.read_text().split()  # attempt 1 saved nothing; attempt 2 from step 20
    assert delivered[0] == "2:20" and all(x.startswith("2:") for x in delivered), delivered
    alerts = _alerts(run)
    hang, [failed] = alerts[0], [a for a in alerts if a["data"]["kind"] == "failed"]
    assert (hang["attempt"], hang["data"]["kind"]) == (1, "hang"), hang
    assert failed["attempt"] == 2, failed
    message = failed["data"]["message"]
    used_up = "no relaunch follows (--max-restarts 1 used up)"
    assert message.startswith(f"the run failed after 1 restart(s); {used_up}: attempt 1: ")
    assert "attempt 1: Hang: hang: no step progress" in message, message
    killed = f"; attempt 2: WorkerExit: rank 1 (pid {rank1}) was killed by SIGKILL, the first"
    assert killed in message, message
    status = json.loads(cli("ilab-journal", "status", str(run), "--json").stdout)
    assert status["alerts"] == len(alerts) and status["attempt"] == 2, status
    assert cli("ilab-journal", "check", str(run), "-e", "alerts == 0").returncode == 1


@pytest.mark.extended
def test_a_crash_loop_stops_after_three_attempts_without_a_new_checkpoint(tmp_path: Path) -> None:
    """--max-restarts 5 (--max-no-progress-attempts at its default, 3): rank 1 of attempt 1
    is killed after its first save, then rank 1 of each relaunch before it saves. Attempts
    2 to 4 make no progress, so the launcher relaunches no more: exit 4 after 3 restarts,
    not 5. Each failure's train_end and alert say what follows (the one before the last:
    the last unless it saves); the last alert says "no progress" with every attempt's cause,
    each naming the killed rank."""
    run = tmp_path / "run"
    argv = ["--max-steps", "3000", "--save-every", "5", "--max-restarts", "5"]
    job = subprocess.Popen(
        train_argv(run, *argv, "--notify-on", "failed"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=train_env(step_delay=0.05),
    )
    killed = []
    try:
        for attempt in (1, 2, 3, 4):
            begin = wait_for(
                lambda n=attempt: next(
                    (r for r in records(run) if r["event"] == "train_begin" and r["attempt"] == n),
                    None,
                ),
                timeout=240,
                what=f"attempt {attempt}",
            )
            if attempt == 1:
                wait_for(lambda: any(r["event"] == "save" for r in records(run)), 240, "a save")
            killed.append(next(r["pid"] for r in begin["data"]["ranks"] if r["rank"] == 1))
            os.kill(killed[-1], signal.SIGKILL)
        _, err = job.communicate(timeout=240)
    finally:
        kill_tree(job.pid)
    stop = "no relaunch follows: no progress, 3 attempt(s) in a row saved no new checkpoint"
    assert job.returncode == 4 and f"ilab-train: training failed; {stop}" in err, err[-3000:]
    assert [b["attempt"] for b in records(run) if b["event"] == "train_begin"] == [1, 2, 3, 4]
    follows = "a relaunch from the newest checkpoint follows (restart {} of 5{})"
    last = ", the last unless it saves a checkpoint (--max-no-progress-attempts 3)"
    assert [e["data"]["relaunch"] for e in _ends(run)] == [
        follows.format(1, ""),
        follows.format(2, ""),
        follows.format(3, last),
        f"{stop} (--max-no-progress-attempts 3)",
    ]
    said = [a["data"]["message"] for a in _alerts(run)]
    first = [f"rank 1 (pid {pid}) was killed by SIGKILL, the first rank to end" for pid in killed]
    assert [m.split("\n")[0] for m in said[:3]] == [
        f"the run failed: WorkerExit: {first[n - 1]}; its log: {run}/logs/rank-1.log; "
        + follows.format(n, last if n == 3 else "")
        for n in (1, 2, 3)
    ], said
    assert said[3].startswith(f"the run failed after 3 restart(s); {stop}"), said[3]
    causes = re.split(r"[:;] attempt \d: ", said[3].split("\n")[0])[1:]
    assert causes == [f"WorkerExit: {f}; its log: {run}/logs/rank-1.log" for f in first], said[3]


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
