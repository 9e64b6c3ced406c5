"""Alerts and notifications (issue 53, point 5): ``ilab-watch --notify URL`` tells an apprise
target, here a real HTTP receiver on loopback (``json://127.0.0.1:PORT/``), of a run that
failed, was stopped, diverged or met a ``--notify-when`` condition; each alert is journaled
as an ``alert`` record (and its outcome as ``alert_told``) that ``ilab-journal status`` and
``check`` show. Journals are written by the test (no torch) and followed by a real
``ilab-watch``; one real 2-rank run shows the trainer journaling an alert mid-run."""

from __future__ import annotations

import http.server
import importlib.util
import json
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from journal import JournalWriter
from journal.rundir.lock import JournalLock
from journal.store import guest
from tests.helpers import (
    BIN,
    begin_payload,
    cli,
    free_port,
    kill_tree,
    log_payload,
    records,
    train,
    train_argv,
    train_env,
    wait_for,
    write_run,
    write_steps,
)
from tests.receiver import Receiver

#: --notify sends through apprise (the alerts extra, which `make` installs)
needs_apprise = pytest.mark.skipif(
    importlib.util.find_spec("apprise") is None,
    reason="apprise is not installed (the alerts extra)",
)


def _end(ckpt: Path, data: dict[str, Any]) -> None:
    """Append a train_end to a run written without one (as the trainer would)."""
    with guest(ckpt, role="trainer") as w:
        w.append("train_end", data)


def _stop_command(ckpt: Path) -> None:
    with guest(ckpt, role="trainer") as w:
        w.append(
            "control",
            {"command": "stop", "id": "c1", "source": "operator:ann", "accepted": True},
        )


def _status(ckpt: Path, *extra: str) -> dict[str, Any]:
    return json.loads(cli("ilab-journal", "status", str(ckpt), "--json", *extra).stdout)


def _alerts(ckpt: Path, event: str = "alert") -> list[dict[str, Any]]:
    return [r["data"] for r in records(ckpt) if r["event"] == event]


@needs_apprise
@pytest.mark.parametrize("ending", ["failed", "stopped"])
def test_an_ended_run_alerts_once_naming_run_kind_and_step(
    tmp_path: Path, receiver: Receiver, ending: str
) -> None:
    """A failed (or stopped) run: one message reaches the receiver naming the run (dir and
    run id), the kind, the step and what was seen; the alert is journaled with who was
    told, status and check show it, and a second watcher does not page again."""
    ckpt = tmp_path / "run"
    write_run(ckpt, steps=6, save_every=0, end=None)
    if ending == "failed":
        _end(ckpt, {"status": "failed", "error_type": "RuntimeError", "error_message": "boom"})
    else:
        _stop_command(ckpt)
        _end(ckpt, {"status": "stopped", "command": "stop", "command_id": "c1"})
    run_id = records(ckpt)[0]["run_id"]

    proc = cli("ilab-watch", str(ckpt), "--replay", "--notify", receiver.url, "-q")
    assert proc.returncode == 0, proc.stderr
    (msg,) = receiver.bodies
    assert msg["path"] == "/hook" and msg["type"] == (
        "failure" if ending == "failed" else "warning"
    )
    assert f"{ending}: {ckpt.absolute()} at step 6" in msg["title"]
    assert f"run: {ckpt.absolute()} (run id {run_id}, attempt 1" in msg["message"]
    seen = "RuntimeError: boom" if ending == "failed" else "stopped by operator (operator:ann)"
    assert seen in msg["message"] and "evidence: none captured" in msg["message"]
    assert f"alert: {ending} at step 6" in proc.stderr

    (alert,) = _alerts(ckpt)
    target = receiver.url.removesuffix("/hook")
    assert (alert["kind"], alert["step"], alert["attempt"]) == (ending, 6, 1)
    assert alert["targets"] == [target] and seen in alert["message"]
    (told,) = _alerts(ckpt, "alert_told")
    assert told == {**told, "id": alert["id"], "told": [target], "failed": []}

    status = _status(ckpt)
    assert status["alerts"] == 1 and status["last_alert"]["kind"] == ending
    assert status["last_alert"]["told"] == [target]
    assert _status(ckpt, "--full")["last_alert"] == status["last_alert"]  # index == a scan
    text = cli("ilab-journal", "status", str(ckpt)).stdout
    assert f"alerts  1, latest: {ending} at step 6" in text and f"told {target}" in text
    assert cli("ilab-journal", "check", str(ckpt), "-e", "alerts == 1").returncode == 0

    again = cli("ilab-watch", str(ckpt), "--replay", "--notify", receiver.url, "--name", "w2")
    assert again.returncode == 0, again.stderr
    assert len(receiver.bodies) == 1 and len(_alerts(ckpt)) == 1  # journaled: not twice


@needs_apprise
def test_an_unreachable_target_is_retried_reported_and_hooks_go_on(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A target nobody listens on (a closed port on 127.0.0.1): its tries are each one line,
    it is given up and journaled as not told, its password shown nowhere; the other target
    is told and the watcher's hooks run and it exits 0."""
    ckpt = tmp_path / "run"
    write_run(ckpt, steps=4, save_every=0, end="failed")
    closed = f"json://alice:hunter2secret@127.0.0.1:{free_port()}/"
    out = tmp_path / "hook-ran"
    proc = cli(
        "ilab-watch", str(ckpt), "--replay", "--notify", closed, "--notify", receiver.url,
        "--on-train-end", f"touch {out}", "-q",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert out.exists() and len(receiver.bodies) == 1
    down = closed.replace("alice:hunter2secret@", "").rstrip("/")
    assert f"{down} not told (try 1 of 5: [Errno 111] Connection refused)" in proc.stderr
    assert f"{down} not told after 5 tries" in proc.stderr
    (told,) = _alerts(ckpt, "alert_told")
    assert told["told"] == [receiver.url.removesuffix("/hook")]
    (failed,) = told["failed"]
    assert failed["target"] == down and failed["tries"] == 5
    assert "Connection refused" in failed["error"]
    everything = proc.stderr + (ckpt / "journal.jsonl").read_text()
    assert "hunter2secret" not in everything and "alice" not in everything
    text = cli("ilab-journal", "status", str(ckpt)).stdout
    assert f"not told {down}" in text


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--notify", "slack://"], "Error: --notify #1 (slack://...): apprise cannot read"),
        (["--notify", "nosuch://x"], "Error: --notify #1 (nosuch://...): apprise "),
        (["--notify", "json://h/", "--notify", "no url"], "Error: --notify #2: not a URL"),
        (["--notify", "json://127.0.0.1:99999/"], "(json://...): port 99999 is out of range"),
        (["--notify", "json://127.0.0.1:-1/"], "(json://...): port -1 is out of range"),
        (["--notify", "json://127.0.0.1:0/"], "(json://...): port 0 is out of range"),
        (["--notify-when", "stauts == failed"], "did you mean 'status'?"),
        (["--notify-when", "best(accuracy) >="], "ends where a value was expected"),
        (["--notify-on", "failed,hung"], "Error: --notify-on 'failed,hung': 'hung' is not one"),
    ],
)
def test_a_bad_notify_option_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], said: str
) -> None:
    if args[0] == "--notify" and importlib.util.find_spec("apprise") is None:
        said = "Error: --notify needs apprise, which is not installed"
    write_run(tmp_path, steps=2, save_every=0)
    proc = cli("ilab-watch", str(tmp_path), "--replay", *args)
    assert proc.returncode == 2, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert said in line and "Traceback" not in proc.stderr
    assert not (tmp_path / "reports").exists()  # nothing started


@needs_apprise
def test_notify_when_fires_once_per_attempt(tmp_path: Path, receiver: Receiver) -> None:
    """A condition that holds over many records and two attempts alerts once in each; a
    completed run alerts only when asked (--notify-on all), and a NaN loss is a
    divergence, once."""
    ckpt = tmp_path / "run"
    write_run(ckpt, steps=6, save_every=0, end="failed")
    write_run(ckpt, steps=6, save_every=0, end=None, resume=True)
    with guest(ckpt, role="trainer") as w:
        w.append("log", {**log_payload(7), "loss": None, "loss_finite": False})
        w.append("log", {**log_payload(8), "loss": None, "loss_finite": False})
        w.append("train_end", {"status": "completed"})
    proc = cli(
        "ilab-watch", str(ckpt), "--replay", "--notify", receiver.url, "--notify-on", "all",
        "--notify-when", "steps >= 3", "--notify-when", "best(accuracy) >= 0.9",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    alerts = _alerts(ckpt)
    got = sorted((a["kind"], a["attempt"], a.get("condition")) for a in alerts)
    assert got == [
        ("completed", 2, None),
        ("condition", 1, "steps >= 3"),
        ("condition", 2, "steps >= 3"),
        ("diverged", 2, None),
        ("failed", 1, None),
    ]
    diverged = next(a for a in alerts if a["kind"] == "diverged")
    assert "loss is NaN/Inf" in diverged["message"]
    assert len(receiver.bodies) == len(alerts)
    # best(accuracy): no report ever carried it; said at the end, as check would refuse it
    assert "--notify-when 'best(accuracy) >= 0.9': best(accuracy): the run has no metric" in (
        proc.stderr
    )


def test_the_failure_that_leaves_no_restart_is_alerted_with_each_attempts_cause(
    tmp_path: Path,
) -> None:
    """An ``ilab-train --max-restarts 2`` launch whose 3 attempts all failed, the last one
    aborted as hung (its hang alert said that attempt's end): the last failure is still
    alerted, once, with every attempt's cause; a failure with restarts left is alerted
    as itself, with what its train_end says follows."""
    ckpt = tmp_path / "run"
    hang = {"status": "failed", "error_type": "Hang", "error_message": "hang: quiet"}
    ends = [{**hang, "aborted_for": "hang"}, {"status": "failed", "error_type": "E"}, hang]
    ends[1]["error_message"], ends[2]["aborted_for"] = "boom", "hang"
    follows = [
        "a relaunch from the newest checkpoint follows (restart 1 of 2)",
        "a relaunch from the newest checkpoint follows (restart 2 of 2, the last)",
        "no relaunch follows (--max-restarts 2 used up)",
    ]
    for restart, end in enumerate(ends):
        end.update(restart=restart, restarts_left=2 - restart, relaunch=follows[restart])
        with JournalWriter(ckpt, resume=restart > 0) as w:
            w.append("train_begin", {"config": {"max_restarts": 2}, "restart": restart})
            w.append("train_end", end, step=3)
    proc = cli("ilab-watch", str(ckpt), "--replay", "--notify-on", "failed")
    assert proc.returncode == 0, proc.stderr
    assert [(a["attempt"], a["message"]) for a in _alerts(ckpt)] == [
        (2, f"the run failed: E: boom; {follows[1]}"),
        (
            3,
            "the run failed after 2 restart(s); no relaunch follows (--max-restarts 2 used up): "
            "attempt 1: Hang: hang: quiet; attempt 2: E: boom; attempt 3: Hang: hang: quiet",
        ),
    ]


@needs_apprise
def test_a_killed_rank_is_named_with_its_signal_and_log_and_no_progress_ends_the_launch(
    tmp_path: Path, receiver: Receiver
) -> None:
    """``kill -9`` of rank 1 of a real 2-rank run, before its first save, under
    ``--max-restarts 2 --max-no-progress-attempts 1`` and ``ILAB_NOTIFY`` (a real receiver):
    train_end, the message sent, the journaled alert and ``status`` name rank 1, SIGKILL,
    its log and the log's last lines (the notify URL's secrets scrubbed), never rank 0's
    gloo error; the attempt saved nothing, so no relaunch follows: exit 4, "no progress"."""
    run, secret = tmp_path / "run", "pw-s3cret-42"
    (run / "logs").mkdir(parents=True, mode=0o750)
    run.chmod(0o750)  # a line of an earlier attempt's, in the log the alert quotes
    (run / "logs" / "rank-1.log").write_text(f"rank1 INFO posting to {secret}@127.0.0.1\n")
    env = {
        **train_env(step_delay=0.05),
        "ILAB_NOTIFY": receiver.url.replace("//", f"//zq:{secret}@"),
    }
    argv = ["--num-epochs", "50", "--max-steps", "3000", "--max-restarts", "2"]
    job = subprocess.Popen(
        train_argv(run, *argv, "--max-no-progress-attempts", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        begin = wait_for(
            lambda: next((r for r in records(run) if r["event"] == "train_begin"), None),
            timeout=240,
            what="train_begin",
        )
        pid = next(r["pid"] for r in begin["data"]["ranks"] if r["rank"] == 1)
        wait_for(lambda: any(r["event"] == "step_end" for r in records(run)), 240, "a step")
        psutil.Process(pid).kill()
        _, err = job.communicate(timeout=240)
    finally:
        kill_tree(job.pid)
    log = run / "logs" / "rank-1.log"
    killed = f"rank 1 (pid {pid}) was killed by SIGKILL, the first rank to end; its log: {log}"
    stop = "no relaunch follows: no progress, 1 attempt(s) in a row saved no new checkpoint"
    assert job.returncode == 4 and killed in err and stop in err, err[-3000:]
    [end] = [r["data"] for r in records(run) if r["event"] == "train_end"]
    assert end["first_failure"] == {
        "rank": 1,
        "pid": pid,
        "exitcode": -9,
        "signal": "SIGKILL",
        "log": "logs/rank-1.log",
    }
    assert (end["restarts_left"], end["reason"]) == (0, killed)
    (msg,) = receiver.bodies
    (alert,) = _alerts(run)
    tail = log.read_text().splitlines()[-1]  # the killed rank's own last line
    for said in (msg["message"], alert["message"]):
        assert f"the run failed: WorkerExit: {killed}; {stop}" in said, said
        assert tail in said and "posting to …@127.0.0.1" in said and secret not in said
        assert "Connection reset" not in said and "gloo" not in said
    assert f"evidence: {log}" in msg["message"] and alert["evidence"] == ["logs/rank-1.log"]
    status = cli("ilab-journal", "status", str(run))
    assert killed in status.stdout and f"evidence: {log}" in status.stdout, status.stdout


def test_an_alert_waits_for_the_journals_holder(tmp_path: Path) -> None:
    """While a trainer holds the journal (a hung one holds it for good), an alert waits in
    reports/; it is journaled as soon as the journal is free, by the dispatcher itself."""
    from watcher.alerts.alert import Alert
    from watcher.alerts.sink import AlertDispatcher

    write_run(tmp_path, steps=3, save_every=0, end=None)
    lock = JournalLock(tmp_path, role="trainer")
    lock.acquire(timeout=0)
    sink = AlertDispatcher(tmp_path, run_label=str(tmp_path))
    try:
        sink.raise_alert(Alert(kind="hang", message="no step for 30s", step=3, attempt=1))
        sink.raise_alert(Alert(kind="hang", message="again", step=3, attempt=1))  # a repeat
        waiting = wait_for(lambda: list((tmp_path / "reports").glob("*.json")), 10, "its file")
        wait_for(lambda: sink.inbox.tries >= 2, 30, "a second try to journal it")
        assert len(waiting) == 1 and waiting[0].exists() and _alerts(tmp_path) == []
        lock.release()
        (alert,) = wait_for(lambda: _alerts(tmp_path), 30, "the alert journaled")
        assert (alert["kind"], alert["step"], alert["message"]) == ("hang", 3, "no step for 30s")
    finally:
        if lock.held:
            lock.release()
        sink.close(timeout=5)
    assert len(sink.raised) == 1


@pytest.mark.extended
@needs_apprise
@pytest.mark.dist
def test_a_live_run_journals_its_alert_mid_run(tmp_path: Path, receiver: Receiver) -> None:
    """ilab-watch beside a real 2-rank run: a condition met at step 2 is journaled by the
    trainer at a step boundary (before train_end), and the receiver hears of it."""
    ckpt = tmp_path / "run"
    watch = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--notify", receiver.url, "--notify-when",
         "steps >= 2", "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        result = train(ckpt, "--max-steps", "8")
        assert result.returncode == 0, result.stderr
        _, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    recs = records(ckpt)
    events = [r["event"] for r in recs]
    assert events.index("alert") < events.index("train_end")  # the trainer journaled it
    (alert,) = _alerts(ckpt)
    assert alert["kind"] == "condition" and alert["step"] >= 2
    assert wait_for(lambda: receiver.bodies, 10, "the message")[0]["title"].startswith(
        "[ilab] condition: "
    )


@needs_apprise
def test_a_target_gets_at_most_its_rate_and_the_rest_is_given_up_at_exit(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Rate-limited: with one message a minute allowed, the second alert of a minute waits;
    the watcher's exit gives it up, and alert_told says so (0 tries)."""
    from watcher.alerts.alert import Alert
    from watcher.alerts.sink import AlertDispatcher

    write_run(tmp_path, steps=3, save_every=0)
    sink = AlertDispatcher(tmp_path, targets=[receiver.url], run_label=str(tmp_path), per_minute=1)
    sink.raise_alert(Alert(kind="failed", message="first", step=3, attempt=1))
    sink.raise_alert(Alert(kind="failed", message="second", step=3, attempt=2))
    wait_for(lambda: receiver.bodies, 10, "the first message")
    sink.close(timeout=1)
    assert [b["message"].splitlines()[2] for b in receiver.bodies] == ["seen: first"]
    told = {t["id"]: t for t in _alerts(tmp_path, "alert_told")}
    first, second = _alerts(tmp_path)
    target = receiver.url.removesuffix("/hook")
    assert told[first["id"]]["told"] == [target]
    (given_up,) = told[second["id"]]["failed"]
    assert given_up["tries"] == 0 and "the watcher exited" in given_up["error"]


@needs_apprise
def test_a_target_that_never_answers_delays_no_other(tmp_path: Path, receiver: Receiver) -> None:
    """A target that accepts and never answers (its read timeout set to a minute) is listed
    first: the healthy one is told at once all the same (each target has its own sender),
    the silent one's tries end at the try timeout, and alert_told is journaled at exit."""
    from watcher.alerts.alert import Alert
    from watcher.alerts.sink import AlertDispatcher

    release = threading.Event()

    class Silent(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            release.wait(120)  # took the request; never answers it

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    silent = f"json://127.0.0.1:{server.server_address[1]}/?rto=60"
    write_run(tmp_path, steps=3, save_every=0)
    try:
        targets = [silent, receiver.url]
        sink = AlertDispatcher(tmp_path, targets=targets, run_label=str(tmp_path), try_timeout=1)
        sink.raise_alert(Alert(kind="failed", message="boom", step=3, attempt=1))
        wait_for(lambda: receiver.bodies, 10, "the healthy target's message")
        sink.close(timeout=1)
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    (told,) = _alerts(tmp_path, "alert_told")
    assert told["told"] == [receiver.url.removesuffix("/hook")]
    (given_up,) = told["failed"]
    assert given_up["target"] == silent.split("/?")[0] and "no answer in 1s" in given_up["error"]


def test_a_malformed_alert_file_is_refused_not_journaled(tmp_path: Path) -> None:
    """reports/ takes files from anyone: an alert file with a wrong field (or a kind that is
    no string) is refused in one control record and moved aside; status counts no alert."""
    from journal.channels.reports import drain

    write_run(tmp_path, steps=2, save_every=0)
    inbox = tmp_path / "reports"
    inbox.mkdir()
    bad = {"kind": "alert", "id": "a1", "alert": "exploded", "message": "x", "raised_at": 1.0}
    (inbox / "a1.json").write_text(json.dumps(bad))
    (inbox / "a2.json").write_text(json.dumps({"kind": ["alert"], "id": "a2"}))
    drain(tmp_path, role="test")
    controls = [r["data"] for r in records(tmp_path) if r["event"] == "control"]
    reasons = sorted(str(d["reason"]) for d in controls if d["command"] is None)
    assert len(reasons) == 2 and "alert must be one of hang, died" in reasons[0]
    assert sorted(p.name for p in (inbox / "rejected").iterdir()) == ["a1.json", "a2.json"]
    assert _alerts(tmp_path) == [] and _status(tmp_path)["alerts"] == 0


@needs_apprise
def test_notify_added_to_a_watcher_keeps_its_cursor_and_judges_the_run(
    tmp_path: Path, receiver: Receiver
) -> None:
    """--notify added to a watcher that already ran: the same cursor (its hooks deliver
    nothing again), and the history before it is judged once: its failure alerts."""
    ckpt = tmp_path / "run"
    write_run(ckpt, steps=5, save_every=0, end="failed")
    out = tmp_path / "ends"
    hook = ["--on-train-end", f"sh -c 'echo x >> {out}'"]
    first = cli("ilab-watch", str(ckpt), "--replay", *hook, "-q")
    assert first.returncode == 0 and out.read_text() == "x\n"
    again = cli("ilab-watch", str(ckpt), "--replay", *hook, "--notify", receiver.url)
    assert again.returncode == 0, again.stderr
    assert out.read_text() == "x\n"  # the same cursor: its train_end hook did not run again
    (alert,) = _alerts(ckpt)
    assert (alert["kind"], alert["step"]) == ("failed", 5) and len(receiver.bodies) == 1


@needs_apprise
def test_ilab_train_notifies_with_urls_that_no_command_line_shows(
    tmp_path: Path, receiver: Receiver
) -> None:
    """The URLs, which hold secrets, come from $ILAB_NOTIFY (ilab-train) and a file
    (``ilab-watch --notify @FILE`` beside it), and both targets are told: the launcher's
    embedded watcher runs the rules (a condition; completed, asked with --notify-on all).
    While the run is live no process of it (launcher, torchrun agent, ranks, the watcher)
    has the secret on its command line, which ``ps`` shows every user, and the agent and
    ranks do not have $ILAB_NOTIFY; nor do the workers' config, the journal, the console."""
    ckpt, secret = tmp_path / "run", "hunter2secret"
    with_user = receiver.url.replace("//", f"//alice:{secret}@")
    urls = tmp_path / "urls.txt"
    urls.write_text(f"# the watcher's target\n{with_user}-watch\n")
    job = subprocess.Popen(
        train_argv(ckpt, "--max-steps", "30", "--notify-when", "steps >= 2", "--notify-on", "all"),
        # 30 steps of 0.2 s: the ranks outlive the checks below on a loaded machine
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**train_env(step_delay=0.2), "ILAB_NOTIFY": f"{with_user}-train"},
    )  # fmt: skip
    watch = None
    try:
        begin = wait_for(lambda: [r for r in records(ckpt) if r["event"] == "train_begin"], 240)
        watch = subprocess.Popen(
            [str(BIN / "ilab-watch"), str(ckpt), "--notify", f"@{urls}", "--notify-when",
             "steps >= 3", "-q"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        ranks = [psutil.Process(r["pid"]) for r in begin[0]["data"]["ranks"]]
        agent = ranks[0].parent()
        assert agent is not None and b"trainer.launch.agent" in _argv(agent.pid)
        for pid in (job.pid, agent.pid, watch.pid, *(r.pid for r in ranks)):
            argv = _argv(pid)
            assert argv and secret.encode() not in argv, argv  # empty: it was not live
        for proc in (agent, *ranks):
            assert b"trainer." in _argv(proc.pid)  # still live: ...
            assert b"ILAB_NOTIFY" not in Path(f"/proc/{proc.pid}/environ").read_bytes()
        out, err = job.communicate(timeout=240)
        _, watch_err = watch.communicate(timeout=60)
    finally:
        kill_tree(job.pid)
        if watch is not None:
            watch.kill()
    assert job.returncode == 0 and watch.returncode == 0, err + watch_err
    kinds = sorted((a["kind"], a.get("condition")) for a in _alerts(ckpt))
    assert kinds == [("completed", None), ("condition", "steps >= 2"), ("condition", "steps >= 3")]
    bodies = wait_for(lambda: len(receiver.bodies) == 3 and receiver.bodies, 10, "3 messages")
    assert sorted((b["path"], b["title"].split(":")[0]) for b in bodies) == [
        ("/hook-train", "[ilab] completed"),
        ("/hook-train", "[ilab] condition"),
        ("/hook-watch", "[ilab] condition"),
    ]
    configs = [p.read_text() for p in (ckpt / "logs").glob("worker-config-*.json")]
    assert configs and not any(secret in text for text in configs)
    assert secret not in (ckpt / "journal.jsonl").read_text() + out + err + watch_err


def _argv(pid: int) -> bytes:
    """A process's command line as ``ps`` shows it to every user."""
    return Path(f"/proc/{pid}/cmdline").read_bytes()


#: Bad --notify input, given in the environment or as options: (environment, options,
#: a pattern of the one line that says so).
BAD_INPUT = [
    ({"ILAB_NOTIFY": " "}, [], r"ILAB_NOTIFY is set but holds no URL \(unset it"),
    ({}, ["--notify", "@missing.txt"], r"--notify @missing.txt: cannot read the file of URLs"),
    pytest.param(
        {},
        ["--notify", "@comments.txt"],
        r"--notify @comments.txt: the file holds no URL",
        marks=pytest.mark.extended,  # each case is a launch and a watcher: 4 stay default
    ),
    (
        {},
        ["--notify", "@slack.txt"],
        r"--notify @slack.txt #1 \(slack://...\): apprise cannot read this slack URL: An invalid",
    ),
    (
        {"ILAB_NOTIFY": "json://h/,msteams://a/b"},
        [],
        r"ILAB_NOTIFY #2 \(msteams://...\): apprise [\d.]+ has no msteams:// notifier; did you "
        r"mean workflow:// or workflows://\?",
    ),
    pytest.param(
        {"ILAB_NOTIFY": "json://h/ foo://x"},
        [],
        r"ILAB_NOTIFY #2 \(foo://...\): apprise [\d.]+ has no",
        marks=pytest.mark.extended,
    ),
    pytest.param(
        {},
        ["--notify", "slack://T000AAAA/B000BBBB"],
        r"--notify #1 \(slack://...\): apprise cannot",
        marks=pytest.mark.extended,
    ),
]


@needs_apprise
@pytest.mark.parametrize(("env", "args", "said"), BAD_INPUT)
def test_bad_notify_input_is_one_line_and_exit_2_before_anything_starts(
    tmp_path: Path, env: dict[str, str], args: list[str], said: str
) -> None:
    """An empty $ILAB_NOTIFY, a file of URLs that cannot be read or holds none, a URL apprise
    cannot read or has no notifier for: ilab-train and ilab-watch say so in one line and exit
    2; ilab-train leaves no run dir. A malformed Slack URL's tokens are shown nowhere (not in
    apprise's own words either); a scheme refused is never one suggested instead."""
    (tmp_path / "comments.txt").write_text("# nobody yet\n\n")
    (tmp_path / "slack.txt").write_text("slack://T000AAAA/B000BBBB\n")
    write_run(tmp_path / "old", steps=2, save_every=0)
    bad = tmp_path / "bad"
    trained = subprocess.run(
        train_argv(bad, "--max-steps", "2", *args), capture_output=True, text=True,
        cwd=tmp_path, env={**train_env(), **env}, timeout=120,
    )  # fmt: skip
    watched = cli("ilab-watch", str(tmp_path / "old"), "--replay", *args, cwd=tmp_path, env=env)
    for proc, prefix in ((trained, "ilab-train: "), (watched, "Error: ")):
        assert proc.returncode == 2, proc.stderr
        (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith(prefix)]
        assert re.search(said, line) and "Traceback" not in proc.stderr, proc.stderr
        assert "T000AAAA" not in proc.stderr and "B000BBBB" not in proc.stderr
        meant = set(re.findall(r"(\w+)://", line.partition("did you mean")[2]))
        assert meant <= _apprise_schemes() - set(re.findall(r"no (\w+)://", line)), line
    assert len(trained.stderr.strip().splitlines()) == 1 and not bad.exists()
    assert not (tmp_path / "old" / "reports").exists()


def _apprise_schemes() -> set[str]:
    from apprise.manager_plugins import NotificationManager

    return {str(s) for s in NotificationManager().schemas()}


@needs_apprise
def test_each_message_says_what_to_act_on(tmp_path: Path, receiver: Receiver) -> None:
    """A condition names the checkpoint its metric was reported for (else the newest); a
    divergence says whether training goes on; no message repeats its kind."""
    ckpt, stopped = tmp_path / "run", tmp_path / "stopped"
    for run in (ckpt, stopped):
        with JournalWriter(run) as w:
            w.append("train_begin", begin_payload(20))
            write_steps(w, 1, 12)  # a report of accuracy 0.12 for /c/checkpoints/step-000012
            w.append("log", {**log_payload(13), "loss": None, "loss_finite": False}, step=13)
    conditions = ["--notify-when", "best(accuracy) >= 0.1", "--notify-when", "steps >= 2"]
    proc = cli("ilab-watch", str(ckpt), "--replay", "--notify", receiver.url, *conditions)
    assert proc.returncode == 0, proc.stderr
    said = {(a["kind"], a.get("condition")): a["message"] for a in _alerts(ckpt)}
    assert said[("condition", "best(accuracy) >= 0.1")].endswith(
        "; reported for checkpoint /c/checkpoints/step-000012"
    )
    newest = r"; newest checkpoint (\(none yet\)|/c/checkpoints/step-0000(04|08|12))$"
    assert re.search(newest, said[("condition", "steps >= 2")])
    assert said[("diverged", None)] == (
        "loss is NaN/Inf; training goes on: an alert stops nothing (ilab-watch --divergence would)"
    )
    for (kind, _), message in said.items():
        assert not message.startswith(kind)
    assert all(f"seen: {said[k]}" in " ".join(b["message"] for b in receiver.bodies) for k in said)
    # with --divergence, its detector stops the run: the alert says so
    stop = ["--divergence", "action=stop", "--notify-on", "diverged"]
    proc = cli("ilab-watch", str(stopped), "--replay", *stop)
    assert proc.returncode == 0, proc.stderr
    (alert,) = _alerts(stopped)
    assert alert["message"] == "loss is NaN/Inf; --divergence ends the run (action=stop)"
