"""Running one callback command: its environment, its lifetime and its output.

The record reaches the command as a file (``ILAB_EVENT_FILE``, also its stdin) and, when
small enough, in ``ILAB_EVENT_JSON``: the kernel refuses an environment string over
128 KiB (``Argument list too long``). stdout and stderr go to anonymous temporary files,
not pipes: the watcher's memory does not grow with the output (only the tail of each
stream is read back), and a daemon the command started (``setsid -f ...``) that still holds
them cannot keep a delivery waiting once the command itself has exited.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import orjson

from journal.rundir.files import json_files
from journal.rundir.procs import spawn_dying_with_us, start_time
from watcher.hooks.delivery import Delivery

#: The last bytes of each output stream kept (for the delivery log; results keep less).
OUTPUT_KEEP_BYTES = 64 * 1024
#: A variable from the record is set only when its value is at most this long (the
#: record itself is always whole in ``ILAB_EVENT_FILE``).
MAX_ENV_VALUE_BYTES = 64 * 1024
#: All ``ILAB_<FIELD>`` payload variables together (the kernel's limit for the whole
#: environment and argv is a few MB, shared with what the watcher inherited).
PAYLOAD_ENV_BUDGET = 256 * 1024
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Tail:
    """The end of one output stream: the last bytes, and how many came before them."""

    data: bytes = b""
    dropped: int = 0


@dataclass
class CommandRun:
    """How a command ended: ``ok``, ``failed`` or ``timeout``, with its output tails."""

    status: str
    exit_code: int | None
    error: str | None
    stdout: Tail
    stderr: Tail


def _fits(value: str) -> bool:
    return "\0" not in value and len(value.encode("utf-8", "surrogatepass")) <= (
        MAX_ENV_VALUE_BYTES
    )


def command_env(
    d: Delivery, payload: bytes, event_file: Path, report_file: Path, journal: Path
) -> dict[str, str]:
    """The environment of ``d``'s command (``payload``: its record as JSON, in
    ``event_file``; ``report_file``: its ``$ILAB_REPORT``): the watcher's, plus ``ILAB_*``
    from the record. Values that cannot be environment strings (over 64 KiB, or with a NUL
    byte) and fields whose names cannot be variable names are left out: they are in the
    event file."""
    rec = d.record
    env = dict(os.environ)
    budget = PAYLOAD_ENV_BUDGET
    for k, v in rec["data"].items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            value = "" if v is None else str(v)
            if _ENV_NAME.fullmatch(k) and _fits(value) and len(value) <= budget:
                env[f"ILAB_{k.upper()}"] = value
                budget -= len(value)
    envelope = {
        "ILAB_EVENT": rec["event"],
        "ILAB_STEP": rec["step"],
        "ILAB_EPOCH": rec["epoch"],
        "ILAB_RUN_ID": rec["run_id"],
        "ILAB_SEQ": rec["seq"],
        "ILAB_ATTEMPT": rec["attempt"],
    }
    env.update({k: str(v) for k, v in envelope.items() if _fits(str(v))})
    env.update(
        ILAB_CKPT_DIR=str(journal.parent),
        ILAB_JOURNAL=str(journal),
        ILAB_DELIVERY_ID=d.delivery_id,
        ILAB_EVENT_FILE=str(event_file),
        ILAB_REPORT=str(report_file),
    )
    env.pop("ILAB_EVENT_JSON", None)  # never one inherited from the watcher's environment
    if len(payload) <= MAX_ENV_VALUE_BYTES and b"\0" not in payload:
        env["ILAB_EVENT_JSON"] = payload.decode()
    return env


def run_command(
    argv: list[str],
    env: dict[str, str],
    stdin_path: Path,
    timeout: float,
    mark_running: Callable[[int], Path | None],
) -> CommandRun:
    """Run ``argv`` in its own process group until it exits or ``timeout`` passes (then
    the group is killed). ``mark_running(pid)`` notes it for a restarted watcher; the
    note it returns is removed when the command is over."""
    run_argv, preexec = spawn_dying_with_us(argv)  # it ends with the watcher, kill -9 too
    with (
        open(stdin_path, "rb") as stdin,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        try:
            proc = subprocess.Popen(
                run_argv,
                stdin=stdin,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,  # its own process group: a timeout kills it whole
                preexec_fn=preexec,
            )
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in an argument
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            return CommandRun("failed", None, f"cannot start {argv[0]}: {why}", Tail(), Tail())
        marker = mark_running(proc.pid)
        try:
            proc.wait(timeout=timeout)
            status = "ok" if proc.returncode == 0 else "failed"
            error = None if proc.returncode == 0 else f"exit code {proc.returncode}"
        except subprocess.TimeoutExpired:
            kill_group(proc)
            status, error = "timeout", f"timed out after {timeout:g}s (process group killed)"
        finally:
            if marker is not None:
                with contextlib.suppress(OSError):
                    marker.unlink()
        return CommandRun(status, proc.returncode, error, read_tail(out), read_tail(err))


def read_tail(f: IO[bytes], keep: int = OUTPUT_KEEP_BYTES) -> Tail:
    """The last ``keep`` bytes written to ``f`` (a daemon may still be writing to it)."""
    size = f.seek(0, os.SEEK_END)
    start = max(0, size - keep)
    f.seek(start)
    return Tail(f.read(keep), start)


def log_text(argv: list[str], stdout: Tail, stderr: Tail) -> bytes:
    """A delivery log: the command line, then the tail of each stream."""

    def part(name: str, tail: Tail) -> bytes:
        cut = f"[... {tail.dropped} earlier bytes not kept ...]\n" if tail.dropped else ""
        return f"\n--- {name}\n{cut}".encode() + tail.data

    head = b"$ " + " ".join(argv).encode("utf-8", "surrogateescape")
    return head + part("stdout", stdout) + part("stderr", stderr)


def end_leftovers(running_dir: Path) -> int:
    """Kill the process groups of commands a previous watcher left running (it died
    mid-delivery); returns how many. A pid since reused by another process is left alone."""
    ended = 0
    for marker in json_files(running_dir):
        try:
            info = orjson.loads(marker.read_bytes())
            pgid, started = int(info["pgid"]), info.get("start")
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            with contextlib.suppress(OSError):
                marker.unlink()
            continue
        if (started is not None and start_time(pgid) == started) or start_time(pgid) is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
                ended += 1
        with contextlib.suppress(OSError):
            marker.unlink()
    return ended


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, then SIGKILL it if it has not exited within 3 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=3)
            return
        except subprocess.TimeoutExpired:
            continue
