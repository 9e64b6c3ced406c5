"""ilab-watch with real subprocess callbacks, real files and real watchdog."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from journal import JournalWriter, read_all
from journal.rundir.lock import RunLock
from tests.helpers import BIN, cli, wait_for, write_run
from watcher.embedded import EmbeddedWatcher

RECORDER = textwrap.dedent(
    """
    import json, os, sys
    out = os.environ["RECORD_TO"]
    stdin = json.load(sys.stdin)
    env = {k: v for k, v in os.environ.items() if k.startswith("ILAB_") and k != "ILAB_EVENT_JSON"}
    with open(out, "a") as f:
        f.write(json.dumps({"argv": sys.argv[1:], "env": env, "stdin_seq": stdin["seq"],
                            "event_json_seq": json.loads(os.environ["ILAB_EVENT_JSON"])["seq"]}) + "\\n")
    """
)


@pytest.fixture
def recorder(tmp_path: Path) -> tuple[Path, Path]:
    script = tmp_path / "record.py"
    script.write_text(RECORDER)
    return script, tmp_path / "calls.jsonl"


def calls(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def watch(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return cli("ilab-watch", *args, env=env or {}, timeout=timeout)


def spawn_watch(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [str(BIN / "ilab-watch"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the start-up line: hooks are validated, tailing begins
    assert "hook(s) on" in first, first
    return proc


def wait_for_stderr(proc: subprocess.Popen[str], needle: str, timeout: float = 60) -> str:
    """Wait until the watcher (started with -vv) prints a stderr line containing ``needle``.
    A thread reads the pipe into a list (select on a buffered text pipe misses lines that
    were read ahead into the buffer)."""
    lines: list[str] = getattr(proc, "_lines", None) or []
    if not hasattr(proc, "_lines"):
        proc._lines = lines  # type: ignore[attr-defined]
        assert proc.stderr is not None
        threading.Thread(
            target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True
        ).start()
    return wait_for(
        lambda: next((x for x in lines if needle in x), None),
        timeout=timeout,
        what=f"a stderr line with {needle!r}",
    )


def save_payload(path: str) -> dict[str, Any]:
    return {"checkpoint_path": path, "kind": ["full_state", "hf"], "duration": 0.1}


def test_late_attach_catches_up_and_exits_after_train_end(
    ckpt: Path, recorder: tuple[Path, Path]
) -> None:
    script, out = recorder
    write_run(ckpt, steps=12, save_every=4)  # three saves, then train_end, already on disk
    proc = watch(
        str(ckpt),
        "--on-save",
        f"{script} {{checkpoint_path}} step={{step}}",
        env={"RECORD_TO": str(out)},
    )
    assert proc.returncode == 0, proc.stderr
    got = calls(out)
    assert [c["argv"] for c in got] == [
        [str(ckpt / f"checkpoints/step-{s:06d}"), f"step={s}"] for s in (4, 8, 12)
    ]
    for c in got:
        env = c["env"]
        assert env["ILAB_EVENT"] == "save" and env["ILAB_CKPT_DIR"] == str(ckpt)
        assert env["ILAB_CHECKPOINT_PATH"] == c["argv"][0]
        assert int(env["ILAB_SEQ"]) == c["stdin_seq"] == c["event_json_seq"]
        assert (
            env["ILAB_DELIVERY_ID"] and env["ILAB_RUN_ID"] and env["ILAB_STEP"] == c["argv"][1][5:]
        )
    results = [
        json.loads(x)
        for x in next((ckpt / "watch").glob("*.results.jsonl")).read_text().splitlines()
    ]
    assert [r["status"] for r in results] == ["ok"] * 3
    assert all(r["exit_code"] == 0 and r["duration"] is not None for r in results)


def test_journal_created_after_the_watcher_starts(
    tmp_path: Path, recorder: tuple[Path, Path]
) -> None:
    script, out = recorder
    ckpt = tmp_path / "later"
    ckpt.mkdir()
    proc = spawn_watch(str(ckpt), "--on-save", str(script), env={"RECORD_TO": str(out)})
    try:
        with JournalWriter(ckpt) as w:
            w.append("train_begin", {})
            w.append("save", save_payload("/c/1"), step=1)
            w.append("train_end", {"status": "completed"}, step=1)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert [c["env"]["ILAB_CHECKPOINT_PATH"] for c in calls(out)] == ["/c/1"]


def test_polling_mode_delivers(tmp_path: Path, recorder: tuple[Path, Path]) -> None:
    script, out = recorder
    ckpt = tmp_path / "polled"
    ckpt.mkdir()
    proc = spawn_watch(
        str(ckpt), "--poll", "0.1", "--on-save", str(script), env={"RECORD_TO": str(out)}
    )
    try:
        with JournalWriter(ckpt) as w:
            w.append("save", save_payload("/c/p"), step=3)
            wait_for(lambda: calls(out), what="first delivery while polling")
            w.append("train_end", {"status": "completed"}, step=3)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert len(calls(out)) == 1


def test_replay_over_a_finished_journal(ckpt: Path, recorder: tuple[Path, Path]) -> None:
    script, out = recorder
    write_run(ckpt, steps=6, save_every=2)
    before = (ckpt / "journal.jsonl").read_bytes()
    args = (str(ckpt), "--replay", "--on-save", str(script), "--on", "train_end", str(script))
    proc = watch(*args, env={"RECORD_TO": str(out)})
    assert proc.returncode == 0, proc.stderr
    assert [c["env"]["ILAB_EVENT"] for c in calls(out)].count("save") == 3
    assert [c["env"]["ILAB_EVENT"] for c in calls(out)].count("train_end") == 1
    assert (ckpt / "journal.jsonl").read_bytes() == before
    # The cursor remembers: replaying again delivers nothing new.
    proc = watch(*args, env={"RECORD_TO": str(out)})
    assert proc.returncode == 0 and len(calls(out)) == 4


def test_restart_after_kill_9_mid_callback_neither_loses_nor_repeats(
    ckpt: Path, tmp_path: Path
) -> None:
    log = tmp_path / "log.txt"
    release = tmp_path / "release"
    script = tmp_path / "slow.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, time, sys
        seq = os.environ["ILAB_SEQ"]
        with open({str(log)!r}, "a") as f:
            f.write(f"start {{seq}} {{os.environ['ILAB_DELIVERY_ID']}} {{os.getpid()}}\\n")
        if os.environ["ILAB_STEP"] == "8":
            while not os.path.exists({str(release)!r}):
                time.sleep(0.02)
        with open({str(log)!r}, "a") as f:
            f.write(f"end {{seq}}\\n")
    """)
    )
    write_run(ckpt, steps=12, save_every=4)
    saves = [r["seq"] for r in read_all(ckpt / "journal.jsonl").records if r["event"] == "save"]
    args = (str(ckpt), "--on-save", str(script), "--name", "evals")
    first = spawn_watch(*args, env={})

    def lines() -> list[list[str]]:
        return [x.split() for x in log.read_text().splitlines()] if log.exists() else []

    started = wait_for(
        lambda: [x for x in lines() if x[:2] == ["start", str(saves[1])]],
        what="second save to start",
    )
    first.send_signal(signal.SIGKILL)
    first.wait()
    os.kill(int(started[0][3]), signal.SIGKILL)  # the callback ran in its own session
    release.touch()
    proc = watch(*args)
    assert proc.returncode == 0, proc.stderr
    starts = [x[1] for x in lines() if x[0] == "start"]
    ends = [x[1] for x in lines() if x[0] == "end"]
    assert starts == [
        str(saves[0]),
        str(saves[1]),
        str(saves[1]),
        str(saves[2]),
    ]  # only the interrupted one again
    assert sorted(ends) == sorted(str(s) for s in saves)
    ids = [x[2] for x in lines() if x[:2] == ["start", str(saves[1])]]
    assert ids[0] == ids[1]  # same ILAB_DELIVERY_ID: callbacks can drop duplicates


def test_unreadable_cursor_replays_from_the_start_with_a_warning(
    ckpt: Path, recorder: tuple[Path, Path]
) -> None:
    script, out = recorder
    write_run(ckpt, steps=4, save_every=2)
    state = ckpt / "watch"
    state.mkdir()
    (state / "c.cursor.json").write_text("")  # e.g. a crash of a tool that is not ours
    proc = watch(
        str(ckpt), "--replay", "--name", "c", "--on-save", str(script), env={"RECORD_TO": str(out)}
    )
    assert proc.returncode == 0
    assert "unreadable" in proc.stderr and "replaying from the start" in proc.stderr
    assert len(calls(out)) == 2


def test_replaced_journal_is_detected_and_read_again(
    ckpt: Path, recorder: tuple[Path, Path]
) -> None:
    script, out = recorder
    write_run(ckpt, steps=4, save_every=2, end=None)
    proc = spawn_watch(str(ckpt), "--on-save", str(script), env={"RECORD_TO": str(out)})
    try:
        wait_for(lambda: len(calls(out)) == 2, what="two deliveries from the first journal")
        new = ckpt / "new.jsonl"
        with JournalWriter(new) as w:
            w.append("train_begin", {})
            w.append("save", save_payload("/second/run"), step=1)
            w.append("train_end", {"status": "completed"}, step=1)
        os.replace(new, ckpt / "journal.jsonl")
        assert proc.wait(timeout=30) == 0
        err = proc.stderr.read()
    finally:
        proc.kill()
    assert "was replaced" in err or "was truncated" in err
    assert [c["env"]["ILAB_CHECKPOINT_PATH"] for c in calls(out)][-1] == "/second/run"


def test_failing_callback_retries_and_exit_1(ckpt: Path, tmp_path: Path) -> None:
    write_run(ckpt, steps=2, save_every=2)
    script = tmp_path / "fail.py"
    script.write_text(
        "import sys; print('out-line'); print('boom happened', file=sys.stderr); sys.exit(3)\n"
    )
    proc = watch(
        str(ckpt), "--replay", "--on-save", str(script), "--retries", "2", "--backoff", "0.01"
    )
    assert proc.returncode == 1
    assert "failed" in proc.stderr and "log:" in proc.stderr
    res = json.loads(next((ckpt / "watch").glob("*.results.jsonl")).read_text().splitlines()[-1])
    assert res["status"] == "failed" and res["exit_code"] == 3 and res["attempts"] == 3
    assert "boom happened" in res["stderr_tail"] and "out-line" in res["stdout_tail"]
    assert "boom happened" in Path(res["log_path"]).read_text()


def test_hanging_callback_is_killed_with_its_process_group(
    ckpt: Path, tmp_path: Path, recorder: tuple[Path, Path]
) -> None:
    script, out = recorder
    pids = tmp_path / "pids"
    hang = tmp_path / "hang.py"
    hang.write_text(
        textwrap.dedent(f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pids)!r}, "a").write(f"{{os.getpid()}} {{child.pid}}\\n")
        time.sleep(600)
    """)
    )
    write_run(ckpt, steps=2, save_every=2)
    t0 = time.monotonic()
    proc = watch(
        str(ckpt),
        "--replay",
        "--timeout",
        "1.5",
        "--concurrency",
        "1",
        "--on-save",
        str(hang),
        "--on-save",
        str(script),
        env={"RECORD_TO": str(out)},
    )
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 1
    assert len(calls(out)) == 1  # the other hook on the same event ran regardless
    res = [
        json.loads(x)
        for x in next((ckpt / "watch").glob("*.results.jsonl")).read_text().splitlines()
    ]
    assert sorted(r["status"] for r in res) == ["ok", "timeout"]
    for pid in map(int, pids.read_text().split()):
        wait_for(lambda pid=pid: not _alive(pid), timeout=10, what=f"pid {pid} to be gone")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (no reaper in containers) counts as gone
        return f.read().split()[2] != "Z"


HOSTILE = [
    "/ckpt/a; rm -rf x",
    '/ckpt/it\'s "quoted"',
    "/ckpt/with spaces/step 1",
    "/ckpt/$(touch pwned)/`touch pwned2`",
]


@pytest.mark.parametrize("shell", [False, True])
def test_hostile_checkpoint_paths_reach_the_callback_verbatim(
    tmp_path: Path, recorder: tuple[Path, Path], shell: bool
) -> None:
    script, out = recorder
    ckpt = tmp_path / "ck"
    victim = tmp_path / "x"
    victim.mkdir()
    with JournalWriter(ckpt) as w:
        for i, p in enumerate(HOSTILE):
            w.append("save", save_payload(p), step=i + 1)
        w.append("train_end", {"status": "completed"})
    cmd = f"python {script} {{checkpoint_path}} --tag=before{{checkpoint_path}}after"
    args = [str(ckpt), "--replay", "--on-save", cmd] + (["--shell"] if shell else [])
    proc = subprocess.run(
        [str(BIN / "ilab-watch"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "RECORD_TO": str(out)},
    )
    assert proc.returncode == 0, proc.stderr
    got = calls(out)
    assert [c["argv"] for c in got] == [[p, f"--tag=before{p}after"] for p in HOSTILE]
    assert [c["env"]["ILAB_CHECKPOINT_PATH"] for c in got] == HOSTILE
    assert victim.is_dir()
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_class_callback_from_a_file_with_control(ckpt: Path, tmp_path: Path) -> None:
    mod = tmp_path / "mycb.py"
    mod.write_text(
        textwrap.dedent(f"""
        import json
        from journal import Control
        from watcher import TrainerCallback

        class StopOnSecondSave(TrainerCallback):
            def __init__(self):
                self.saves = 0
            def on_save(self, event, checkpoint_path, **data):
                self.saves += 1
                open({str(tmp_path / "seen.txt")!r}, "a").write(checkpoint_path + "\\n")
                if self.saves == 2:
                    return Control.stop("two saves are enough")
    """)
    )
    write_run(ckpt, steps=6, save_every=2, end=None)
    launcher = RunLock(ckpt)  # its launcher holds the run: the stop is for an attempt to apply
    launcher.acquire(timeout=5)
    try:
        proc = watch(str(ckpt), "--replay", "--callback", f"{mod}:StopOnSecondSave")
    finally:
        launcher.release()
    assert proc.returncode == 0, proc.stderr
    assert len((tmp_path / "seen.txt").read_text().splitlines()) == 3
    cmds = [orjson.loads(p.read_bytes()) for p in (ckpt / "control").glob("*.json")]
    assert [(c["command"], c["reason"]) for c in cmds] == [("stop", "two saves are enough")]
    assert "watcher" in cmds[0]["source"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--on", "bogus", "ls"], "unknown event 'bogus'"),
        (["--on-save", "missing_script.py"], "not found"),
        (["--on-save", "definitely-not-a-command-xyz"], "not found on PATH"),
        (["--on-save", "ls {nope}"], "unknown placeholder {nope}"),
        (["--callback", "no_such_module_xyz:Thing"], "cannot import"),
        (["--callback", "journal:NoSuchThing"], "has no attribute"),
        ([], "nothing to run"),
        (["--queue", "save=sometimes", "--on-save", "ls"], "policy must be"),
    ],
)
def test_usage_errors_are_one_clear_line_before_tailing(
    ckpt: Path, args: list[str], message: str
) -> None:
    proc = watch(str(ckpt), *args, timeout=30)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_a_run_state_or_tensorboard_dir_below_a_file_is_one_line_exit_2(
    ckpt: Path, tmp_path: Path
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    for argv in (
        [str(afile / "run"), "--on-save", "ls"],
        [str(ckpt), "--state-dir", str(afile / "state"), "--on-save", "ls"],
        [str(ckpt), "--tensorboard", str(afile / "tb")],
    ):
        proc = watch(*argv, timeout=30)
        assert proc.returncode == 2, proc.stderr
        assert f"{afile} is not a directory" in proc.stderr and "Traceback" not in proc.stderr


def test_help_explains() -> None:
    proc = watch("--help")
    assert proc.returncode == 0
    for word in ("--on-save", "--replay", "--poll", "placeholders", "at-least-once", "Exit codes"):
        assert word in proc.stdout


def test_follow_keeps_going_through_an_earlier_attempts_train_end(
    ckpt: Path, recorder: tuple[Path, Path]
) -> None:
    """A resumed run: attempt 1 ended (interrupted); the watcher must follow attempt 2."""
    script, out = recorder
    write_run(ckpt, steps=4, save_every=2, end="interrupted")
    w = JournalWriter(ckpt, resume=True)
    w.append("train_begin", {"resumed_from": "x"}, step=4)
    w.append("save", save_payload("/attempt2/step-6"), step=6)
    proc = spawn_watch(str(ckpt), "-vv", "--on-save", str(script), env={"RECORD_TO": str(out)})
    try:
        # Every delivery done, the whole file read, and still waiting for more: attempt 1's
        # train_end did not end it (a watcher that stopped there exits instead of saying so).
        size = (ckpt / "journal.jsonl").stat().st_size
        wait_for_stderr(proc, f"idle at byte {size}; waiting")
        assert len(calls(out)) == 3 and proc.poll() is None
        w.append("train_end", {"status": "completed"}, step=6)
        w.close()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert calls(out)[-1]["env"]["ILAB_CHECKPOINT_PATH"] == "/attempt2/step-6"


def _attempt(w: JournalWriter, restart: int, step: int, end: str = "failed") -> None:
    """One attempt of an ``ilab-train --max-restarts 2`` launch: its ``restart``, a save."""
    w.append("train_begin", {"config": {"max_restarts": 2}, "restart": restart}, step=step)
    w.append("save", save_payload(f"/attempt/step-{step + 2}"), step=step + 2)
    w.append("train_end", {"status": end, "reason": "boom"}, step=step + 2)


def test_a_failed_attempt_with_restarts_left_is_followed_while_its_launcher_holds_the_run(
    ckpt: Path, recorder: tuple[Path, Path]
) -> None:
    """max_restarts 2: after attempt 1's failed train_end (restart 0) and attempt 2's
    (restart 1) the launcher, holding the run dir, relaunches: the watcher waits for it;
    once the launcher lets go of the run dir without a relaunch, it ends."""
    script, out = recorder
    launcher = RunLock(ckpt)
    launcher.acquire(timeout=5)
    w = JournalWriter(ckpt)
    _attempt(w, 0, 0)
    proc = spawn_watch(str(ckpt), "-vv", "--on-save", str(script), env={"RECORD_TO": str(out)})
    try:
        for saves in (1, 2):  # attempt 1 ended, then attempt 2: each waits for a relaunch
            wait_for_stderr(proc, f"idle at byte {(ckpt / 'journal.jsonl').stat().st_size}; wait")
            assert len(calls(out)) == saves and proc.poll() is None
            if saves == 1:
                _attempt(w, 1, 2)
        launcher.release()  # the launcher gave up (or is gone): nothing more will come
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        w.close()
    assert [c["env"]["ILAB_STEP"] for c in calls(out)] == ["2", "4"]


def test_a_launchs_watcher_waits_for_its_attempt_after_an_earlier_attempts_end(
    ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """run_training's embedded watcher starts at the journal's size at launch: the earlier
    attempt's train_end there is not its end (a relaunch's watcher stopped at once, and
    its attempt's callbacks and alerts were never run)."""
    write_run(ckpt, steps=2, save_every=2, end="failed")
    seen: list[int] = []
    watcher = EmbeddedWatcher(
        ckpt,
        hooks={"save": [lambda event, **data: seen.append(event.step)]},
        callbacks=[],
        start_offset=(ckpt / "journal.jsonl").stat().st_size,
    )
    with caplog.at_level(logging.DEBUG, logger="watcher"):
        watcher.start()
        wait_for(lambda: "idle at byte" in caplog.text, timeout=30, what="the watcher waiting")
    with JournalWriter(ckpt, resume=True) as w:
        w.append("train_begin", {"resumed_from": None}, step=0)
        w.append("save", save_payload("/attempt2/step-2"), step=2)
        w.append("train_end", {"status": "completed"}, step=2)
    watcher.finish(30)
    assert seen == [2]


def test_from_now_skips_what_is_already_there(ckpt: Path, recorder: tuple[Path, Path]) -> None:
    script, out = recorder
    write_run(ckpt, steps=4, save_every=2, end=None)  # two saves already on disk
    size = (ckpt / "journal.jsonl").stat().st_size
    proc = spawn_watch(
        str(ckpt), "-vv", "--from", "now", "--on-save", str(script), env={"RECORD_TO": str(out)}
    )
    try:
        wait_for_stderr(proc, f"positioned at byte {size} ")  # the old saves are behind it
        wait_for_stderr(proc, f"idle at byte {size}; waiting")
        assert calls(out) == []
        with JournalWriter(ckpt, resume=True) as w:
            w.append("save", save_payload("/new/step-6"), step=6)
            w.append("train_end", {"status": "completed"}, step=6)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert [c["env"]["ILAB_CHECKPOINT_PATH"] for c in calls(out)] == ["/new/step-6"]


def test_a_restart_after_the_run_ended_exits_instead_of_waiting(
    ckpt: Path, recorder: tuple[Path, Path]
) -> None:
    """The cursor is already past train_end: nothing is left to wait for (found by the
    kill -9 torture test: the restarted watcher waited forever)."""
    script, out = recorder
    write_run(ckpt, steps=4, save_every=2)
    args = (str(ckpt), "--on-save", str(script), "--name", "again")
    first = watch(*args, env={"RECORD_TO": str(out)})
    assert first.returncode == 0 and len(calls(out)) == 2
    second = watch(*args, env={"RECORD_TO": str(out)}, timeout=30)
    assert second.returncode == 0, second.stderr
    assert len(calls(out)) == 2  # nothing delivered twice


def test_a_hook_new_to_a_named_cursor_is_told_where_it_starts(
    ckpt: Path, recorder: tuple[Path, Path]
) -> None:
    """``--name`` is the cursor: a hook added under it gets only what comes after the
    cursor (a new TensorBoard LOGDIR under an old name would get 0 points), said once."""
    script, out = recorder
    write_run(ckpt, steps=4, save_every=2)
    watch(str(ckpt), "--on-save", str(script), "--name", "shared", env={"RECORD_TO": str(out)})
    at_end = script.with_name("at_end.py")
    shutil.copy(script, at_end)
    args = (str(ckpt), "--on-save", str(script), "--on", "train_end", str(at_end))
    again = watch(*args, "--name", "shared", env={"RECORD_TO": str(out)})
    assert again.returncode == 0, again.stderr
    said = [x for x in again.stderr.splitlines() if "was saved without" in x]
    assert len(said) == 1 and "at_end.py" in said[0] and "--replay" in said[0], again.stderr
    assert len(calls(out)) == 2  # as said: train_end lay behind the cursor
    third = watch(*args, "--name", "shared", env={"RECORD_TO": str(out)})
    assert "was saved without" not in third.stderr  # the cursor now knows both hooks


def test_a_command_given_by_path_runs_that_path_not_its_symlink_target(tmp_path: Path) -> None:
    """A venv's bin/python is a symlink to the base interpreter: running the target instead
    would lose the venv (and its packages). The program path is used as given."""
    ckpt = tmp_path / "ck"
    with JournalWriter(ckpt) as w:
        w.append("save", save_payload("/c/step-000001"), step=1)
        w.append("train_end", {"status": "completed"})
    out = tmp_path / "prefix.txt"
    link = tmp_path / "python-link"
    link.symlink_to(sys.executable)
    code = f"import sys; open({str(out)!r}, 'w').write(sys.executable)"
    proc = subprocess.run(
        [str(BIN / "ilab-watch"), str(ckpt), "--replay", "--on-save", f"{link} -c {code!r}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == str(link)


def test_a_watcher_waiting_on_an_unfinished_run_does_not_spin(tmp_path: Path) -> None:
    """Reading the journal opens it, and inotify reports that open: a watcher woken by it
    read again, woke again, and burned a full core (halving the throughput of the training
    it watched). Only changes wake it now: waiting costs next to no CPU."""
    import psutil

    ckpt = tmp_path / "ck"
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {}})
    proc = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--on-save", "true", "-vv"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_stderr(proc, "idle at byte")
        watcher = psutil.Process(proc.pid)
        before = sum(watcher.cpu_times()[:2])
        start = time.monotonic()
        wait_for(lambda: time.monotonic() - start >= 3.0, 10, "three seconds of waiting")
        busy = sum(watcher.cpu_times()[:2]) - before
    finally:
        proc.kill()
        proc.wait()
    assert busy < 0.5, f"{busy:.2f}s of CPU in 3s of waiting"
