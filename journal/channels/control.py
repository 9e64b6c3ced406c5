"""Writing control commands (docs/python-api.md, "Control commands"). Pure Python: no torch.

A command is one JSON file ``<ckpt_dir>/control/<id>.json``, written to a temp file in the
same directory and renamed, so the trainer never sees half a command and many writers
(people, scripts, watchers on other hosts) can write at once. The trainer's verdict is a
``control`` record in the journal naming the id: :func:`wait_for_verdict` waits for it.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson

from journal.read.cursor import Cursor
from journal.read.lines import read_tail
from journal.read.reader import end_of_complete_lines
from journal.record.events import AFTER_END_EVENTS, CONTROL_COMMANDS
from journal.record.fields import accepted
from journal.record.text import printable
from journal.rundir.files import atomic_write, json_files
from journal.rundir.inbox import MAX_NAME_CHARS, RejectedFile, clip, read_json_object
from journal.rundir.lock import JournalLocked, lock_holder, run_holder, writer_gone
from journal.rundir.paths import control_dir, journal_path

if TYPE_CHECKING:
    from journal.read.tailing import RotatingReader

COMMAND_FILE_SUFFIX = ".json"
#: What a command id may hold: it names a file in ``control/`` and is printed in one line
#: (``--wait``'s verdict, the watcher's notices), so no separator, newline or other control
#: character; up to 200 characters, so that ``<id>.json`` fits a file name's 255 bytes.
_COMMAND_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@+=-]{0,199}")


class InvalidCommand(ValueError):
    """The command is unknown or malformed."""


class CommandRefused(RuntimeError):
    """A command sent to a run that reads no more (see :func:`closed_to_commands`): nothing
    is left in ``control/``. ``command_id``: the id its refusal was journaled under (an
    ended run's journal takes the verdict, as the trainer journals one), None when nothing
    could be journaled (a dead attempt's journal is left as it died)."""

    def __init__(self, message: str, command_id: str | None = None) -> None:
        super().__init__(message)
        self.command_id = command_id


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


def check_command_id(command_id: str) -> str:
    """``command_id`` if it can name a command (letters, digits and ``_.:@+=-``, not first
    ``.`` or ``-``, 1 to 200 characters); raises InvalidCommand in one line otherwise."""
    if not _COMMAND_ID.fullmatch(command_id):
        shown = repr(command_id[:64]) + ("..." if len(command_id) > 64 else "")
        raise InvalidCommand(
            printable(
                f"invalid command id {shown}: use 1 to 200 letters, digits and _.:@+=- "
                "(the first not . or -)"
            )
        )
    return command_id


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
    command file stays small enough for the trainer to read it (64 KiB at most). A run
    that reads no more commands (:func:`closed_to_commands`) gets none: its verdict is
    :class:`CommandRefused` (journaled as rejected when the run ended), so ``control/``
    holds only what an attempt may still apply.
    """
    if isinstance(command, Control):
        reason = command.reason if reason is None else reason
        command = command.command
    Control(command, reason)  # validate
    cid = check_command_id(command_id) if command_id is not None else new_command_id()
    source = clip(source or f"{os.uname().nodename}:{os.getpid()}", MAX_NAME_CHARS)
    if closed := closed_to_commands(ckpt_dir):
        why, ended = closed
        if not ended:
            raise CommandRefused(f"{command} refused: {why}: no trainer reads commands")
        if refuse(ckpt_dir, command, cid, source, why):
            raise CommandRefused(f"{command} rejected: {why}", cid)
    body: dict[str, Any] = {
        "command": command,
        "id": cid,
        "source": source,
        "reason": None if reason is None else clip(reason),
        "ts": time.time(),
    }
    data = orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE)
    atomic_write(control_dir(ckpt_dir) / f"{cid}{COMMAND_FILE_SUFFIX}", data, root=ckpt_dir)
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
    command: the run ended (its last trainer record is ``train_end``, late reports aside; or
    no journal) and nobody holds the run dir (no journal writer, no launcher). A crashed attempt (no ``train_end``) or a lock
    this host cannot see (some network file systems) is waited on: ``timeout`` then."""
    path = Path(journal_path(ckpt_dir))
    from journal.store import follow  # only a waiting sender follows the journal

    reader = follow(path, Cursor(since))  # mv and copytruncate lose no record
    tail = read_tail(path)
    seen = _Seen(command_id, ended=tail.trainer is None or tail.ended)
    deadline = time.monotonic() + timeout
    next_check = time.monotonic()
    try:
        while True:
            reader.check()
            if verdict := seen.read(reader):
                return verdict
            now = time.monotonic()
            if now >= next_check and seen.ended:
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

    def __init__(self, command_id: str, *, ended: bool) -> None:
        # ended: no attempt runs by the journal (it ended with train_end, maybe followed
        # by late reports; or there is no journal yet)
        self.command_id, self.ended = command_id, ended

    def read(self, reader: RotatingReader) -> Verdict | None:
        """The verdict among the records the journal gained, if there."""
        for rec in reader.read().records:
            event = rec["event"]
            if event not in AFTER_END_EVENTS:
                self.ended = event == "train_end"
            data = rec["data"]
            if event == "control" and data.get("id") == self.command_id:
                outcome: Literal["applied", "rejected"] = (
                    "applied" if accepted(data) else "rejected"
                )
                return Verdict(outcome, data, rec["step"])
        return None


#: How long a refusal waits for the journal lock (the trainer lets go of it right after
#: ``train_end``); busy longer, an attempt writes: the command is its to judge.
REFUSAL_LOCK_WAIT_S = 10.0


def closed_to_commands(ckpt_dir: str | os.PathLike[str]) -> tuple[str, bool] | None:
    """Why no attempt will apply a command sent to this run now, and whether the run ended
    (its journal can take the verdict): its last trainer record is ``train_end`` (late
    reports aside: a next attempt would reject the command as stale, its file there
    before it starts), or the run died (no ``train_end``, and nobody is left to write one:
    :func:`~journal.rundir.lock.writer_gone`). None while an attempt may read it, or
    before there is a journal. Raises ``OSError`` for a journal that cannot be read."""
    last = read_tail(journal_path(ckpt_dir)).trainer or {}
    step, data = last.get("step"), last.get("data")
    if last.get("event") == "train_end":
        status = data.get("status") if isinstance(data, dict) else None
        return f"the run has ended ({status or 'ended'} at step {step})", True
    if last and writer_gone(ckpt_dir):
        return f"the run died at step {step} (no train_end, and nothing holds its dir)", False
    return None


def refuse(ckpt_dir: str | os.PathLike[str], command: str, cid: str, source: str, why: str) -> bool:
    """Journal a command's rejection as the trainer journals one (a ``control`` record, a
    guest's under the journal lock), if the run has still ended once the lock is held;
    whether it was (not: an attempt began meanwhile, and judges the command itself)."""
    from journal.store import guest  # the writer loads only for a refusal

    verdict = {"command": command, "id": cid, "source": source, "accepted": False}
    try:
        with guest(ckpt_dir, role="refusal", timeout=REFUSAL_LOCK_WAIT_S) as w:
            if not read_tail(journal_path(ckpt_dir)).ended:
                return False
            w.append("control", {**verdict, "reason": why, "applied_at_step": None})
    except JournalLocked:
        return False
    return True


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

    When the run's last ``train_end`` is the journal's last trainer record (only records of
    :data:`AFTER_END_EVENTS`, such as late reports, after it), no attempt reads ``control/`` any more (the
    trainer's last look came before that record, and a resumed attempt writes
    ``train_begin`` first): the command files still there were not applied and will not be.
    :func:`send_command` writes none to an ended run (it journals the verdict): these came
    otherwise (a file dropped by hand or by an older client, a command that raced the end).
    Nothing is moved or journaled here; a later attempt rejects them as stale (their files
    are there when it starts), with a ``control`` record each.
    Returns ``(None, [])`` while the run goes on (or has no journal)."""
    tail = read_tail(journal_path(ckpt_dir))  # its train_end, late reports after it or not
    if tail.trainer is None or not tail.ended:
        return None, []
    end = tail.trainer
    try:
        paths = json_files(control_dir(ckpt_dir))
    except OSError:  # control/ unreadable, or not a directory: nothing to tell
        paths = []
    out = []
    for path in paths:
        try:
            obj = read_json_object(path)
        except FileNotFoundError:
            continue  # gone meanwhile
        except RejectedFile:
            obj = {}
        given, command = obj.get("id"), obj.get("command")
        cid = given if isinstance(given, str) and 0 < len(given) <= MAX_NAME_CHARS else None
        out.append(
            UnappliedCommand(
                cid or path.stem,
                command if isinstance(command, str) and command in CONTROL_COMMANDS else None,
            )
        )
    step = end.get("step")
    return step if isinstance(step, int) else None, out
