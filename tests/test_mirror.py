"""``ilab-watch DIR --mirror URI`` against a real S3 server (SeaweedFS on loopback, the
``s3`` fixture): checkpoints with their marker written last, the journal as segments that
concatenate to it byte for byte, rotation followed, a restart that finishes what a killed
mirror left, credentials refused in a URI. The live 2-rank scenarios are in
tests/test_mirror_runs.py (extended)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from journal import JournalWriter
from journal.remote.layout import JOURNAL_PREFIX, marked_checkpoints, segments
from journal.remote.store import Store
from tests.helpers import (
    BIN,
    cli,
    free_port,
    make_checkpoint,
    records,
    small_tmpfs,
    wait_for,
    write_run,
)


def mirror(
    ckpt: Path, uri: str, *extra: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return cli("ilab-watch", str(ckpt), "--mirror", uri, *extra, timeout=timeout)


def finished_run(ckpt: Path, steps: int = 10, save_every: int = 5) -> str:
    """A finished run's journal and its checkpoints (a few MB each); its run id."""
    write_run(ckpt, steps=steps, save_every=save_every)
    run_id = records(ckpt)[0]["run_id"]
    for step in range(save_every, steps + 1, save_every):
        path = make_checkpoint(ckpt, step, run_id)
        (path / "full_state" / "__0_0.distcp").write_bytes(os.urandom((1 << 20) + step))
    return run_id


def journal_in(store: Store) -> bytes:
    listing = store.listing(JOURNAL_PREFIX)
    return b"".join(read(store, s.key) for s in segments(listing))


def read(store: Store, key: str) -> bytes:
    """An object's bytes, all of them (the test's own read: no cap)."""
    return bytes(store.fs.cat_file(store.path(key)))


def local_files(path: Path) -> dict[str, int]:
    return {
        p.relative_to(path).as_posix(): p.stat().st_size for p in path.rglob("*") if p.is_file()
    }


def stored_files(store: Store, name: str) -> dict[str, int]:
    prefix = f"{name}/"
    return {k[len(prefix) :]: v for k, v in store.listing(prefix).items()}


def rotate_by_hand(ckpt: Path, *steps: int) -> None:
    """What rotation does in the run dir: ``checkpoint_removed`` journaled, the dir gone."""
    w = JournalWriter(ckpt, resume=True)
    for step in steps:
        path = ckpt / f"checkpoints/step-{step:06d}"
        w.append("checkpoint_removed", {"checkpoint_path": str(path), "reason": "keep_last_n"})
        subprocess.run(["rm", "-r", str(path)], check=True)
    w.close()


@pytest.mark.parametrize(
    "uri",
    [
        "s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/run",
        "s3://bucket/run?secret_access_key=wJalrXUtnFEMI",
        "s3://AKIAEXAMPLE@bucket/run",
        "s3://bucket/run?pass=wJalrXUtnFEMI",
        "s3://bucket/run#secret=wJalrXUtnFEMI",
        "s3://bucket/run?x=1&X-Amz-Credential=AKIAEXAMPLE",
        # percent-encoded: the name, the '&' and '=' around it, twice over, the '@'
        "s3://bucket/run?p%61ss=wJalrXUtnFEMI",
        "s3://bucket/run?x=1%26tok%65n%3DwJalrXUtnFEMI",
        "s3://bucket/run#s%2565cret=wJalrXUtnFEMI",
        "s3://AKIAEXAMPLE%3AwJalrXUtnFEMI%40bucket/run",
        "bucket/run?pass=wJalrXUtnFEMI",  # no scheme: said without repeating it all the same
    ],
)
def test_a_uri_with_a_secret_is_refused_in_one_line(ckpt: Path, uri: str) -> None:
    write_run(ckpt)
    r = mirror(ckpt, uri, "--replay", timeout=30)
    assert r.returncode == 2, r.stderr
    assert "wJalrXUtnFEMI" not in r.stderr + r.stdout and "AKIAEXAMPLE" not in r.stderr
    assert "Traceback" not in r.stderr
    assert "environment (AWS_ACCESS_KEY_ID" in r.stderr


@pytest.mark.parametrize(
    "argv",
    [("ilab-watch", "{uri}"), ("ilab-journal", "status", "{uri}")],
)
def test_a_percent_encoded_secret_is_never_printed(argv: tuple[str, ...]) -> None:
    """Was: ``?p%61ss=`` passed the check (the name was read encoded), and every line that
    names the store printed the secret. Now each command that takes a URI refuses it in one
    line that does not repeat it, before the store is asked anything."""
    uri = "s3://bucket/run?p%61ss=wJalrXUtnFEMI"
    r = cli(argv[0], *(a.format(uri=uri) for a in argv[1:]), timeout=30)
    assert r.returncode == 2, r.stderr
    assert "wJalrXUtnFEMI" not in r.stderr + r.stdout and "Traceback" not in r.stderr
    assert "refusing a s3:// URI with a credential parameter" in r.stderr


def test_a_finished_run_is_mirrored_marker_last_and_journaled(ckpt: Path, s3: Any) -> None:
    finished_run(ckpt)
    uri = s3.fresh_uri() + "/runs/a"
    r = mirror(ckpt, uri, "--replay")
    assert r.returncode == 0, r.stderr
    store = Store(uri)
    names = ["checkpoints/step-000005", "checkpoints/step-000010"]
    assert marked_checkpoints(store.listing("checkpoints/")) == set(names)
    for name in names:
        files = stored_files(store, name)
        marker = json.loads(read(store, f"{name}/.upload_complete"))
        del files[".upload_complete"]
        assert files == local_files(ckpt / name) == marker["files"]
    # what was sent is journaled, and the journal with those records is in the store
    sent = {
        Path(rec["data"]["checkpoint_path"]).name: rec["data"]["metrics"]
        for rec in records(ckpt)
        if rec["event"] == "report" and rec["data"]["source"] == "mirror"
    }
    assert set(sent) == {"step-000005", "step-000010"}
    assert sent["step-000005"]["mirror_bytes"] == sum(local_files(ckpt / names[0]).values())
    assert journal_in(store) == (ckpt / "journal.jsonl").read_bytes()
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    assert secret not in (ckpt / "journal.jsonl").read_text() + r.stderr
    # run again: nothing is sent twice
    again = mirror(ckpt, uri, "--replay")
    assert again.returncode == 0, again.stderr
    assert "0 checkpoint(s)" in again.stderr
    assert journal_in(store) == (ckpt / "journal.jsonl").read_bytes()


@pytest.mark.extended
def test_an_upload_cut_short_is_finished_and_only_then_marked(ckpt: Path, s3: Any) -> None:
    """What a mirror killed mid-upload leaves (some files, one of them short, no marker) is
    no checkpoint; the next mirror sends what is missing, then the marker."""
    finished_run(ckpt, steps=5)
    uri = s3.fresh_uri() + "/cut"
    store = Store(uri)
    name = "checkpoints/step-000005"
    store.put_bytes(f"{name}/full_state/__0_0.distcp", b"short")
    assert marked_checkpoints(store.listing("checkpoints/")) == set()
    r = mirror(ckpt, uri, "--replay")
    assert r.returncode == 0, r.stderr
    assert marked_checkpoints(store.listing("checkpoints/")) == {name}
    files = stored_files(store, name)
    del files[".upload_complete"]
    assert files == local_files(ckpt / name)


@pytest.mark.extended
def test_rotation_is_followed_except_what_a_remote_watcher_leases(ckpt: Path, s3: Any) -> None:
    finished_run(ckpt, steps=15)
    uri = s3.fresh_uri() + "/rot"
    assert mirror(ckpt, uri, "--replay").returncode == 0
    store = Store(uri)
    lease = "leases/checkpoints/step-000010/w1.json"
    store.put_bytes(lease, json.dumps({"expires": time.time() + 120}).encode())
    rotate_by_hand(ckpt, 5, 10)
    job = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--mirror", uri, "--replay"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: (
                "checkpoints/step-000005" not in marked_checkpoints(store.listing("checkpoints/"))
            ),
            timeout=60,
            what="the rotated checkpoint gone from the store",
        )
        assert marked_checkpoints(store.listing("checkpoints/")) == {
            "checkpoints/step-000010",  # leased by a remote watcher: kept while it is
            "checkpoints/step-000015",
        }
        assert job.poll() is None  # it waits for that lease
        store.delete([lease])
        assert job.wait(60) == 0
    finally:
        job.kill()
        job.wait()
    assert store.listing("checkpoints/step-000005/") == {}
    assert store.listing("checkpoints/step-000010/") == {}


@pytest.mark.extended
def test_a_live_run_is_followed_until_its_end(ckpt: Path, s3: Any) -> None:
    """Following (no --replay): a save's checkpoint and the record are in the store while
    the run goes on; the mirror ends once train_end is there."""
    uri = s3.fresh_uri() + "/live"
    store = Store(uri)
    w = JournalWriter(ckpt)
    w.append("train_begin", {"config": {}, "world_size": 1, "total_steps": 10})
    job = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--mirror", uri], stderr=subprocess.PIPE, text=True
    )
    try:
        path = make_checkpoint(ckpt, 5, w.run_id)
        w.append("save", {"checkpoint_path": str(path), "kind": ["full_state"]}, step=5)
        wait_for(
            lambda: marked_checkpoints(store.listing("checkpoints/")),
            timeout=60,
            what="the checkpoint's marker",
        )
        wait_for(lambda: b'"event":"save"' in journal_in(store), timeout=60, what="the save record")
        assert job.poll() is None
        w.append("train_end", {"status": "completed", "reason": None}, step=10)
        w.close()
        assert job.wait(60) == 0
    finally:
        job.kill()
        _, err = job.communicate()
    assert journal_in(store) == (ckpt / "journal.jsonl").read_bytes(), err


EVAL = """\
import json, os, sys
rec = json.load(open(os.environ["ILAB_EVENT_FILE"]))
data = rec["data"]
files = sorted(os.listdir(os.path.join(data["checkpoint_path"], "full_state")))
with open({out!r}, "a") as f:
    f.write(json.dumps({{"step": rec["step"], "uri": data["checkpoint_uri"], "files": files}}) + "\\n")
with open(os.environ["ILAB_REPORT"], "w") as f:
    json.dump({{"accuracy": rec["step"] / 100}}, f)
"""


def eval_script(tmp_path: Path) -> tuple[Path, Path]:
    """:data:`EVAL` as a script, and the file where it notes each checkpoint it evaluated."""
    out = tmp_path / "evaluated.jsonl"
    script = tmp_path / "eval.py"
    script.write_text(EVAL.format(out=str(out)))
    return script, out


def eval_reports(ckpt: Path) -> dict[int, dict[str, Any]]:
    """The run's journaled reports from :data:`EVAL`: step -> metrics."""
    return {
        rec["data"]["step"]: rec["data"]["metrics"]
        for rec in records(ckpt)
        if rec["event"] == "report" and "accuracy" in rec["data"]["metrics"]
    }


def test_a_remote_watcher_evaluates_each_save_once_and_reports_reach_the_run(
    tmp_path: Path, ckpt: Path, s3: Any
) -> None:
    """``ilab-watch URI --on-save eval.py --download DIR`` on a mirrored run: each save's
    checkpoint fetched and evaluated once (a second pass repeats none), its report sent
    back through the store and journaled in the run by the mirroring watcher."""
    finished_run(ckpt)
    uri = s3.fresh_uri() + "/remote"
    assert mirror(ckpt, uri, "--replay").returncode == 0
    script, out = eval_script(tmp_path)
    replica = tmp_path / "replica"
    for _ in range(2):
        r = cli("ilab-watch", uri, "--on-save", str(script), "--replay", "--download", str(replica))
        assert r.returncode == 0, r.stderr
    seen = [json.loads(line) for line in out.read_text().splitlines()]
    assert [s["step"] for s in seen] == [5, 10]
    assert seen[0]["uri"] == f"{uri}/checkpoints/step-000005"
    assert seen[0]["files"] == sorted(os.listdir(ckpt / "checkpoints/step-000005/full_state"))
    assert len(Store(uri).listing("reports/")) == 2
    assert mirror(ckpt, uri, "--replay").returncode == 0  # brings them in
    assert eval_reports(ckpt) == {5: {"accuracy": 0.05}, 10: {"accuracy": 0.1}}
    assert Store(uri).listing("reports/") == {}


@pytest.mark.extended
def test_the_read_commands_read_a_mirrored_run_from_its_store(ckpt: Path, s3: Any) -> None:
    """status, show, query, tail and stats given the URI answer as for the run dir (same
    output, same exit code); a store that cannot be read is one line, exit 2."""
    finished_run(ckpt)
    uri = s3.fresh_uri() + "/read"
    assert mirror(ckpt, uri, "--replay").returncode == 0
    for args in (
        ("show", "-e", "save", "--json"),
        ("query", "-e", "save", "--field", "checkpoint_path"),
        ("tail", "-n", "3", "--json"),
        ("stats", "--json"),
        ("status", "--json"),
    ):
        here = cli("ilab-journal", args[0], str(ckpt), *args[1:])
        there = cli("ilab-journal", args[0], uri, *args[1:])
        assert (there.returncode, there.stderr) == (here.returncode, here.stderr), args
        if args[0] == "status":  # the journal's path and liveness checks differ
            assert '"state": "completed"' in there.stdout.replace('":"', '": "'), there.stdout
        else:
            assert there.stdout == here.stdout, args
    empty = cli("ilab-journal", "status", s3.fresh_uri())
    assert empty.returncode == 2, empty.stderr
    assert "Traceback" not in empty.stderr
    last = empty.stderr.strip().splitlines()[-1]
    assert last.endswith("holds no mirrored journal (journal/*.jsonl)")
    gone = cli("ilab-journal", "status", "s3://no-such-bucket-ilab/x")  # said as such
    assert gone.returncode == 2, gone.stderr
    assert "Traceback" not in gone.stderr
    assert (
        gone.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "cannot read s3://no-such-bucket-ilab/x: no such bucket (NoSuchBucket: The specified "
            "bucket does not exist)"
        )
    )


@pytest.mark.extended
def test_a_remote_watchers_replica_lets_go_of_what_the_run_rotated(
    tmp_path: Path, ckpt: Path, s3: Any
) -> None:
    """A checkpoint downloaded by ``ilab-watch URI --download DIR`` is deleted from DIR once
    the run removed it (its ``checkpoint_removed`` reached the store), unless a lease in the
    replica holds it then: that one goes when the lease is gone. The eval machine's disk
    holds what the run holds, not every checkpoint it ever saw."""
    finished_run(ckpt, steps=15)
    uri = s3.fresh_uri() + "/pruned"
    assert mirror(ckpt, uri, "--replay").returncode == 0
    script, out = eval_script(tmp_path)
    replica = tmp_path / "replica"
    watch = ("ilab-watch", uri, "--on-save", str(script), "--replay", "--download", str(replica))
    assert cli(*watch).returncode == 0
    held = replica / "checkpoints"
    assert sorted(os.listdir(held)) == ["step-000005", "step-000010", "step-000015"]
    lease = cli("ilab-journal", "lease", str(replica), str(held / "step-000010"), "--ttl", "600")
    assert lease.returncode == 0, lease.stderr
    rotate_by_hand(ckpt, 5, 10)
    assert mirror(ckpt, uri, "--replay").returncode == 0
    assert cli(*watch).returncode == 0
    assert sorted(os.listdir(held)) == ["step-000010", "step-000015"]  # 10 is leased here
    lease_id = lease.stdout.split()[0]
    assert cli("ilab-journal", "release", str(replica), lease_id).returncode == 0
    assert cli(*watch).returncode == 0  # the next look deletes it
    assert sorted(os.listdir(held)) == ["step-000015"]
    assert [json.loads(line)["step"] for line in out.read_text().splitlines()] == [5, 10, 15]


@pytest.mark.extended
def test_a_lingering_mirror_journals_reports_sent_after_the_run_ended(
    tmp_path: Path, ckpt: Path, s3: Any
) -> None:
    """``--linger``: the run has ended and is all in the store, and an eval elsewhere ends
    after that; its reports still reach the run's journal (and the store's copy of it),
    without a second mirroring watcher. Without --linger the mirror would have exited."""
    finished_run(ckpt)
    uri = s3.fresh_uri() + "/linger"
    store = Store(uri)
    job = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--mirror", uri, "--linger", "120"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        local = ckpt / "journal.jsonl"
        wait_for(lambda: journal_in(store) == local.read_bytes(), timeout=60, what="all mirrored")
        script, _ = eval_script(tmp_path)
        replica = tmp_path / "replica"
        remote = ("ilab-watch", uri, "--on-save", str(script), "--replay", "--download")
        assert cli(*remote, str(replica)).returncode == 0
        wait_for(
            lambda: len(eval_reports(ckpt)) == 2,
            timeout=60,
            what="both reports journaled in the run",
        )
        wait_for(lambda: journal_in(store) == local.read_bytes(), timeout=60, what="mirrored")
        assert job.poll() is None  # still lingering
        job.terminate()
        assert job.wait(60) == 130
    finally:
        job.kill()
        job.wait()
    assert store.listing("reports/") == {}
    quick = mirror(ckpt, uri, "--replay", "--linger", "1")  # ends by itself after 1 s
    assert quick.returncode == 0, quick.stderr


# -- nothing pinned, nothing crossed, nothing silent (issue 43) ---------------------------


def snapshot(store: Store) -> dict[str, bytes]:
    """Every object under a store's URI, byte for byte."""
    return {key: read(store, key) for key in store.listing("")}


@pytest.mark.extended
def test_a_mirror_refused_for_another_runs_prefix_leaves_it_byte_for_byte(
    tmp_path: Path, s3: Any
) -> None:
    """Run A is mirrored; run B, which rotated checkpoints of A's step names away and saved
    one A never had, is mirrored to A's URI: refused in one line (exit 1), and A's prefix
    is as it was: no checkpoint of A deleted, none of B uploaded, nothing brought in."""
    a, b = tmp_path / "a", tmp_path / "b"
    finished_run(a)
    uri = s3.fresh_uri() + "/m6"
    assert mirror(a, uri, "--replay").returncode == 0
    store = Store(uri)
    store.put_bytes("reports/late.json", b'{"checkpoint_path": "step-000010", "metrics": {}}')
    before = snapshot(store)
    assert {"checkpoints/step-000005", "checkpoints/step-000010"} <= {
        "/".join(k.split("/")[:2]) for k in before
    }
    finished_run(b, steps=15)
    rotate_by_hand(b, 5, 10)
    for extra in (("--replay",), ()):  # a finished run's replay, and a follower
        r = mirror(b, uri, *extra, timeout=60)
        assert snapshot(store) == before
        assert r.returncode == 1, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "give the mirror a new URI" in lines[0], r.stderr
    assert not list((b / "reports").glob("*.json"))  # A's report stayed A's


def test_store_errors_are_told_transient_or_permanent(
    tmp_path: Path, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one classification (journal.remote.errors.classify) on what the real server and
    this machine raise: a refusal is permanent and says its cause; no answer is transient;
    a full local disk is local, never the store."""
    from journal.remote.errors import Kind, classify

    def problem(uri: str, act: Any = lambda st: st.check(), **kw: Any) -> Any:
        try:
            act(Store(uri, **kw))
        except Exception as exc:
            return classify(exc)
        raise AssertionError(f"{uri}: no error")

    bucket = s3.fresh_uri().split("/")[2]
    cases = {
        "s3://Invalid_Bucket/x": "no such bucket",  # SeaweedFS: listing it, NoSuchBucket
        "s3://bkt:99999/x": 'invalid request: Invalid bucket name "bkt:99999"',
        "s3://no-such-bucket-ilab/x": "no such bucket",
    }
    for uri, cause in cases.items():
        got = problem(uri)
        assert (got.kind, got.cause[: len(cause)]) == (Kind.PERMANENT, cause), uri
    dotted = problem(f"s3://{bucket}/a/../b", lambda st: st.put_bytes("k", b"1"))
    assert dotted.kind is Kind.PERMANENT and "InvalidRequest" in dotted.cause
    with monkeypatch.context() as m:
        m.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        got = problem(s3.fresh_uri())
        assert got.kind is Kind.PERMANENT and "signature does not match" in got.cause
        m.setenv("AWS_ACCESS_KEY_ID", "nosuchkey")
        got = problem(s3.fresh_uri())
        assert got.kind is Kind.PERMANENT and "access key" in got.cause
    with monkeypatch.context() as m:
        for k, v in s3.reader_env().items():
            m.setenv(k, v)
        got = problem(s3.fresh_uri(), lambda st: st.put_bytes("k", b"1"))
        assert got.kind is Kind.PERMANENT and got.cause.startswith("access denied"), got
    with monkeypatch.context() as m:
        m.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens
        assert problem(s3.fresh_uri()).kind is Kind.TRANSIENT
    uri = s3.fresh_uri()
    Store(uri).put_bytes("big", os.urandom(4 << 20))
    with small_tmpfs(tmp_path, "1m") as disk:
        full = problem(uri, lambda st: st.get_files([("big", str(disk / "big"))]))
    assert (full.kind, full.cause) == (Kind.LOCAL, "No space left on device")

    def list_once(st: Store) -> None:
        st.fs.retries = 1  # s3fs's own retries of a timeout: one is enough to classify
        st.listing("")

    os.killpg(s3.proc.pid, signal.SIGSTOP)  # accepts connections, never answers
    try:
        got = problem(uri, list_once, read_timeout=1)
    finally:
        os.killpg(s3.proc.pid, signal.SIGCONT)
    assert got.kind is Kind.TRANSIENT and "timeout" in got.cause.lower(), got


@pytest.mark.parametrize(
    "uri, env",
    [
        ("s3://Invalid_Bucket/x", {}),
        pytest.param("s3://bkt:99999/x", {}, marks=pytest.mark.extended),
        ("fresh", {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}),
        pytest.param("fresh", {"AWS_ACCESS_KEY_ID": "nosuchkey"}, marks=pytest.mark.extended),
    ],
)
def test_a_store_that_refuses_is_one_line_and_exit_2_at_start(
    tmp_path: Path, ckpt: Path, s3: Any, uri: str, env: dict[str, str]
) -> None:
    """An invalid bucket or wrong credentials: the mirror (following a run) and a remote
    watcher each say the cause in one line and exit 2 at its first answer; no retrying
    forever as if the store were down."""
    finished_run(ckpt)
    uri = s3.fresh_uri() if uri == "fresh" else uri
    for argv in (
        ("ilab-watch", str(ckpt), "--mirror", uri),
        ("ilab-watch", uri, "--on-save", "true"),
    ):
        # the first answer decides (a store down would be retried past this deadline)
        r = cli(*argv, timeout=30, env={**env, "XDG_CACHE_HOME": str(tmp_path / "cache")})
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        assert "does not answer" not in lines[0] and "Traceback" not in r.stderr
        assert any(
            cause in lines[0]
            for cause in ("no such bucket", "Invalid bucket name", "signature", "access key")
        ), lines[0]


@pytest.mark.extended
def test_a_store_that_refuses_mid_run_stops_the_mirror_and_lets_go_of_its_leases(
    tmp_path: Path, ckpt: Path, s3: Any
) -> None:
    """The bucket is deleted while a run is mirrored (beside a hook, so the watcher goes
    on): the mirror says so in one line and holds no lease from then on, so rotation takes
    the checkpoints as if no mirror ran; the watcher exits 2 at the run's end."""
    import s3fs

    from journal.checkpoints.leases import active

    bucket = f"ilab-gone-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    uri = f"s3://{bucket}/run"
    store = Store(uri)
    w = JournalWriter(ckpt)
    w.append("train_begin", {"config": {}, "world_size": 1, "total_steps": 10})
    err = tmp_path / "stderr"
    with open(err, "w") as out:
        job = subprocess.Popen(
            [str(BIN / "ilab-watch"), str(ckpt), "--mirror", uri, "--on-log", "true"],
            stderr=out,
            text=True,
        )
    try:
        path = make_checkpoint(ckpt, 5, w.run_id)
        w.append("save", {"checkpoint_path": str(path), "kind": ["full_state"]}, step=5)
        wait_for(lambda: marked_checkpoints(store.listing("checkpoints/")), what="a marker")
        local = ckpt / "journal.jsonl"  # all mirrored (the upload's report too): no write
        wait_for(lambda: journal_in(store) == local.read_bytes(), what="all mirrored")
        s3fs.S3FileSystem(skip_instance_cache=True).rm(bucket, recursive=True)
        path = make_checkpoint(ckpt, 10, w.run_id)
        w.append("save", {"checkpoint_path": str(path), "kind": ["full_state"]}, step=10)

        def mirror_stopped_and_let_go() -> bool:
            mine = [x for x in active(ckpt) if x.holder.startswith("mirror:")]
            return "mirror: stopped" in err.read_text() and not mine

        wait_for(mirror_stopped_and_let_go, timeout=60, what="the mirror stopped, no lease")
        assert job.poll() is None  # the watcher's hook goes on following the run
        w.append("train_end", {"status": "completed", "reason": None}, step=10)
        w.close()
        assert job.wait(60) == 2
    finally:
        job.kill()
        job.wait()
    text = err.read_text()
    said = [line for line in text.splitlines() if "mirror: stopped" in line]
    assert len(said) == 1 and "no such bucket" in said[0], text
    assert "does not answer" not in text and "Traceback" not in text


def test_a_file_uri_is_a_store_too(tmp_path: Path, ckpt: Path) -> None:
    """``--mirror file:///dir``: its directories are made as needed; the run is mirrored,
    watched from there (a checkpoint downloaded and evaluated) and rotated there (no
    empty directory left behind)."""
    finished_run(ckpt)
    uri = f"file://{tmp_path}/store/runs/x"
    r = mirror(ckpt, uri, "--replay", timeout=60)
    assert r.returncode == 0, r.stderr
    store = Store(uri)
    names = {"checkpoints/step-000005", "checkpoints/step-000010"}
    assert marked_checkpoints(store.listing("checkpoints/")) == names
    assert journal_in(store) == (ckpt / "journal.jsonl").read_bytes()
    script, out = eval_script(tmp_path)
    replica = tmp_path / "replica"
    r = cli("ilab-watch", uri, "--on-save", str(script), "--replay", "--download", str(replica))
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["step"] for line in out.read_text().splitlines()] == [5, 10]
    rotate_by_hand(ckpt, 5)
    assert mirror(ckpt, uri, "--replay", timeout=60).returncode == 0
    assert not (tmp_path / "store/runs/x/checkpoints/step-000005").exists()
    assert journal_in(store) == (ckpt / "journal.jsonl").read_bytes()


@pytest.mark.extended
def test_a_full_disk_while_downloading_is_said_as_such(tmp_path: Path, ckpt: Path, s3: Any) -> None:
    """``ilab-watch URI --download DIR`` with DIR on a 16 MB disk and two 11 MB
    checkpoints: the first, fetched whole, is evaluated; the second does not fit, which is
    said in one line as this machine's disk (never as the store not answering), and its
    partial copy is removed."""
    finished_run(ckpt)
    for step in (5, 10):
        big = ckpt / f"checkpoints/step-{step:06d}/full_state/__1_0.distcp"
        big.write_bytes(os.urandom(10 << 20))
    uri = s3.fresh_uri() + "/full"
    assert mirror(ckpt, uri, "--replay").returncode == 0
    script, out = eval_script(tmp_path)
    with small_tmpfs(tmp_path, "16m") as disk:
        replica = disk / "replica"
        r = cli("ilab-watch", uri, "--on-save", str(script), "--replay", "--download", str(replica))
        assert [json.loads(line)["step"] for line in out.read_text().splitlines()] == [5]
        assert not list((replica / "checkpoints").glob(".tmp-*")), r.stderr
        assert sorted(os.listdir(replica / "checkpoints")) == ["step-000005"]
    said = [line for line in r.stderr.splitlines() if "No space left on device" in line]
    assert len(said) == 1 and "not the store" in said[0], r.stderr
    assert "does not answer" not in r.stderr and "Traceback" not in r.stderr


#: Run a console script's main and write its peak memory (VmHWM, KiB) to argv[1] at exit:
#: the peak of this process alone (a child's ru_maxrss also counts its parent's).
PEAK = """\
import atexit, sys
def peak(path):
    with open("/proc/self/status") as f:
        kib = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(path, "w") as f:
        f.write(kib)
atexit.register(peak, sys.argv[1])
sys.argv = ["ilab-watch", *sys.argv[2:]]
from watcher.cli.main import main
main()
"""


@pytest.mark.extended
def test_an_oversize_object_from_the_store_is_moved_aside_unread(
    tmp_path: Path, ckpt: Path, s3: Any
) -> None:
    """A 64 MB object in the store's control/ and reports/ (the local inboxes take 64 KiB
    at most): each is moved aside there with one line, never read (the mirror's memory
    does not grow by it) and never written into the run; a small command still comes in."""
    finished_run(ckpt)
    uri = s3.fresh_uri() + "/huge"
    store = Store(uri)
    peak = tmp_path / "peak"

    def mirrored() -> tuple[subprocess.CompletedProcess[str], int]:
        argv = [sys.executable, "-c", PEAK, str(peak), str(ckpt), "--mirror", uri, "--replay"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        return r, int(peak.read_text())

    r, baseline = mirrored()
    assert r.returncode == 0, r.stderr
    huge = b'{"command": "log", "reason": "' + b"x" * (64 << 20) + b'"}'
    store.put_bytes("control/huge.json", huge)
    store.put_bytes("reports/huge.json", huge)
    store.put_bytes("control/small.json", b'{"command": "log", "reason": "hello"}')
    r, kib = mirrored()
    assert r.returncode == 0, r.stderr
    assert kib < baseline + 32 * 1024, (kib, baseline)  # 64 MB read whole would show
    for inbox in ("control", "reports"):
        assert store.listing(f"{inbox}/") == {f"{inbox}/rejected/huge.json": len(huge)}
        assert not (ckpt / inbox / "huge.json").exists()
        said = [line for line in r.stderr.splitlines() if f"{inbox}/huge.json" in line]
        assert len(said) == 1 and "64 KiB" in said[0], r.stderr
    assert (ckpt / "control/small.json").exists()


@pytest.mark.extended
def test_a_remote_watcher_is_handed_the_hf_export_of_its_local_copy(
    tmp_path: Path, ckpt: Path
) -> None:
    """A save's ``hf_path`` (its HF export, inside the checkpoint) is rewritten with the
    checkpoint's path in the replica: a remote ``--lm-eval`` (which refuses an ``hf_path``
    outside the run it watches) evaluates the copy it downloaded, not a path of the
    training machine."""
    write_run(ckpt, steps=5, save_every=0, end=None)
    run_id = records(ckpt)[0]["run_id"]
    path = make_checkpoint(ckpt, 5, run_id)
    (path / "hf").mkdir()
    (path / "hf" / "config.json").write_text("{}")
    with JournalWriter(ckpt, resume=True, run_id=run_id) as w:
        w.append("save", {"checkpoint_path": str(path), "hf_path": str(path / "hf")}, step=5)
        w.append("train_end", {"status": "completed", "reason": None}, step=5)
    uri = f"file://{tmp_path / 'store'}"
    assert mirror(ckpt, uri, "--replay").returncode == 0
    out = tmp_path / "seen.txt"
    script = tmp_path / "hf.py"
    script.write_text(
        "import json, os\n"
        "d = json.load(open(os.environ['ILAB_EVENT_FILE']))['data']\n"
        f"open({str(out)!r}, 'w').write(d['hf_path'] + '\\n' + d['checkpoint_path'])\n"
    )
    replica = tmp_path / "replica"
    r = cli(
        "ilab-watch",
        uri,
        "--on-save",
        f"{sys.executable} {script}",
        "--replay",
        "--download",
        str(replica),
    )
    assert r.returncode == 0, r.stderr
    hf, local = out.read_text().splitlines()
    assert hf == str(Path(local) / "hf") and Path(local).is_relative_to(replica)
    assert (Path(hf) / "config.json").exists()
