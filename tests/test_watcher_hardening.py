"""ilab-watch against hostile inputs and a hostile machine (issue 18, items 4, 9, 10, 15):
records too large for an environment variable, a state dir that is full or read-only,
record text that looks like console markup, callbacks that print without end, leave daemons
holding their output, or fail with a message worth showing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from journal import JournalWriter
from tests.helpers import BIN, cli, records, small_tmpfs, wait_for, write_run
from watcher import Hook, Watcher


def results(state: Path) -> list[dict[str, Any]]:
    files = list(state.glob("*.results.jsonl"))
    return [json.loads(x) for f in files for x in f.read_text().splitlines()]


def replay(ckpt: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``ilab-watch --replay``; a watcher that hangs fails the test at ``timeout``."""
    return cli("ilab-watch", str(ckpt), "--replay", *args, timeout=timeout)


# -- item 4: a record too large for an environment variable ---------------------------------

EVENT_PROBE = textwrap.dedent(
    """
    import json, os, sys
    path = os.environ["ILAB_EVENT_FILE"]
    with open(path, "rb") as f:
        from_file = f.read()
    rec = json.loads(from_file)
    with open(os.environ["RECORD_TO"], "a") as out:
        out.write(json.dumps({
            "seq": rec["seq"], "file": path, "file_bytes": len(from_file),
            "stdin_same": sys.stdin.buffer.read() == from_file,
            "env_json": os.environ.get("ILAB_EVENT_JSON"),
            "env_note": len(os.environ.get("ILAB_NOTE", "")),
            "env_checkpoint": os.environ.get("ILAB_CHECKPOINT_PATH"),
        }) + "\\n")
    """
)


def test_records_of_any_size_reach_command_hooks_through_ilab_event_file(
    ckpt: Path, tmp_path: Path
) -> None:
    probe, out = tmp_path / "probe.py", tmp_path / "seen.jsonl"
    probe.write_text(EVENT_PROBE)
    big_note = "x" * 300_000  # over the kernel's 128 KiB per environment string
    with JournalWriter(ckpt) as w:
        w.append("save", {"checkpoint_path": "/ck/small", "kind": ["hf"], "duration": 0.1}, step=1)
        w.append(
            "save",
            {"checkpoint_path": "/ck/big", "kind": ["hf"], "duration": 0.1, "note": big_note},
            step=2,
        )
    proc = cli(
        "ilab-watch", str(ckpt), "--replay", "--on-save", str(probe), env={"RECORD_TO": str(out)}
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    small, big = (json.loads(x) for x in out.read_text().splitlines())
    # Small: the JSON is in the environment too, byte for byte what the file holds.
    assert small["stdin_same"] and json.loads(small["env_json"])["seq"] == small["seq"]
    assert small["env_checkpoint"] == "/ck/small"
    # Large: only the file (and stdin) carry it; scalar fields that fit are still variables.
    assert big["stdin_same"] and big["file_bytes"] > 300_000
    assert big["env_json"] is None and big["env_note"] == 0
    assert big["env_checkpoint"] == "/ck/big"
    # The files are cleaned up once the command ended.
    assert not Path(small["file"]).exists() and not Path(big["file"]).exists()


# -- item 9: recording a delivery must not kill the hook's thread ----------------------------


def test_record_text_that_looks_like_markup_does_not_stop_delivery(
    ckpt: Path, tmp_path: Path
) -> None:
    """A removed checkpoint's path is printed in the 'skipped' line; ``[/wiki]`` in it was
    parsed as rich markup, raised, and killed the hook's worker: the replay never ended."""
    paths = [f"/data/see [/wiki]/[bold]step-{i}" for i in range(3)]
    with JournalWriter(ckpt) as w:
        for i, p in enumerate(paths, 1):
            w.append("save", {"checkpoint_path": p, "kind": ["hf"], "duration": 0.1}, step=i)
            w.append("checkpoint_removed", {"checkpoint_path": p, "reason": "rotation"}, step=i)
    proc = replay(ckpt, "--on-save", "true", timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "MarkupError" not in proc.stderr
    assert [r["status"] for r in results(ckpt / "watch")] == ["skipped"] * 3
    for p in paths:  # shown as written, not eaten as markup
        assert p in proc.stderr


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MB tmpfs (root only; skipped where mounting is not allowed)."""
    with small_tmpfs(tmp_path, "1m") as mnt:
        yield mnt


@pytest.mark.parametrize(
    ("fault", "message"),
    [("full", "No space left on device"), ("read-only", "Read-only file system")],
)
def test_a_state_dir_that_cannot_be_written_does_not_stop_deliveries(
    ckpt: Path, tmp_path: Path, small_disk: Path, fault: str, message: str
) -> None:
    """Every write of the watcher's own state (cursor, results, logs, running markers,
    scratch files) fails: each delivery still runs, and the problem is one line."""
    write_run(ckpt, steps=6, save_every=2)
    seen = tmp_path / "seen.txt"
    hook = tmp_path / "hook.sh"
    hook.write_text(f'#!/bin/sh\necho "$ILAB_STEP" >> {seen}\n')
    hook.chmod(0o755)
    state = small_disk / "state"
    state.mkdir()
    if fault == "full":
        with pytest.raises(OSError), open(small_disk / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    else:
        subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    proc = replay(ckpt, "--state-dir", str(state), "--on-save", str(hook), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert seen.read_text().split() == ["2", "4", "6"]
    assert "Traceback" not in proc.stderr
    problem = [line for line in proc.stderr.splitlines() if message in line]
    assert len(problem) == 1, proc.stderr
    assert str(state) in problem[0] and "deliveries go on" in problem[0]
    assert "3 ok, 0 failed" in proc.stderr


# -- item 10: callback output and lifetime ---------------------------------------------------


def test_a_daemon_holding_the_callbacks_output_does_not_hold_the_delivery(
    ckpt: Path, tmp_path: Path
) -> None:
    """``setsid -f`` leaves a process in another session with the callback's stdout and
    stderr: the delivery is over when the callback is, not when that daemon is."""
    write_run(ckpt, steps=2, save_every=2)
    pidfile = tmp_path / "daemon.pid"
    cmd = f"setsid -f sh -c 'echo $$ > {pidfile}; echo started; exec sleep 120'"
    try:
        proc = replay(ckpt, "--timeout", "5", "--on-save", cmd, timeout=40)
        assert proc.returncode == 0, proc.stderr
        (res,) = results(ckpt / "watch")
        assert res["status"] == "ok" and res["exit_code"] == 0, res
    finally:
        pid = wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=10)
        os.kill(int(pid), signal.SIGKILL)


NOISY = textwrap.dedent(
    """
    import sys
    chunk = b"\\0" * (1 << 20)
    for _ in range(int(sys.argv[1])):
        sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.write(b"\\x1b[2J\\x1b[31mlast stdout line\\x07\\n")
    sys.stdout.flush()
    sys.stderr.write("noise\\n[/wiki] eval crashed: \\x1b[1mCUDA out of memory\\x1b[0m\\n\\n")
    sys.exit(3)
    """
)

#: Runs a command and prints the peak RSS (KiB) of its process tree's largest member.
PEAK_RSS = (
    "import resource, subprocess, sys\n"
    "p = subprocess.run(sys.argv[1:], capture_output=True)\n"
    "sys.stdout.buffer.write(p.stderr)\n"
    "print(f'exit={p.returncode} peak_kib={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}')\n"
)


def test_callback_output_is_capped_and_the_console_gets_no_control_bytes(
    ckpt: Path, tmp_path: Path
) -> None:
    """A callback prints 160 MB of NUL bytes and terminal escapes, then fails: the watcher's
    memory and the delivery log stay small, the console line is clean and names the
    script's last stderr line."""
    write_run(ckpt, steps=2, save_every=2)
    noisy = tmp_path / "noisy.py"
    noisy.write_text(NOISY)
    argv = [str(BIN / "ilab-watch"), str(ckpt), "--replay", "--on-save", f"{noisy} 160"]
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS, *argv], capture_output=True, timeout=120)
    *console_lines, last = proc.stdout.decode("utf-8", "replace").splitlines()
    console = "\n".join(console_lines)
    assert last.startswith("exit=1 "), proc.stdout[-2000:]
    peak_mib = int(last.split("peak_kib=")[1]) / 1024
    assert peak_mib < 150, f"the watcher held the output: {peak_mib:.0f} MiB"
    assert "\0" not in console and "\x1b" not in console and "\x07" not in console
    failure = next(x for x in console_lines if "✗" in x)
    assert "exit code 3" in failure
    assert "[/wiki] eval crashed: \\x1b[1mCUDA out of memory" in failure  # shown, escaped
    (res,) = results(ckpt / "watch")
    log = Path(res["log_path"])
    assert log.stat().st_size < 200_000  # the tail of each stream, not 160 MB
    text = log.read_bytes()
    assert b"last stdout line" in text and b"CUDA out of memory" in text
    assert b"earlier bytes not kept" in text
    assert len(res["stdout_tail"]) <= 2000 and "last stdout line" in res["stdout_tail"]


# -- what a command hands back, and the names of the files it is handed ----------------------

REPORT_WRITER = textwrap.dedent(
    """
    import os, sys
    path = os.environ["ILAB_REPORT"]
    kind = sys.argv[1]
    if kind == "fifo":
        os.mkfifo(path)  # nobody ever writes to it: reading it would block for good
    elif kind == "symlink":
        os.symlink("/dev/zero", path)  # reading it would never end
    else:
        open(path, "w").write('{"accuracy": 0.5, "pad": "' + "x" * 100_000 + '"}')
    """
)


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("fifo", "not a regular file"),
        ("symlink", "a symbolic link"),
        ("oversized", "over the 64 KiB limit"),
    ],
)
def test_a_report_file_that_is_no_small_regular_file_fails_the_delivery_clearly(
    ckpt: Path, tmp_path: Path, kind: str, why: str
) -> None:
    write_run(ckpt, steps=2, save_every=2)
    script = tmp_path / "report.py"
    script.write_text(REPORT_WRITER)
    proc = replay(ckpt, "--on-save", f"{script} {kind}", timeout=30)
    assert proc.returncode == 1, proc.stderr
    (res,) = results(ckpt / "watch")
    assert res["status"] == "failed" and "$ILAB_REPORT" in res["error"] and why in res["error"]
    assert not (ckpt / "reports").exists() or not list((ckpt / "reports").iterdir())


def test_a_hostile_run_id_cannot_place_files_outside_the_state_dir(
    ckpt: Path, tmp_path: Path
) -> None:
    """The run id is part of a delivery's id, which names its scratch files."""
    seen = tmp_path / "seen.txt"
    hook = tmp_path / "hook.sh"
    hook.write_text(
        f'#!/bin/sh\necho "$ILAB_REPORT" >> {seen}\necho "$ILAB_EVENT_FILE" >> {seen}\n'
    )
    hook.chmod(0o755)
    rec = {
        "v": 1,
        "seq": 0,
        "ts": 1.0,
        "event": "save",
        "run_id": "../../../../escaped",
        "attempt": 1,
        "step": 1,
        "epoch": 0,
        "samples_seen": 0,
        "data": {"checkpoint_path": "/ck/1", "kind": ["hf"], "duration": 0.1},
    }
    (ckpt / "journal.jsonl").write_text(json.dumps(rec) + "\n")
    proc = replay(ckpt, "--on-save", str(hook), "--name", "n")
    assert proc.returncode == 0, proc.stderr
    scratch = (ckpt / "watch" / "n.reports").resolve()
    for path in seen.read_text().split():
        assert Path(path).resolve().parent == scratch, path
        assert "escaped" in path  # still recognisable


def test_a_reporter_that_raises_stops_neither_the_hook_nor_the_replay(ckpt: Path) -> None:
    """Anything raised while a delivery is recorded is one notice; the worker goes on."""
    write_run(ckpt, steps=6, save_every=2)
    delivered: list[int] = []

    def on_save(event: Any, **data: Any) -> None:
        delivered.append(event.step)

    def reporter(out: Any) -> None:
        raise RuntimeError(f"console gone at seq {out.seq}")

    watcher = Watcher(
        ckpt / "journal.jsonl",
        [Hook("save", on_save)],
        state_dir=ckpt / "watch",
        follow=False,
        reporter=reporter,
    )
    code: list[int] = []
    t = threading.Thread(target=lambda: code.append(watcher.run()), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the replay never finished"
    assert code == [0] and delivered == [2, 4, 6]
    assert [r["status"] for r in results(ckpt / "watch")] == ["ok"] * 3
    assert any("console gone" in n for n in watcher.notices)


def test_a_report_file_replaced_by_a_directory_is_one_clear_line(
    ckpt: Path, tmp_path: Path
) -> None:
    """A hook did `rm $ILAB_REPORT; mkdir $ILAB_REPORT`: the delivery fails saying so, and
    its result keeps the attempt that ran and its log (was: "internal error:
    IsADirectoryError", attempts 0, no log path)."""
    write_run(ckpt, steps=2, save_every=2)
    hook = tmp_path / "hook.sh"
    hook.write_text('#!/bin/sh\nrm -f "$ILAB_REPORT"\nmkdir "$ILAB_REPORT"\necho evaluated\n')
    hook.chmod(0o755)
    proc = replay(ckpt, "--on-save", str(hook), "--name", "n", timeout=30)
    assert proc.returncode == 1, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    (res,) = results(ckpt / "watch")
    assert res["status"] == "failed" and res["attempts"] == 1, res
    assert res["error"] == "$ILAB_REPORT: not a regular file (a directory)", res
    assert "evaluated" in Path(res["log_path"]).read_text()
    failures = [line for line in proc.stderr.splitlines() if "✗" in line]
    assert len(failures) == 1 and "a directory" in failures[0], proc.stderr
    assert not list((ckpt / "watch" / "n.reports").iterdir())  # nothing left behind


@pytest.mark.parametrize(
    ("drop", "missing"),
    [("run_id", "run_id"), ("ts", "ts"), ("data.checkpoint_path", "data.checkpoint_path")],
)
def test_a_save_record_missing_a_required_field_is_not_delivered(
    ckpt: Path, tmp_path: Path, drop: str, missing: str
) -> None:
    """A save record appended by hand without run_id, ts or checkpoint_path reaches no
    --on-save hook: the watcher says once, in one line, which record it skipped and what it
    lacks, delivers the good ones, and validate reports it."""
    write_run(ckpt, steps=4, save_every=2, end=None)
    good = [r["seq"] for r in records(ckpt) if r["event"] == "save"]
    rec = {
        "v": 1,
        "seq": 99,
        "run_id": "r",
        "attempt": 1,
        "ts": 1.0,
        "event": "save",
        "step": 4,
        "epoch": 0,
        "samples_seen": 0,
        "data": {"checkpoint_path": "/hand/step-000004", "kind": ["hf"], "duration": 0.1},
    }
    if drop.startswith("data."):
        del rec["data"][drop[5:]]
    else:
        del rec[drop]
    with open(ckpt / "journal.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    seen = tmp_path / "seen.txt"
    hook = tmp_path / "hook.sh"
    hook.write_text(f'#!/bin/sh\necho "$ILAB_SEQ" >> {seen}\n')
    hook.chmod(0o755)
    proc = replay(ckpt, "--on-save", str(hook), timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert seen.read_text().split() == [str(seq) for seq in good]  # not seq 99
    said = [line for line in proc.stderr.splitlines() if "seq 99" in line]
    assert len(said) == 1 and "skipped" in said[0] and missing in said[0], proc.stderr
    assert [r["seq"] for r in results(ckpt / "watch")] == good
    check = cli("ilab-journal", "validate", str(ckpt))
    assert check.returncode != 0 and "seq 99" in check.stdout + check.stderr, check.stdout
