"""The mirror with real 2-rank runs against a real S3 server (SeaweedFS, the ``s3``
fixture): rotation followed, a mirroring watcher killed mid-upload, a run dir lost and
restored, the store down for 20 s. Each is a real launch: extended."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from journal.remote.layout import marked_checkpoints
from journal.remote.store import Store
from tests.helpers import BIN, kill_tree, records, train, train_argv, train_env, wait_for
from tests.test_mirror import journal_in, local_files, snapshot, stored_files

pytestmark = [pytest.mark.extended, pytest.mark.dist]


def watch(ckpt: Path, uri: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--mirror", uri, *extra],
        env=train_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def in_store(store: Store) -> dict[str, set[str]]:
    """Checkpoint prefixes in the store: marked, and any with files at all."""
    listing = store.listing("checkpoints/")
    return {
        "marked": marked_checkpoints(listing),
        "any": {"/".join(k.split("/")[:2]) for k in listing},
    }


def assert_marked_complete(store: Store, ckpt: Path, names: set[str]) -> None:
    for name in names:
        files = stored_files(store, name)
        del files[".upload_complete"]
        assert files == local_files(ckpt / name), name


def test_rotation_with_a_mirroring_watcher(tmp_path: Path, s3: Any) -> None:
    ckpt, uri = tmp_path / "run", s3.fresh_uri() + "/rot"
    watcher = watch(ckpt, uri)
    run = train(ckpt, "--max-steps", "12", "--save-every", "2", "--keep-last-n", "2")
    assert run.returncode == 0, run.stderr[-3000:]
    _, err = watcher.communicate(timeout=120)
    assert watcher.returncode == 0, err
    store = Store(uri)
    local = {f"checkpoints/{p.name}" for p in (ckpt / "checkpoints").glob("step-*")}
    assert local == {"checkpoints/step-000010", "checkpoints/step-000012"}
    assert in_store(store) == {"marked": local, "any": local}  # rotated ones are gone
    assert_marked_complete(store, ckpt, local)
    assert journal_in(store) == (ckpt / "journal.jsonl").read_bytes()
    mirrored = [r for r in records(ckpt) if r["event"] == "report"]
    assert len(mirrored) == 6, [r["data"] for r in records(ckpt) if r["event"] == "control"]
    assert all(r["data"]["metrics"]["mirror_bytes"] > 0 for r in mirrored)


def test_a_mirroring_watcher_killed_mid_upload_finishes_on_restart(tmp_path: Path, s3: Any) -> None:
    ckpt, uri = tmp_path / "run", s3.fresh_uri() + "/kill"
    store = Store(uri)
    job = subprocess.Popen(
        train_argv(ckpt, "--max-steps", "8", "--save-every", "2"),
        env=train_env(step_delay=0.3),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    watcher = watch(ckpt, uri)
    seen_marked: set[str] = set()

    def mid_upload() -> bool:
        now = in_store(store)
        for name in now["marked"] - seen_marked:  # never a marker on an incomplete one
            assert_marked_complete(store, ckpt, {name})
            seen_marked.add(name)
        return bool(now["any"] - now["marked"])

    def frozen_mid_upload() -> bool:
        """The watcher stopped (SIGSTOP: nothing moves) with an upload unfinished; an upload
        that ended between the look and the stop lets it go on, to be caught at the next."""
        if not mid_upload():
            return False
        os.kill(watcher.pid, signal.SIGSTOP)
        if mid_upload():
            return True
        os.kill(watcher.pid, signal.SIGCONT)
        return False

    try:
        wait_for(frozen_mid_upload, timeout=120, what="a checkpoint half uploaded")
        kill_tree(watcher.pid)
        watcher.wait()
        partial = in_store(store)
        watcher = watch(ckpt, uri)
        assert job.wait(240) == 0, job.stderr.read()[-3000:] if job.stderr else ""
        _, err = watcher.communicate(timeout=120)
        assert watcher.returncode == 0, err
    finally:
        kill_tree(job.pid)
        kill_tree(watcher.pid)
    assert partial["any"] - partial["marked"]  # it was killed with an upload unfinished
    final = in_store(store)
    local = {f"checkpoints/{p.name}" for p in (ckpt / "checkpoints").glob("step-*")}
    assert final == {"marked": local, "any": local}
    assert_marked_complete(store, ckpt, local)
    assert journal_in(store) == (ckpt / "journal.jsonl").read_bytes()


def test_a_lost_run_dir_is_restored_at_the_last_mirrored_step(tmp_path: Path, s3: Any) -> None:
    """3 of 6 saves mirrored, the run dir deleted, a relaunch with --restore-from resumes
    at the last mirrored step with the losses of an uninterrupted run."""
    ref, victim, uri = tmp_path / "ref", tmp_path / "victim", s3.fresh_uri() + "/lost"
    args = ("--max-steps", "12", "--save-every", "2", "--seed", "7")
    ref_proc = subprocess.Popen(
        train_argv(ref, *args), env=train_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    job = subprocess.Popen(
        train_argv(victim, *args),
        env=train_env(step_delay=0.5),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    watcher = watch(victim, uri)
    store = Store(uri)
    try:
        wait_for(
            lambda: "checkpoints/step-000006" in in_store(store)["marked"],
            timeout=180,
            what="the third save in the store",
        )
    finally:
        kill_tree(job.pid)
        kill_tree(watcher.pid)
        job.wait()
        watcher.wait()
    _, ref_err = ref_proc.communicate(timeout=240)
    assert ref_proc.returncode == 0, ref_err[-3000:]
    last = max(in_store(store)["marked"])
    shutil.rmtree(victim)
    proc = train(victim, *args, "--restore-from", uri)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"restored {last}" in proc.stderr
    resumed_at = int(last.rsplit("-", 1)[1])
    recs = records(victim)
    attempts = sorted({r["attempt"] for r in recs})
    second = [r for r in recs if r["attempt"] == attempts[-1]]
    assert len(attempts) == 2
    assert second[0]["data"]["resumed_from"].endswith(last)
    assert [r["seq"] for r in recs] == list(range(recs[0]["seq"], recs[0]["seq"] + len(recs)))
    ref_loss = {r["step"]: r["data"]["loss"] for r in records(ref) if r["event"] == "log"}
    got_loss = {r["step"]: r["data"]["loss"] for r in second if r["event"] == "log"}
    assert sorted(got_loss) == list(range(resumed_at + 1, 13))
    for step in got_loss:
        assert got_loss[step] == pytest.approx(ref_loss[step], rel=1e-5, abs=1e-5), step


def step_times(ckpt: Path) -> dict[int, tuple[float, float]]:
    """step -> (its step_end's time, its duration from step_begin)."""
    begins: dict[int, float] = {}
    out = {}
    for r in records(ckpt):
        if r["event"] == "step_begin":
            begins[r["step"]] = r["ts"]
        elif r["event"] == "step_end" and r["step"] - 1 in begins:
            out[r["step"]] = (r["ts"], r["ts"] - begins[r["step"] - 1])
    return out


def test_the_store_down_for_20s_never_stops_training(tmp_path: Path, s3: Any) -> None:
    """Training steps on through the outage (how fast: benchmarks/bench_mirror.py, which
    times it; tests do not), the watcher says so, and the mirror catches up after."""
    ckpt, uri = tmp_path / "run", s3.fresh_uri() + "/down"
    job = subprocess.Popen(
        train_argv(ckpt, "--max-steps", "80", "--save-every", "10", "--keep-last-n", "2"),
        env=train_env(step_delay=0.4),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    watcher = watch(ckpt, uri)
    store = Store(uri)
    try:
        wait_for(lambda: in_store(store)["marked"], timeout=180, what="a first checkpoint")
        down_at = time.time()
        s3.stop()
        wait_for(lambda: time.time() - down_at >= 20, timeout=30, what="20 s of outage")
        up_at = time.time()
        s3.start()
        assert job.wait(300) == 0, job.stderr.read()[-3000:] if job.stderr else ""
        _, err = watcher.communicate(timeout=180)
        assert watcher.returncode == 0, err
    finally:
        kill_tree(job.pid)
        kill_tree(watcher.pid)
    assert "does not answer" in err and "answers again" in err
    times = step_times(ckpt)
    during = [d for ts, d in times.values() if down_at <= ts <= up_at]
    outside = [d for ts, d in times.values() if not down_at - 1 <= ts <= up_at + 1]
    assert len(during) >= 10 and outside, during  # steps went on while the store was down
    local = {f"checkpoints/{p.name}" for p in (ckpt / "checkpoints").glob("step-*")}
    assert in_store(store) == {"marked": local, "any": local}  # caught up
    assert journal_in(store) == (ckpt / "journal.jsonl").read_bytes()


EVAL = """\
import json, os
rec = json.load(open(os.environ["ILAB_EVENT_FILE"]))
assert os.listdir(os.path.join(rec["data"]["checkpoint_path"], "full_state"))
with open({out!r}, "a") as f:
    f.write(json.dumps(rec["step"]) + "\\n")
with open(os.environ["ILAB_REPORT"], "w") as f:
    json.dump({{"accuracy": 1 - abs(rec["step"] - 4) / 100}}, f)
"""


def test_a_watcher_elsewhere_evaluates_every_save_and_keep_best_hears_it(
    tmp_path: Path, s3: Any
) -> None:
    """A second directory, standing in for another machine, runs ``ilab-watch URI --on-save
    eval.py``: every save is evaluated once, and the best one's report, come back through
    the store, keeps it from rotation on the training side."""
    ckpt, uri = tmp_path / "run", s3.fresh_uri() + "/eval"
    out, script = tmp_path / "evaluated.jsonl", tmp_path / "eval.py"
    script.write_text(EVAL.format(out=str(out)))
    args = ("--max-steps", "16", "--save-every", "4", "--keep-last-n", "2")
    job = subprocess.Popen(
        train_argv(ckpt, *args, "--keep-best", "accuracy:max"),
        env=train_env(step_delay=0.5),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    mirroring = watch(ckpt, uri)
    remote = subprocess.Popen(
        [
            str(BIN / "ilab-watch"),
            uri,
            "--on-save",
            str(script),
            "--download",
            str(tmp_path / "elsewhere"),
        ],
        env=train_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: journal_in(Store(uri)), timeout=120, what="the journal's first segment")
    tail = subprocess.Popen(  # a reader elsewhere, following too
        [str(BIN / "ilab-journal"), "tail", "-f", uri, "--json", "-n", "1000"],
        env=train_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert job.wait(300) == 0, job.stderr.read()[-3000:] if job.stderr else ""
        _, err = remote.communicate(timeout=180)
        assert remote.returncode == 0, err
        _, err = mirroring.communicate(timeout=180)
        assert mirroring.returncode == 0, err
        followed, err = tail.communicate(timeout=60)
        assert tail.returncode == 0, err
    finally:
        for p in (job, mirroring, remote, tail):
            kill_tree(p.pid)
    seqs = [json.loads(line)["seq"] for line in followed.splitlines()]
    ended = max(r["seq"] for r in records(ckpt) if r["event"] == "train_end")
    # every record to train_end, in order (and what came with it: reports after the end)
    assert seqs[: ended + 1] == list(range(0, ended + 1)), seqs
    assert [json.loads(line) for line in out.read_text().splitlines()] == [4, 8, 12, 16]
    local = sorted(p.name for p in (ckpt / "checkpoints").glob("step-*"))
    assert local == ["step-000004", "step-000012", "step-000016"]  # 4: the best, by its report
    assert "checkpoints/step-000004" in in_store(Store(uri))["marked"]


def test_a_mirror_refused_for_another_runs_prefix_leaves_it_as_it_was(
    tmp_path: Path, s3: Any
) -> None:
    """Run A is mirrored (3 saves); run B trains with ``--keep-last-n 1`` and its mirror is
    given A's URI: refused in one line (exit 1) once B's journal begins, and A's prefix is
    byte for byte as it was (B's rotation deleted none of A's same-named checkpoints there,
    B's saves went nowhere); B rotates as without a mirror."""
    a, b, uri = tmp_path / "a", tmp_path / "b", s3.fresh_uri() + "/m6"
    args = ("--max-steps", "6", "--save-every", "2")
    mirroring = watch(a, uri)
    run = train(a, *args)
    assert run.returncode == 0, run.stderr[-3000:]
    _, err = mirroring.communicate(timeout=120)
    assert mirroring.returncode == 0, err
    store = Store(uri)
    assert len(in_store(store)["marked"]) == 3
    before = snapshot(store)
    mirroring = watch(b, uri)  # before B's journal exists, as beside a launch
    try:
        run = train(b, *args, "--keep-last-n", "1")
        assert run.returncode == 0, run.stderr[-3000:]
        _, err = mirroring.communicate(timeout=120)
        assert sorted(p.name for p in (b / "checkpoints").glob("step-*")) == ["step-000006"]
        mirroring = watch(b, uri)  # and after B's run, its saves and removals journaled
        _, err2 = mirroring.communicate(timeout=120)
    finally:
        kill_tree(mirroring.pid)
    assert snapshot(store) == before
    for said in (err, err2):
        lines = [line for line in said.splitlines() if "give the mirror a new URI" in line]
        assert len(lines) == 1, said
    assert mirroring.returncode == 1, err2


def test_a_store_that_refuses_mid_run_leaves_rotation_as_without_a_mirror(
    tmp_path: Path, s3: Any
) -> None:
    """The bucket is deleted after the first checkpoint is in it, beside ``ilab-train
    --keep-last-n 1``: the mirror stops in one line (exit 2, no "does not answer"), lets go
    of its leases, and the run ends holding only its last checkpoint, as without a
    mirror."""
    import s3fs

    from journal.checkpoints.leases import active

    bucket = f"ilab-gone-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    ckpt, uri = tmp_path / "run", f"s3://{bucket}/run"
    job = subprocess.Popen(
        train_argv(ckpt, "--max-steps", "16", "--save-every", "2", "--keep-last-n", "1"),
        env=train_env(step_delay=0.5),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    mirroring = watch(ckpt, uri)
    try:
        wait_for(lambda: in_store(Store(uri))["marked"], timeout=180, what="a first checkpoint")
        s3fs.S3FileSystem(skip_instance_cache=True).rm(bucket, recursive=True)
        assert job.wait(300) == 0, job.stderr.read()[-3000:] if job.stderr else ""
        _, err = mirroring.communicate(timeout=120)
    finally:
        kill_tree(job.pid)
        kill_tree(mirroring.pid)
    assert mirroring.returncode == 2, err
    assert len([line for line in err.splitlines() if "mirror: stopped" in line]) == 1, err
    # An upload in flight when the bucket goes finds its files missing, which alone looks
    # like an outage: it may say so once before the next look at owner.json stops the mirror
    lines = err.splitlines()
    stop = next(i for i, line in enumerate(lines) if "mirror: stopped" in line)
    assert len([line for line in lines if "does not answer" in line]) <= 1, err
    assert all("does not answer" not in line for line in lines[stop:]), err
    assert "Traceback" not in err
    assert sorted(p.name for p in (ckpt / "checkpoints").glob("step-*")) == ["step-000016"]
    assert not active(ckpt)
