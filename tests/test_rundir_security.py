"""A run dir nobody else can steer (issue 18, item 2): a directory another user owns or can
write is refused with one line and exit 2 before anything is written; the journal and lock
files are never opened through a symlink or as a FIFO."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from journal import JournalWriter
from journal.rundir.lock import JournalLock, RunLock, lock_holder
from journal.rundir.safety import (
    STEERING_DIRS,
    WRITTEN_DIRS,
    UnsafeRunDir,
    check_run_dir,
    dir_problem,
)
from tests.helpers import BIN, begin_payload, cli, make_checkpoint, records, wait_for, write_run

OTHER_UID = 4242  # no such user here: a uid that is neither ours nor root's
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="giving a directory to another user (chown) needs root"
)


def _untouched(run: Path) -> None:
    """Nothing of a launch was written: no lock, no logs, no journal."""
    for name in ("run.lock", "journal.lock", "logs", "journal.jsonl"):
        assert not (run / name).exists(), name


def _train(run: Path) -> tuple[int, str]:
    proc = cli("ilab-train", "--demo", "--ckpt-dir", str(run), "--max-steps", "2", timeout=60)
    return proc.returncode, proc.stderr


@needs_root
def test_ilab_train_refuses_a_run_dir_owned_by_another_user(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    os.chown(run, OTHER_UID, OTHER_UID)
    rc, err = _train(run)
    assert rc == 2, err
    assert err.strip() == (
        f"ilab-train: {run}: owned by uid {OTHER_UID}, not by you (root): its owner "
        "could steer or take over the run; use a directory of your own"
    )
    _untouched(run)


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o1777])
def test_ilab_train_refuses_a_run_dir_others_can_write(tmp_path: Path, mode: int) -> None:
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(mode)
    rc, err = _train(run)
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith(f"ilab-train: {run}: writable by ")
    assert f"`chmod go-w {run}`" in lines[0]
    _untouched(run)


@pytest.mark.parametrize("sub", STEERING_DIRS)
def test_a_steering_subdir_others_can_write_or_own_is_refused(tmp_path: Path, sub: str) -> None:
    run = tmp_path / "run"
    (run / sub).mkdir(parents=True, mode=0o750)
    check_run_dir(run)  # ours alone: fine
    (run / sub).chmod(0o770)
    with pytest.raises(UnsafeRunDir, match=rf"^{run / sub}: writable by its group \(mode 770\)"):
        check_run_dir(run)
    if os.geteuid() == 0:
        (run / sub).chmod(0o750)
        os.chown(run / sub, OTHER_UID, OTHER_UID)
        with pytest.raises(UnsafeRunDir, match=f"owned by uid {OTHER_UID}"):
            check_run_dir(run)


@needs_root
def test_ilab_train_refuses_a_control_dir_planted_by_another_user(tmp_path: Path) -> None:
    """The attack of the issue: someone else's control/ (with an abort in it) in our dir."""
    run = tmp_path / "run"
    (run / "control").mkdir(parents=True, mode=0o755)
    (run / "control" / "x.json").write_text('{"command": "abort"}')
    os.chown(run / "control", OTHER_UID, OTHER_UID)
    rc, err = _train(run)
    assert rc == 2 and f"ilab-train: {run / 'control'}: owned by uid {OTHER_UID}" in err, err
    _untouched(run)


def test_root_owned_directories_are_trusted_by_every_user(tmp_path: Path) -> None:
    """Root can do anything anyway: a root-owned dir is not "another user's"; any other
    owner is, for everyone else."""
    assert os.stat("/").st_uid == 0
    assert dir_problem("/", os.stat("/"), 1000) is None
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o750)
    owner = os.stat(mine).st_uid
    if owner != 0:
        why = dir_problem(mine, os.stat(mine), owner + 1)
        assert why is not None and why.startswith("owned by ")


@pytest.mark.parametrize("name", ["journal.jsonl", "journal.lock", "run.lock"])
def test_a_planted_symlink_is_refused_and_its_target_untouched(tmp_path: Path, name: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"secret\n")
    victim.chmod(0o600)
    (run / name).symlink_to(victim)
    rc, err = _train(run)
    assert rc == 2, err
    assert err.strip() == (
        f"ilab-train: {run / name}: a symbolic link: refusing to follow it (remove it)"
    )
    # The writer and the locks refuse it too, whoever calls them (bridges, reports, ...).
    with pytest.raises(UnsafeRunDir, match="symbolic link"):
        if name == "journal.jsonl":
            JournalWriter(run)
        elif name == "journal.lock":
            JournalLock(run, role="test").try_acquire()
        else:
            RunLock(run).try_acquire()
    assert victim.read_bytes() == b"secret\n"


def test_a_fifo_in_place_of_the_journal_or_a_lock_never_hangs(tmp_path: Path) -> None:
    """Opening a FIFO for writing blocks until someone reads it: refused instead."""
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "journal.jsonl")
    with pytest.raises(UnsafeRunDir, match="not a regular file"):
        JournalWriter(run)
    os.mkfifo(run / "journal.lock")
    with pytest.raises(UnsafeRunDir, match="not a regular file"):
        JournalLock(run, role="test").try_acquire()
    assert lock_holder(run) is None  # `status` asks who holds it: no hang either


@needs_root
def test_a_journal_file_of_another_user_is_not_appended_to(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run(run, steps=2)
    before = (run / "journal.jsonl").read_bytes()
    os.chown(run / "journal.jsonl", OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeRunDir, match=f"journal.jsonl: owned by uid {OTHER_UID}"):
        JournalWriter(run, resume=True)
    assert (run / "journal.jsonl").read_bytes() == before


def test_dirs_made_by_the_writer_and_locks_are_ours_alone_whatever_the_umask(
    tmp_path: Path,
) -> None:
    """With umask 002 (common for users with a group of their own) a plain mkdir makes a
    group-writable dir, which the next launch would refuse."""
    old = os.umask(0o002)
    try:
        with JournalWriter(tmp_path / "a" / "run") as w:
            w.append("log", {"loss": 1.0})
        lock = RunLock(tmp_path / "b" / "run")
        assert lock.try_acquire()
        lock.release()
    finally:
        os.umask(old)
    for run in (tmp_path / "a" / "run", tmp_path / "b" / "run"):
        assert stat.S_IMODE(run.stat().st_mode) == 0o750
        check_run_dir(run)
    with JournalWriter(tmp_path / "a" / "run", resume=True) as w:  # and a resume works
        assert w.seq == 1


@needs_root
def test_ilab_journal_report_does_not_append_to_another_users_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run(run, steps=2)
    before = (run / "journal.jsonl").read_bytes()
    os.chown(run, OTHER_UID, OTHER_UID)
    proc = cli("ilab-journal", "report", str(run), "accuracy=0.5", "--checkpoint", "step-000002")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().endswith(
        f"{run}: owned by uid {OTHER_UID}, not by you (root): its owner could steer "
        "or take over the run; use a directory of your own"
    )
    assert "Traceback" not in proc.stderr
    assert (run / "journal.jsonl").read_bytes() == before


# -- no write through a symlink inside a run dir (issue 58, item 2) ---------------------------


def _hung_nccl_run(run: Path, rank_pid: int) -> None:
    """A journal claiming an NCCL run on CUDA whose rank 0 (the test's own process) made
    one step and then went quiet: a hang for ``ilab-watch --hang-after 1``."""
    from watcher.alerts.processes import this_host

    with JournalWriter(run) as w:
        ranks = [{"rank": 0, "pid": rank_pid, "host": this_host()}]
        w.append(
            "train_begin",
            {**begin_payload(10), "backend": "nccl", "device_type": "cuda", "ranks": ranks},
        )
        w.append("step_end", {"loss": 1.0}, step=1)


@pytest.mark.parametrize("link", ["pipe", "directory"])
def test_a_hang_alert_never_writes_through_a_symlinked_flight_recorder(
    tmp_path: Path, link: str
) -> None:
    """The attack of the issue: the flight recorder's pipe (or its directory) linked to a
    file elsewhere; a watcher asking for the dump must not write into that file."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "pipe_rank_0.pipe"
    victim.write_bytes(b"precious bytes\n")
    (run / "logs").mkdir(parents=True, mode=0o750)
    recorder = run / "logs" / "flight-recorder"
    if link == "pipe":
        recorder.mkdir(mode=0o750)
        (recorder / "pipe_rank_0.pipe").symlink_to(victim)
        refused = recorder / "pipe_rank_0.pipe"
    else:
        recorder.symlink_to(elsewhere, target_is_directory=True)
        refused = recorder
    rank = subprocess.Popen(["sleep", "120"])
    watch = None
    try:
        _hung_nccl_run(run, rank.pid)
        watch = subprocess.Popen(
            [str(BIN / "ilab-watch"), str(run), "--hang-after", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        alert = wait_for(
            lambda: next((r for r in records(run) if r["event"] == "alert"), None), 60, "alert"
        )
    finally:
        for proc in (watch, rank):
            if proc is not None:
                proc.kill()
                proc.wait()
    assert victim.read_bytes() == b"precious bytes\n"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["pipe_rank_0.pipe"]
    line = f"flight recorder of rank 0 not captured: {refused}: a symbolic link: refusing"
    assert any(m.startswith(line) for m in alert["data"]["missing"]), alert["data"]["missing"]


@pytest.mark.parametrize("sub", WRITTEN_DIRS)
def test_a_symlinked_subdir_is_refused_by_the_watcher_with_one_line(
    tmp_path: Path, sub: str
) -> None:
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    write_run(run, steps=2)
    elsewhere.mkdir()
    (run / sub).symlink_to(elsewhere, target_is_directory=True)
    proc = cli("ilab-watch", str(run), "--hang-after", "5", "--on-save", "true", timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].endswith(f"{run / sub}: a symbolic link: refusing to follow it (remove it)")
    assert "Traceback" not in proc.stderr
    assert list(elsewhere.iterdir()) == []


def test_ilab_train_refuses_a_symlinked_logs_dir_before_writing(tmp_path: Path) -> None:
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    (run / "logs").symlink_to(elsewhere, target_is_directory=True)
    rc, err = _train(run)
    assert rc == 2, err
    assert (
        err.strip()
        == f"ilab-train: {run / 'logs'}: a symbolic link: refusing to follow it (remove it)"
    )
    assert list(elsewhere.iterdir()) == []


def test_every_writer_refuses_a_symlink_planted_below_the_run_dir_after_the_start(
    tmp_path: Path,
) -> None:
    """What the start-up check cannot see: links planted while the run goes on. Each
    writer refuses them with one line naming the link and writes nothing through it."""
    from journal.channels.control import send_command
    from journal.channels.reports import Report, submit_report
    from journal.checkpoints.leases import acquire
    from journal.rundir.phase import Phase, write_phase
    from watcher.alerts.alert import evidence_dir
    from watcher.alerts.evidence import collect
    from watcher.alerts.processes import ProcessView
    from watcher.engine.cursor import CursorFile, CursorState
    from watcher.engine.statedir import StateFiles

    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    write_run(run, steps=4)
    make_checkpoint(run, 4, None)
    elsewhere.mkdir()
    refusal = "a symbolic link: refusing to follow it (remove it)"
    writes = {
        "control": lambda: send_command(run, "stop"),
        "reports": lambda: submit_report(run, Report({"acc": 1.0}, checkpoint_path="step-000004")),
        "leases": lambda: acquire(run, "step-000004", ttl=60),
        "watch": lambda: CursorFile(StateFiles.of(run / "watch", "w", run)).save(CursorState()),
    }
    for sub, write in writes.items():
        (run / sub).symlink_to(elsewhere, target_is_directory=True)
        with pytest.raises(UnsafeRunDir) as got:
            write()
        assert str(got.value) == f"{run / sub}: {refusal}"
        (run / sub).unlink()
    (run / "alerts").symlink_to(elsewhere, target_is_directory=True)
    ev = collect(run, evidence_dir(run, "a1"), ProcessView(), summary="hang", nccl=False)
    assert ev.files == [] and ev.missing == [f"no evidence captured: {run / 'alerts'}: {refusal}"]
    assert list(elsewhere.iterdir()) == []
    # a file replaced whole (phase.json, a cursor, abort.json) replaces a link, never follows it
    victim = tmp_path / "victim"
    victim.write_bytes(b"secret\n")
    (run / "phase.json").symlink_to(victim)
    write_phase(run, Phase("save", 1.0))
    assert victim.read_bytes() == b"secret\n" and not (run / "phase.json").is_symlink()
