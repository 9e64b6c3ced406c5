"""Writing control commands (docs/python-api.md, "Control commands"). Pure Python: no torch.

A command is one JSON file ``<ckpt_dir>/control/<id>.json``, written to a temp file in the
same directory and renamed, so the trainer never sees half a command and many writers
(people, scripts, watchers on other hosts) can write at once.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from journal.events import CONTROL_COMMANDS
from journal.files import atomic_write
from journal.inbox import MAX_NAME_CHARS, clip
from journal.paths import control_dir

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
