"""Torture with real processes (``make torture``; slow): node crashes at random moments,
launcher kills with immediate relaunches, watcher kills mid-delivery. The default suite runs
bounded versions of each in test_single_writer.py and test_trainer.py."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, cli, kill_tree, records, train, train_argv, train_env, write_run
from tests.test_single_writer import relaunch_after_killing_the_launcher

pytestmark = [pytest.mark.slow, pytest.mark.dist]


def test_node_crash_30_times_then_the_run_completes(tmp_path: Path, reliability: Any) -> None:
    """kill -9 of the whole process tree (launcher, torchrun, workers) at random moments,
    relaunching each time: the journal stays valid, each attempt resumes from the newest
    complete checkpoint, and the run ends completed at the planned step."""
    ckpt = tmp_path / "run"
    args = ("--max-steps", "300", "--num-epochs", "4", "--save-every", "2")
    rng = random.Random(7)
    crashes = 0
    while crashes < 30:
        job = subprocess.Popen(
            train_argv(ckpt, *args),
            env=train_env(step_delay=0.2),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + rng.uniform(1.0, 8.0)  # the moment of the crash
        while time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.05)
        if job.poll() is not None:
            assert job.returncode == 0  # it finished before this crash came
            break
        kill_tree(job.pid)
        job.wait()
        crashes += 1
    final = train(ckpt, *args, timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]
    recs = records(ckpt)
    assert cli("ilab-journal", "validate", str(ckpt)).returncode == 0
    seqs = [r["seq"] for r in recs]
    assert seqs == sorted(set(seqs))
    last_saved = 0
    for r in recs:
        if r["event"] == "save":
            last_saved = r["step"]
        elif r["event"] == "train_begin" and r["data"].get("resumed_from"):
            # newest complete checkpoint: at least the last journaled one (a save whose
            # record the crash cut off is complete on disk and newer still)
            assert int(r["data"]["resumed_from"][-6:]) >= last_saved
    assert recs[-1]["data"]["status"] == "completed" and recs[-1]["step"] == 300
    assert crashes == 30
    attempts = recs[-1]["attempt"]
    reliability(
        "node crash (kill -9 of the whole tree) x30, relaunch each time",
        crashes=crashes,
        attempts=attempts,
        ended="completed at step 300",
    )


def test_launcher_killed_10_times_never_two_writers(tmp_path: Path, reliability: Any) -> None:
    figures = relaunch_after_killing_the_launcher(tmp_path, kills=10)
    reliability("kill -9 launcher only + immediate relaunch x10", **figures)


CALLBACK = textwrap.dedent(
    """
    import json, os, time
    log = os.environ["CALLS"]
    def note(at):
        with open(log, "a") as f:
            f.write(json.dumps({"id": os.environ["ILAB_DELIVERY_ID"], "pid": os.getpid(),
                                "at": at, "t": time.time()}) + "\\n")
    note("start")
    time.sleep(0.4)
    note("end")
    """
)


def test_watcher_killed_20_times_mid_delivery(ckpt: Path, tmp_path: Path, reliability: Any) -> None:
    write_run(ckpt, steps=80, save_every=2)  # 40 saves: more work than 20 kills interrupt
    script, calls = tmp_path / "cb.py", tmp_path / "calls.jsonl"
    script.write_text(CALLBACK)
    env = {**os.environ, "CALLS": str(calls)}
    argv = [str(BIN / "ilab-watch"), str(ckpt), "--on-save", str(script), "--name", "w"]
    rng = random.Random(3)
    kills = 0
    while kills < 20:
        w = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(0.2, 1.5))  # a random moment: this is the fault injected
        if w.poll() is not None:
            break  # everything was delivered before this kill
        os.kill(w.pid, signal.SIGKILL)
        w.wait()
        kills += 1
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    log = [json.loads(x) for x in calls.read_text().splitlines()]
    finished = {e["id"] for e in log if e["at"] == "end"}
    assert kills == 20 and len(finished) == 40  # 0 lost deliveries
    # no two runs of one delivery at the same time: a restart ended the leftover first
    runs: dict[str, list[tuple[float, float]]] = {}
    by_pid = {e["pid"]: e for e in log if e["at"] == "start"}
    for e in log:
        if e["at"] == "end":
            runs.setdefault(e["id"], []).append((by_pid[e["pid"]]["t"], e["t"]))
    for spans in runs.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    started = sum(1 for e in log if e["at"] == "start")
    reliability(
        "kill -9 of ilab-watch mid-delivery x20",
        kills=kills,
        deliveries=len(finished),
        lost=0,
        runs_started=started,
    )
