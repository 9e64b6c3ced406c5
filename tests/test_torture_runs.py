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

from tests.helpers import (
    BIN,
    cli,
    kill_tree,
    max_step,
    records,
    train,
    train_argv,
    train_env,
    wait_for,
    write_run,
)
from tests.test_single_writer import relaunch_after_killing_the_launcher

pytestmark = [pytest.mark.slow, pytest.mark.dist, pytest.mark.timeout(3600)]  # minutes each


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


def test_kill_9_during_background_writes_15_times(tmp_path: Path, reliability: Any) -> None:
    """The node crash above, aimed at asynchronous saves: each kill lands while a
    background write is in flight, and a watcher's ``--on-save`` checks what it is handed."""
    from tests.test_async_save import kill_during_background_writes

    figures = kill_during_background_writes(tmp_path, kills=15, seed=5, steps=120)
    assert figures["during_a_write"] >= 10  # the rest landed just as a write completed
    reliability(
        "kill -9 of the whole tree during a background (--async-save) write x15, "
        "relaunch each time, a watcher's --on-save checking each checkpoint",
        **figures,
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


def plant_hostile(ckpt: Path, tag: str, first_lease_step: int) -> dict[str, list[str]]:
    """In each inbox: a FIFO, a symlink to /dev/zero, a 256 MiB sparse file and a malformed
    payload (leases: one per checkpoint rotation will look at). Returns the names per dir."""
    from tests.test_inbox import plant

    names: dict[str, list[str]] = {"control": [], "reports": [], "leases": []}
    malformed = {
        "control": b'{"command": ["stop"]}',
        "reports": b'{"id": "e", "metrics": [1]}',
        "leases": b'{"id": "x", "checkpoint": "step-000002", "expires": null}',
    }
    kinds = ("fifo", "zero", "sparse", "malformed")
    for inbox in names:
        for i, kind in enumerate(kinds):
            if inbox == "leases":  # checkpoints saved (every 2 steps) and rotated after this
                name = f"step-{first_lease_step + 2 * i:06d}--{tag}-{kind}.json"
            else:
                name = f"{tag}-{kind}.json"
            if kind == "zero":
                (ckpt / inbox).mkdir(mode=0o750, parents=True, exist_ok=True)
                (ckpt / inbox / name).symlink_to("/dev/zero")
            else:
                plant(
                    ckpt / inbox,
                    name,
                    "file" if kind == "malformed" else kind,
                    malformed[inbox],
                    ckpt,
                )
            names[inbox].append(name)
    return names


def test_hostile_files_in_every_inbox_during_a_run(tmp_path: Path, reliability: Any) -> None:
    """FIFOs, symlinks to /dev/zero, 256 MiB files and malformed payloads in control/,
    reports/ and leases/, before the launch and while training: the run completes at its
    planned step, rotation is not held up by any of them, every one is moved aside, each
    command and report file is journaled once, and `ilab-journal report` keeps working."""
    ckpt = tmp_path / "run"
    ckpt.mkdir(mode=0o750)
    early = plant_hostile(ckpt, "early", first_lease_step=2)
    args = ("--max-steps", "16", "--save-every", "2", "--keep-last-n", "1")
    job = subprocess.Popen(
        train_argv(ckpt, *args),
        env=train_env(step_delay=0.2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: max_step(ckpt) >= 3, what="step 3")
        late = plant_hostile(ckpt, "late", first_lease_step=8)
        _, err = job.communicate(timeout=400)
    finally:
        kill_tree(job.pid)
    assert job.returncode == 0, err[-3000:]
    recs = records(ckpt)
    assert recs[-1]["data"]["status"] == "completed" and recs[-1]["step"] == 16
    assert sorted(p.name for p in (ckpt / "checkpoints").iterdir()) == ["step-000016"]
    refused = [r["data"] for r in recs if r["event"] == "control" and not r["data"]["accepted"]]
    for inbox in ("control", "reports", "leases"):
        names = early[inbox] + late[inbox]
        assert sorted(os.listdir(ckpt / inbox / "rejected")) == sorted(names), inbox
        if inbox == "leases":
            continue  # rotation refuses them without journaling (see journal.checkpoints.leases.leased)
        for name in names:
            if inbox == "control":  # a command file's refusal carries its id (the stem)
                hits = [d for d in refused if d["id"] == name.removesuffix(".json")]
            else:
                hits = [d for d in refused if f"reports/{name}" in d["reason"]]
            assert len(hits) == 1, (inbox, name, hits)
    (ckpt / "reports" / "after.json").write_bytes(b'{"id": "a", "metrics": "x"}')
    proc = cli("ilab-journal", "report", str(ckpt), "--step", "16", "accuracy=0.5")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert (ckpt / "reports" / "rejected" / "after.json").exists()
    reliability(
        "FIFO, symlink to /dev/zero, 256 MiB, malformed in control/ reports/ leases/",
        files=sum(len(v) for v in (*early.values(), *late.values())),
        refused=len(refused),
        ended="completed at step 16",
    )
