"""Writing control commands (docs/python-api.md, "Control commands"). Pure Python: no torch.

A command is one JSON file ``<ckpt_dir>/control/<id>.json``, written to a temp file in the
same directory and renamed, so the trainer never sees half a command and many writers
(people, scripts, watchers on other hosts) can write at once. The trainer's verdict is a
``control`` record in the journal naming the id: :func:`wait_for_verdict` waits for it.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from journal.events import CONTROL_COMMANDS
from journal.files import atomic_write
from journal.format import printable
from journal.inbox import MAX_NAME_CHARS, RejectedFile, clip, read_json_object
from journal.lock import lock_holder, run_holder
from journal.paths import control_dir, journal_path
from journal.reader import end_of_complete_lines, last_record
from journal.tailing import RotatingReader

COMMAND_FILE_SUFFIX = ".json"


class InvalidCommand(ValueError):
    """The command is unknown or malformed."""


@dataclass(frozen=True)
class Control:
    """A request to steer training, returned by Python callbacks or written directly.

    >>> Control.stop("val_loss diverged")   # finish the step, save, end as "stopped"
    """

    command: str
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.command not in CONTROL_COMMANDS:
            raise InvalidCommand(
                f"unknown control command {self.command!r}; expected one of {', '.join(CONTROL_COMMANDS)}"
            )

    @classmethod
    def stop(cls, reason: str | None = None) -> Control:
        """Finish the current step, save a final checkpoint, end with status ``stopped``."""
        return cls("stop", reason)

    @classmethod
    def abort(cls, reason: str | None = None) -> Control:
        """End at the next step boundary without saving."""
        return cls("abort", reason)

    @classmethod
    def save(cls, reason: str | None = None) -> Control:
        """Save a checkpoint at the next step boundary."""
        return cls("save", reason)

    @classmethod
    def evaluate(cls, reason: str | None = None) -> Control:
        """Run validation at the next step boundary."""
        return cls("evaluate", reason)

    @classmethod
    def log(cls, reason: str | None = None) -> Control:
        """Write a ``log`` record at the next step boundary."""
        return cls("log", reason)


def new_command_id() -> str:
    """Sortable, unique id: time first so ``ls`` shows commands in order."""
    return f"{time.time_ns():x}-{uuid.uuid4().hex[:8]}"


def send_command(
    ckpt_dir: str | os.PathLike[str],
    command: str | Control,
    *,
    reason: str | None = None,
    source: str | None = None,
    command_id: str | None = None,
) -> str:
    """Write a command file atomically; return its id. Creates the control dir (0o750).

    A ``reason`` over 4096 characters (a ``source`` over 256) is cut, saying so: the
    command file stays small enough for the trainer to read it (64 KiB at most).
    """
    if isinstance(command, Control):
        reason = command.reason if reason is None else reason
        command = command.command
    Control(command, reason)  # validate
    cdir = control_dir(ckpt_dir)
    cdir.mkdir(mode=0o750, parents=True, exist_ok=True)
    cid = command_id or new_command_id()
    # 200 bytes: the file name (id + .json) must fit the file system's 255
    if not cid or "/" in cid or cid.startswith(".") or len(cid.encode()) > 200:
        raise InvalidCommand(f"invalid command id {cid!r}")
    body: dict[str, Any] = {
        "command": command,
        "id": cid,
        "source": clip(source or f"{socket.gethostname()}:{os.getpid()}", MAX_NAME_CHARS),
        "reason": None if reason is None else clip(reason),
        "ts": time.time(),
    }
    atomic_write(
        cdir / f"{cid}{COMMAND_FILE_SUFFIX}", orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE)
    )
    return cid


@dataclass(frozen=True)
class Verdict:
    """What became of a command: ``applied`` or ``rejected`` (``data``: its ``control``
    record's payload, ``step``: the record's step), or no verdict: ``timeout``, or
    ``not_running`` (no training attempt is running to read it: the next one rejects it as
    stale, since its file is there before that attempt starts)."""

    outcome: Literal["applied", "rejected", "timeout", "not_running"]
    data: dict[str, Any] | None = None
    step: int | None = None

    @property
    def exit_code(self) -> int:
        """``ilab-journal control --wait``'s: 0 applied, 1 rejected, 124 (as timeout(1)) no
        verdict."""
        return {"applied": 0, "rejected": 1}.get(self.outcome, NO_VERDICT_EXIT)

    def line(self, command_id: str, command: str, *, waited: float, run_dir: Path) -> str:
        """The verdict in one printable line, the id first (as ``control`` prints it)."""
        data = self.data or {}
        if self.outcome == "applied":
            what = f"{command} applied at step {data.get('applied_at_step')}"
        elif self.outcome == "rejected":
            what = f"{command} rejected: {data.get('reason')}"
        elif self.outcome == "timeout":
            what = f"{command}: no verdict within {waited:g} s (still queued for the next step)"
        else:
            what = (
                f"{command}: no verdict: no training attempt is running in {run_dir} "
                "(the next one rejects it as stale)"
            )
        return printable(f"{command_id}: {what}")


#: How often :func:`wait_for_verdict` reads what the journal gained (a few bytes each time:
#: the reader goes on from its offset), and how often it asks whether a trainer still runs.
VERDICT_POLL_S = 0.1
NO_VERDICT_EXIT = 124
RUNNING_CHECK_S = 1.0


def journal_end(ckpt_dir: str | os.PathLike[str]) -> int:
    """Where the journal ends now: take it before :func:`send_command`, for
    :func:`wait_for_verdict`'s ``since`` (the verdict can only come after the command)."""
    return end_of_complete_lines(journal_path(ckpt_dir))


def wait_for_verdict(
    ckpt_dir: str | os.PathLike[str], command_id: str, *, timeout: float, since: int = 0
) -> Verdict:
    """Follow the journal from byte ``since`` until the ``control`` record of
    ``command_id`` appears, ``timeout`` seconds pass, or no attempt is running to read the
    command: the journal ends with ``train_end`` (or does not exist) and nobody holds the
    run dir (no journal writer, no launcher). A crashed attempt (no ``train_end``) or a lock
    this host cannot see (some network file systems) is waited on: ``timeout`` then."""
    path = Path(journal_path(ckpt_dir))
    reader = RotatingReader(path, since)  # mv and copytruncate lose no record
    last = last_record(path) if path.exists() else None
    seen = _Seen(command_id, last.get("event") if last else None)
    deadline = time.monotonic() + timeout
    next_check = time.monotonic()
    try:
        while True:
            reader.check()
            if verdict := seen.read(reader):
                return verdict
            now = time.monotonic()
            if now >= next_check and seen.last_event in (None, "train_end"):
                next_check = now + RUNNING_CHECK_S
                if lock_holder(ckpt_dir) is None and run_holder(ckpt_dir) is None:
                    # the verdict may have come just before the trainer let go: one more look
                    return seen.read(reader) or Verdict("not_running")
            if now >= deadline:
                return Verdict("timeout")
            time.sleep(min(VERDICT_POLL_S, max(deadline - now, 0.0)))
    finally:
        reader.close()


class _Seen:
    """What :func:`wait_for_verdict` learnt from the records so far."""

    def __init__(self, command_id: str, last_event: str | None) -> None:
        self.command_id, self.last_event = command_id, last_event

    def read(self, reader: RotatingReader) -> Verdict | None:
        """The verdict among the records the journal gained, if there."""
        for rec in reader.read().records:
            self.last_event = rec.get("event")
            data = rec.get("data") or {}
            if self.last_event == "control" and data.get("id") == self.command_id:
                outcome: Literal["applied", "rejected"] = (
                    "applied" if data.get("accepted") is True else "rejected"
                )
                return Verdict(outcome, data, rec.get("step"))
        return None


@dataclass(frozen=True)
class UnappliedCommand:
    """A command file left in ``control/`` of a run that has ended."""

    id: str
    command: str | None  # None: not a command the file could say (malformed)

    def line(self, step: int | None) -> str:
        """``control stop (id X) arrived after the run ended at step N: not applied``."""
        at = f" at step {step}" if step is not None else ""
        what = self.command or "command"
        return printable(
            f"control {what} (id {self.id}) arrived after the run ended{at}: not applied"
        )


def unapplied_commands(
    ckpt_dir: str | os.PathLike[str],
) -> tuple[int | None, list[UnappliedCommand]]:
    """The commands that arrived after the run ended, with the step it ended at.

    When the journal ends with ``train_end``, no attempt reads ``control/`` any more (the
    trainer's last look came before that record, and a resumed attempt writes
    ``train_begin`` first): the command files still there were not applied and will not be.
    Nothing is moved or journaled: the journal has one writer, and a record after
    ``train_end`` would make the next attempt continue this run. A later attempt rejects
    them as stale (their files are there when it starts), with a ``control`` record each.
    Returns ``(None, [])`` while the run goes on (or has no journal)."""
    path = journal_path(ckpt_dir)
    last = last_record(path) if path.exists() else None
    if last is None or last.get("event") != "train_end":
        return None, []
    directory = control_dir(ckpt_dir)
    try:
        names = sorted(
            n for n in os.listdir(directory) if n.endswith(COMMAND_FILE_SUFFIX) and n[0] != "."
        )
    except OSError:
        names = []
    out = []
    for name in names:
        try:
            obj = read_json_object(directory / name)
        except FileNotFoundError:
            continue  # gone meanwhile
        except RejectedFile:
            obj = {}
        given, command = obj.get("id"), obj.get("command")
        cid = given if isinstance(given, str) and 0 < len(given) <= MAX_NAME_CHARS else None
        out.append(
            UnappliedCommand(
                cid or name.removesuffix(COMMAND_FILE_SUFFIX),
                command if isinstance(command, str) and command in CONTROL_COMMANDS else None,
            )
        )
    step = last.get("step")
    return step if isinstance(step, int) else None, out
