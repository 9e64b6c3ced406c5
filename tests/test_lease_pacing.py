"""Lease pacing (trainer/steering/lease_pacing.py), without torch: the wait before a scheduled save
holds while enough checkpoints are leased and ends on a release, an expiry, a new control
command, a signal or its deadline. The run-level check is in test_trainer_pacing below
(2 ranks, a lease taken by hand)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from journal.checkpoints import leases
from journal.rundir.paths import checkpoints_dir, control_dir
from tests.helpers import cli, records, train, train_argv, train_env, wait_for
from trainer.config import TrainingArgs
from trainer.steering.dir_watch import DirWatch
from trainer.steering.lease_pacing import LeasePacer, PaceResult, leased_count, save_scheduled


def _checkpoint(run: Path, step: int) -> str:
    d = checkpoints_dir(run) / f"step-{step:06d}"
    d.mkdir(parents=True)
    return d.name


class Probe:
    """The pacer's interrupt flag, counting how often the wait looked at it: a count that
    grows while ``wait`` has not returned proves the wait is holding."""

    def __init__(self) -> None:
        self.calls = 0
        self.signal = False

    def __call__(self) -> bool:
        self.calls += 1
        return self.signal


def _waiting(pacer: LeasePacer, probe: Probe) -> tuple[threading.Thread, list[PaceResult]]:
    """Start ``pacer.wait()`` in a thread; return once the wait has looked a few times."""
    out: list[PaceResult] = []
    t = threading.Thread(target=lambda: out.append(pacer.wait()), daemon=True)
    t.start()
    wait_for(lambda: probe.calls >= 3, timeout=30, what="the pacer waiting")
    assert t.is_alive() and not out  # held by the lease
    return t, out


def _ended(t: threading.Thread, out: list[PaceResult]) -> PaceResult:
    t.join(timeout=30)
    assert not t.is_alive() and out
    return out[0]


def test_no_wait_below_the_limit(tmp_path: Path) -> None:
    name = _checkpoint(tmp_path, 2)
    leases.acquire(tmp_path, name, ttl=600)
    assert leased_count(tmp_path)[0] == 1
    assert LeasePacer(tmp_path, 2, 60).wait() == PaceResult(0.0, "free", 1)
    assert LeasePacer(tmp_path / "none", 1, 60).wait().end == "free"  # no leases/ at all


def test_two_leases_on_one_checkpoint_count_once(tmp_path: Path) -> None:
    name = _checkpoint(tmp_path, 2)
    leases.acquire(tmp_path, name, ttl=600)
    leases.acquire(tmp_path, name, ttl=600)
    leases.acquire(tmp_path, _checkpoint(tmp_path, 4), ttl=600)
    assert leased_count(tmp_path)[0] == 2


def test_waits_while_leased_and_returns_on_release(tmp_path: Path) -> None:
    lease = leases.acquire(tmp_path, _checkpoint(tmp_path, 2), ttl=600)
    probe = Probe()
    t, out = _waiting(LeasePacer(tmp_path, 1, 60, interrupted=probe), probe)
    leases.release(tmp_path, lease.id)
    res = _ended(t, out)
    assert res.end == "released" and res.leased == 1 and 0 < res.waited_s < 30


def test_an_expired_lease_ends_the_wait(tmp_path: Path) -> None:
    """An expiry changes nothing on disk: the pacer recounts when the first lease ends."""
    leases.acquire(tmp_path, _checkpoint(tmp_path, 2), ttl=0.5)
    res = LeasePacer(tmp_path, 1, 60).wait()
    assert res.end == "released" and 0 < res.waited_s < 30


def test_a_new_control_command_ends_the_wait(tmp_path: Path) -> None:
    leases.acquire(tmp_path, _checkpoint(tmp_path, 2), ttl=600)
    control_dir(tmp_path).mkdir(parents=True)
    control = DirWatch(control_dir(tmp_path))
    control.scanned()  # as after the step's poll: the directory as it is now is not news
    control.changed = False
    control.start()
    probe = Probe()
    try:
        t, out = _waiting(LeasePacer(tmp_path, 1, 60, control=control, interrupted=probe), probe)
        (control_dir(tmp_path) / "c1.json").write_text(json.dumps({"command": "stop"}))
        res = _ended(t, out)
        assert res.end == "control"
        assert control.changed  # the step's poll reads control/ now
    finally:
        control.close()


def test_after_a_wait_the_control_dir_is_read_at_once(tmp_path: Path) -> None:
    """A consumer writes its command, then releases its lease: the poll right after the
    wait must read control/ even if the helper thread has not ticked yet."""
    lease = leases.acquire(tmp_path, _checkpoint(tmp_path, 2), ttl=600)
    control = DirWatch(control_dir(tmp_path), interval=3600)  # never ticks during the test
    control.changed = False
    probe = Probe()
    t, out = _waiting(LeasePacer(tmp_path, 1, 60, control=control, interrupted=probe), probe)
    leases.release(tmp_path, lease.id)
    assert _ended(t, out).end == "released" and control.changed


def test_a_signal_ends_the_wait(tmp_path: Path) -> None:
    leases.acquire(tmp_path, _checkpoint(tmp_path, 2), ttl=600)
    probe = Probe()
    t, out = _waiting(LeasePacer(tmp_path, 1, 60, interrupted=probe), probe)
    probe.signal = True
    assert _ended(t, out).end == "interrupt"


def test_the_deadline_ends_the_wait(tmp_path: Path) -> None:
    leases.acquire(tmp_path, _checkpoint(tmp_path, 2), ttl=600)
    res = LeasePacer(tmp_path, 1, 0.3).wait()
    assert res.end == "deadline" and res.waited_s >= 0.3


def test_the_deadline_is_below_the_collective_timeout(tmp_path: Path) -> None:
    args = TrainingArgs(ckpt_dir=tmp_path, demo=True, pg_timeout_s=100, max_leased_checkpoints=2)
    pacer = LeasePacer.for_run(args, None, lambda: False)
    assert pacer is not None and pacer.max_leased == 2 and 0 < pacer.limit_s < 100
    assert LeasePacer.for_run(TrainingArgs(ckpt_dir=tmp_path, demo=True), None, bool) is None
    with pytest.raises(ValueError):
        LeasePacer(tmp_path, 0, 60)


def test_which_saves_are_paced(tmp_path: Path) -> None:
    args = TrainingArgs(ckpt_dir=tmp_path, demo=True, save_every=4, save_at_epoch_end=True)
    assert [s for s in range(1, 13) if save_scheduled(args, s, 8 * s, 8, False)] == [4, 8, 12]
    assert save_scheduled(args, 5, 40, 8, epoch_ends=True)  # the epoch's end saves
    off = TrainingArgs(ckpt_dir=tmp_path, demo=True, save_at_epoch_end=False, save_samples=20)
    assert [s for s in range(1, 7) if save_scheduled(off, s, 8 * s, 8, True)] == [3, 5]


# -- a real run ---------------------------------------------------------------------------


def _saves(run: Path) -> dict[int, dict[str, Any]]:
    return {r["step"]: r for r in records(run) if r["event"] == "save"}


@pytest.mark.extended
def test_a_held_lease_holds_training_at_the_next_save(tmp_path: Path) -> None:
    """2 ranks, --max-leased-checkpoints 1: a lease taken by hand on step 2's checkpoint
    holds the resumed run before its save at step 4 until the lease is released; step 4's
    tok/s leaves the wait out."""
    run = tmp_path / "run"
    first = train(run, "--max-steps", "2", "--save-every", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    held = cli("ilab-journal", "lease", str(run), "step-000002", "--ttl", "3600")
    assert held.returncode == 0, held.stderr
    lease_id = held.stdout.strip()
    argv = train_argv(run, "--max-steps", "6", "--save-every", "2")
    argv += ["--max-leased-checkpoints", "1"]
    argv.remove("--quiet")  # rank 0's console says when it waits
    job = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=train_env()
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(job.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()
    try:
        wait_for(
            lambda: any("waiting before the save" in line for line in lines),
            timeout=240,
            what="rank 0 waiting for the lease",
        )
        ended = [r["step"] for r in records(run) if r["event"] == "step_end"]
        assert max(ended) == 3 and 4 not in _saves(run)  # held before step 4's all-reduce
        # The user holds the lease a while: longer than 3 steps, so a throughput that counted
        # the wait would show it (a release at once made a wait shorter than one step)
        steps = [r["data"]["elapsed_time"] for r in records(run) if r["event"] == "log"]
        time.sleep(max(1.0, 3 * max(steps)))  # the lease's holding time, not a sync
        released_at = time.time()
        assert cli("ilab-journal", "release", str(run), lease_id).returncode == 0
        assert job.wait(timeout=240) == 0, "".join(lines)[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
        reader.join(timeout=30)
    saves = _saves(run)
    assert {4, 6} <= set(saves)
    assert saves[4]["ts"] >= released_at  # nothing was saved while the lease was held
    assert saves[4]["data"]["lease_wait_s"] > 0
    assert saves[6]["data"]["lease_wait_s"] == 0  # nobody leased step 4
    # step 4's throughput counts its training, not the wait (it read 224 tok/s beside 2711)
    log4 = next(r["data"] for r in records(run) if r["event"] == "log" and r["step"] == 4)
    assert log4["elapsed_time"] < saves[4]["data"]["lease_wait_s"], log4
    end = next(r for r in reversed(records(run)) if r["event"] == "train_end")
    assert end["data"]["status"] == "completed" and end["step"] == 6
