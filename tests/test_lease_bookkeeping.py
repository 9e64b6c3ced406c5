"""Lease bookkeeping: a lease always expires (no infinite or NaN ttl), and a watcher's
renewal never brings back a lease its delivery just released."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from journal import JournalWriter
from journal.checkpoints import leases
from tests.helpers import BIN, cli, free_port, make_checkpoint, wait_for
from watcher.engine.leasing import LeaseKeeper


@pytest.mark.parametrize("ttl", ["inf", "nan", "-inf", "1e12", "0"])
def test_a_lease_that_would_never_expire_is_refused_in_one_line(ckpt: Path, ttl: str) -> None:
    (ckpt / "checkpoints" / "step-000004").mkdir(parents=True)
    proc = cli("ilab-journal", "lease", str(ckpt), "step-000004", "--ttl", ttl)
    assert proc.returncode == 2, proc.stderr
    assert "--ttl" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert not list(ckpt.glob("leases/*.json"))


@pytest.mark.parametrize("ttl", [float("inf"), float("nan"), 0.0, -1.0])
def test_the_python_api_refuses_a_ttl_that_never_or_already_ends(ckpt: Path, ttl: float) -> None:
    (ckpt / "checkpoints" / "step-000004").mkdir(parents=True)
    with pytest.raises(leases.LeaseError, match="ttl"):
        leases.acquire(ckpt, "step-000004", ttl=ttl)


class ObservedLock:
    """The keeper's lock, with a signal when an acquire has to wait (so the test knows a
    release is blocked behind a renewal without sleeping)."""

    def __init__(self, on_wait: threading.Event) -> None:
        self._lock = threading.Lock()
        self._on_wait = on_wait

    def __enter__(self) -> ObservedLock:
        if not self._lock.acquire(blocking=False):
            self._on_wait.set()
            self._lock.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


def test_a_release_during_a_renewal_stays_released(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delivery completes (release) while the renewal thread is rewriting the lease
    file: afterwards the lease file is gone and rotation may remove the checkpoint. Before,
    the renewal rewrote the file after the release and the checkpoint outlived keep_last_n."""
    (ckpt / "checkpoints" / "step-000004").mkdir(parents=True)
    keeper = LeaseKeeper(ckpt, ttl=60, holder="test")
    lease_id = keeper.take(str(ckpt / "checkpoints" / "step-000004"))
    assert lease_id is not None
    progressed = threading.Event()  # the release either finished or waits for the renewal
    keeper._lock = ObservedLock(progressed)  # type: ignore[assignment]
    real_write = leases.atomic_write

    def release_then() -> None:
        keeper.release(lease_id)
        progressed.set()

    def renewal_write(path: Any, data: bytes, **kw: Any) -> None:
        releaser = threading.Thread(target=release_then)
        releaser.start()  # the delivery completes right now
        assert progressed.wait(30)
        real_write(path, data, **kw)
        threads.append(releaser)

    threads: list[threading.Thread] = []
    monkeypatch.setattr(leases, "atomic_write", renewal_write)
    keeper.renew_held()
    monkeypatch.setattr(leases, "atomic_write", real_write)
    for t in threads:
        t.join()
    assert leases.leased(ckpt, {"step-000004"}) == set()
    assert not list((ckpt / "leases").glob("*.json"))


# -- single-file checkpoints (Lightning's .ckpt) -------------------------------------------


NAME_A = "lightning_logs/version_0/checkpoints/epoch=0-step=4.ckpt"  # as leases name them
NAME_B = "other/epoch=0-step=4.ckpt"


def ckpt_files(ckpt: Path) -> tuple[Path, Path]:
    """Two checkpoint files of the same name in two directories of the run dir."""
    a = ckpt / "lightning_logs" / "version_0" / "checkpoints" / "epoch=0-step=4.ckpt"
    b = ckpt / "other" / "epoch=0-step=4.ckpt"
    for f in (a, b):
        f.parent.mkdir(parents=True)
        f.write_bytes(b"weights")
    return a, b


def test_a_ckpt_file_is_leased_by_its_path_in_the_run_dir(ckpt: Path) -> None:
    a, _ = ckpt_files(ckpt)
    name_a, name_b = NAME_A, NAME_B
    held = leases.acquire(ckpt, a, ttl=60, holder="eval")
    assert held.checkpoint == name_a
    assert leases.leased(ckpt, {name_a, name_b}) == {name_a}  # the same basename is not held
    [lease_file] = (ckpt / "leases").iterdir()  # one flat file, named after the whole path
    assert lease_file.name.startswith(NAME_A.replace("/", "%2F") + "--")
    assert [(x.id, x.checkpoint) for x in leases.active(ckpt)] == [(held.id, name_a)]
    other = leases.acquire(ckpt, "other/epoch=0-step=4.ckpt", ttl=60)  # relative: the run dir's
    assert leases.leased(ckpt, {name_a, name_b}) == {name_a, name_b}
    assert leases.renew(ckpt, held).expires >= held.expires
    assert leases.release(ckpt, held.id) == name_a
    assert leases.leased(ckpt, {name_a, name_b}) == {name_b}
    leases.drop(ckpt, other)
    assert leases.leased(ckpt, {name_a, name_b}) == set()


def test_a_directory_checkpoint_keeps_its_plain_lease_file_name(ckpt: Path) -> None:
    (ckpt / "checkpoints" / "step-000004").mkdir(parents=True)
    held = leases.acquire(ckpt, ckpt / "checkpoints" / "step-000004", ttl=60)
    assert [f.name for f in (ckpt / "leases").iterdir()] == [f"step-000004--{held.id}.json"]


def test_a_ckpt_file_outside_the_run_dir_is_refused_in_one_line(ckpt: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "epoch=0-step=4.ckpt"
    outside.parent.mkdir()
    outside.write_bytes(b"weights")
    (ckpt / "link.ckpt").symlink_to(outside)  # a link inside that leads out is outside too
    for path in (outside, ckpt / "link.ckpt", ckpt / ".." / "elsewhere" / outside.name):
        with pytest.raises(leases.LeaseError, match="not a checkpoint of"):
            leases.acquire(ckpt, path)
    proc = cli("ilab-journal", "lease", str(ckpt), str(outside))
    assert proc.returncode == 2 and "not a checkpoint of" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    with pytest.raises(leases.LeaseError, match="no such checkpoint"):
        leases.acquire(ckpt, ckpt / "missing.ckpt")
    with pytest.raises(leases.LeaseError, match="not a checkpoint directory"):
        leases.acquire(ckpt, ckpt / "journal.jsonl")
    assert not (ckpt / "leases").exists()


def test_a_ckpt_file_leased_and_released_from_the_cli(ckpt: Path) -> None:
    a, _ = ckpt_files(ckpt)
    name = NAME_A
    lease = cli("ilab-journal", "lease", str(ckpt), str(a), "--ttl", "60")
    assert lease.returncode == 0, lease.stderr
    assert leases.leased(ckpt, {name}) == {name}
    assert cli("ilab-journal", "release", str(ckpt), lease.stdout.strip()).returncode == 0
    assert leases.leased(ckpt, {name}) == set()


def test_a_long_ckpt_path_gets_a_lease_file_name_the_file_system_takes(ckpt: Path) -> None:
    deep = ckpt.joinpath(*["a-rather-long-directory-name"] * 8, "epoch=0-step=4.ckpt")
    deep.parent.mkdir(parents=True)
    deep.write_bytes(b"weights")
    held = leases.acquire(ckpt, deep, ttl=60)
    [lease_file] = (ckpt / "leases").iterdir()
    assert len(lease_file.name) < 255
    assert leases.leased(ckpt, {held.checkpoint}) == {held.checkpoint}
    leases.release(ckpt, held.id)
    assert leases.leased(ckpt, {held.checkpoint}) == set()


def test_the_watcher_leases_the_ckpt_file_of_a_save(ckpt: Path) -> None:
    a, _ = ckpt_files(ckpt)
    keeper = LeaseKeeper(ckpt, ttl=60, holder="watcher:test")
    lease_id = keeper.take(str(a))
    assert lease_id is not None
    name = NAME_A
    assert leases.leased(ckpt, {name}) == {name}
    keeper.release(lease_id)
    assert leases.leased(ckpt, {name}) == set()


def test_leases_of_a_killed_watcher_stop_holding_checkpoints_after_the_run(ckpt: Path) -> None:
    """Issue 43: a watcher killed with ``kill -9`` while its saves are queued leaves leases
    that expire; the run has ended, so no save rotates any more. ``status`` says which
    checkpoints beyond keep_last_n nothing holds now, and ``prune`` removes those, never one
    a live lease holds."""
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {"keep_last_n": 1}})
        for step in (1, 2, 3):
            path = make_checkpoint(ckpt, step, w.run_id)
            save = {"checkpoint_path": str(path), "kind": ["full_state"], "duration": 0.1}
            w.append("save", save, step=step)
        w.append("train_end", {"status": "completed"}, step=3)
    first, second, last = (ckpt / "checkpoints" / f"step-{s:06d}" for s in (1, 2, 3))
    watcher = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--on-save", "sleep 60", "--lease-ttl", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:  # every queued save is leased: the first one's delivery runs, two wait
        wait_for(lambda: len(list((ckpt / "leases").glob("*.json"))) == 3, 60, "3 leases")
    finally:
        watcher.kill()  # kill -9: nothing is released
        watcher.wait()
    wait_for(lambda: not leases.active(ckpt), 30, "the leases to expire")

    status = cli("ilab-journal", "status", str(ckpt))
    assert status.returncode == 0, status.stderr
    assert (
        "2 checkpoint(s) beyond keep_last_n=1 that no lease holds; 2 expired lease(s) on them "
        f"hold nothing; ilab-journal prune {ckpt} removes them"
    ) in status.stdout
    held = cli("ilab-journal", "lease", str(ckpt), "step-000002", "--ttl", "600")  # a live one
    assert held.returncode == 0, held.stderr
    as_json = json.loads(cli("ilab-journal", "status", str(ckpt), "--json").stdout)
    assert as_json["prunable_checkpoints"] == [str(first)]

    pruned = cli("ilab-journal", "prune", str(ckpt))
    assert pruned.returncode == 0 and pruned.stdout.split() == [str(first)], pruned.stderr
    assert not first.exists() and second.exists() and last.exists()
    assert "retention" not in cli("ilab-journal", "status", str(ckpt)).stdout
    assert cli("ilab-journal", "release", str(ckpt), held.stdout.strip()).returncode == 0
    assert cli("ilab-journal", "prune", str(ckpt)).stdout.split() == [str(second)]


# -- "Hardening 4", item 2: a killed watcher's successor takes its leases over --------------

HOLD = 'while [ ! -e "$GO" ]; do sleep 0.05; done'  # a hook that runs until the test says go


def _lease_files(ckpt: Path) -> dict[str, dict[str, Any]]:
    """Each lease file's lease, by id (unreadable ones, being renamed, left out)."""
    out = {}
    for path in (ckpt / "leases").glob("*.json"):
        try:
            obj = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out[obj["id"]] = obj
    return out


def _watcher(ckpt: Path, state: Path, go: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``ilab-watch`` on cursor 'evals' with a hook that runs until ``go`` exists; leases
    that outlive it by 600 s unless someone releases them."""
    argv = [str(BIN / "ilab-watch"), str(ckpt), "--on-save", HOLD, "--shell", "--name", "evals"]
    argv += ["--state-dir", str(state), "--lease-ttl", "600", *extra]
    return subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "GO": str(go), "OMP_NUM_THREADS": "1"},
    )


def _two_saves(ckpt: Path) -> None:
    """A run still training (``keep_last_n`` 1) that saved steps 1 and 2."""
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {"keep_last_n": 1}})
        for step in (1, 2):
            path = make_checkpoint(ckpt, step, w.run_id)
            save = {"checkpoint_path": str(path), "kind": ["full_state"], "duration": 0.1}
            w.append("save", save, step=step)


def _killed_with_two_leases(ckpt: Path, state: Path, go: Path) -> dict[str, dict[str, Any]]:
    """Two saves of a run still training; a watcher delivering the first (the second
    queued) killed with ``kill -9``: the two leases it held, by id."""
    _two_saves(ckpt)
    first = _watcher(ckpt, state, go)
    try:
        held = wait_for(lambda: len(_lease_files(ckpt)) == 2 and _lease_files(ckpt), 60, "leases")
    finally:
        first.kill()  # kill -9: nothing is released
        first.wait()
    assert {lease["holder"].rpartition(":")[2] for lease in held.values()} == {str(first.pid)}
    return held


def test_a_successor_takes_over_the_leases_of_a_killed_watcher(ckpt: Path, tmp_path: Path) -> None:
    state, go = tmp_path / "state", tmp_path / "go"
    dead = _killed_with_two_leases(ckpt, state, go)
    successor = _watcher(ckpt, state, go)
    try:
        # Delivering both saves again, it holds both checkpoints: with the same leases, made
        # its own at its start, not a second pair beside the dead watcher's.
        def taken_over() -> bool:
            now = _lease_files(ckpt)
            return now.keys() == dead.keys() and all(
                lease["holder"].endswith(f":{successor.pid}") for lease in now.values()
            )

        wait_for(taken_over, 60, "the successor to hold the dead watcher's leases")
        go.touch()
        with JournalWriter(ckpt, resume=True) as w:
            w.append("train_end", {"status": "completed"}, step=2)
        assert successor.wait(timeout=60) == 0
    finally:
        if successor.poll() is None:
            successor.kill()
            successor.wait()
    assert _lease_files(ckpt) == {}  # its deliveries done: nothing holds the checkpoints


def test_a_successor_releases_the_leases_it_does_not_need(ckpt: Path, tmp_path: Path) -> None:
    state, go = tmp_path / "state", tmp_path / "go"
    dead = _killed_with_two_leases(ckpt, state, go)
    first = ckpt / "checkpoints" / "step-000001"
    shutil.rmtree(first)  # removed meanwhile (by hand): its save is skipped, not delivered
    with JournalWriter(ckpt, resume=True) as w:
        w.append("checkpoint_removed", {"checkpoint_path": str(first), "reason": "by hand"}, step=2)
    successor = _watcher(ckpt, state, go)
    try:
        # As soon as it has read the journal, while its delivery of the second save runs,
        # only that save's lease is left (its own now); the first one's is gone.
        second = next(i for i, lease in dead.items() if lease["checkpoint"] == "step-000002")

        def only_the_second() -> bool:
            now = _lease_files(ckpt)
            return list(now) == [second] and now[second]["holder"].endswith(f":{successor.pid}")

        wait_for(only_the_second, 60, "only the second save's lease, the successor's")
        assert successor.poll() is None  # released while it runs, not at its exit
    finally:
        go.touch()
        successor.kill()
        successor.wait()


def _mirror(ckpt: Path, port: int) -> subprocess.Popen[bytes]:
    """A mirroring ``ilab-watch`` whose store never answers (nothing listens on ``port``):
    it leases every save it reads and holds the leases while it waits for the store."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    env |= {"AWS_ACCESS_KEY_ID": "ilab", "AWS_SECRET_ACCESS_KEY": "ilab-test"}
    argv = [str(BIN / "ilab-watch"), str(ckpt), "--mirror", "s3://ilab-leases/run"]
    argv += ["--lease-ttl", "600"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def test_a_mirrors_successor_takes_over_its_leases(ckpt: Path) -> None:
    """A mirroring watcher killed with ``kill -9`` while its uploads wait for the store:
    its successor makes the dead one's leases its own at its start (same ids), and lets go
    of the one whose checkpoint was removed meanwhile, instead of both waiting out the
    600 s ttl."""
    _two_saves(ckpt)
    port = free_port()
    first = _mirror(ckpt, port)
    try:
        dead = wait_for(lambda: len(_lease_files(ckpt)) == 2 and _lease_files(ckpt), 60, "leases")
    finally:
        first.kill()  # kill -9: nothing is released
        first.wait()
    assert {lease["holder"].rpartition(":")[2] for lease in dead.values()} == {str(first.pid)}
    removed = ckpt / "checkpoints" / "step-000001"
    shutil.rmtree(removed)  # removed meanwhile: its save is not uploaded, its lease not needed
    with JournalWriter(ckpt, resume=True) as w:
        w.append("checkpoint_removed", {"checkpoint_path": str(removed), "reason": "x"}, step=2)
    second = next(i for i, lease in dead.items() if lease["checkpoint"] == "step-000002")
    successor = _mirror(ckpt, port)
    try:

        def only_the_second_as_its_own() -> bool:
            now = _lease_files(ckpt)
            return list(now) == [second] and now[second]["holder"].endswith(f":{successor.pid}")

        wait_for(only_the_second_as_its_own, 60, "the successor to hold only the second lease")
        assert successor.poll() is None  # taken over at its start, not at its exit
    finally:
        successor.kill()
        successor.wait()
