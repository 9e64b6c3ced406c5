"""Rank 0's side of the control channel (docs/python-api.md, "Control commands").

``poll()`` is called once per step. A :class:`DirWatch` helper thread raises a flag when
the control directory changed, so a step with nothing new costs one attribute read. When the
directory changed, rank 0 reads new command files, validates them, and returns a bit mask
that the step's existing metrics all-reduce carries to every rank. No collective is added.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from journal.channels.control import COMMAND_FILE_SUFFIX
from journal.record.text import printable
from journal.rundir.inbox import (
    MAX_NAME_CHARS,
    REJECTED_DIR_NAME,
    RejectedFile,
    clip,
    move_aside,
    read_json_object,
)
from journal.rundir.paths import PROCESSED_DIR_NAME, control_dir
from journal.rundir.safety import safe_dir
from trainer.steering.dir_watch import DirWatch
from trainer.steering.policy import BITS, Capabilities

log = logging.getLogger(__name__)

MAX_FILES_PER_POLL = 64
STALE_REASON = "stale: it was in control/ before this training attempt started"

#: What tells one file from another that later took its name: a new file (an atomic
#: rename) has a new inode or modification time, both set on the trainer's side.
FileIdentity = tuple[int, int, int, int]


def file_identity(path: Path) -> FileIdentity | None:
    """The identity of the directory entry ``path`` (not followed), None when it is gone."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns


def command_files(directory: Path) -> dict[str, FileIdentity]:
    """The command files in ``directory`` now, by name (empty when it does not exist).

    The staleness rule: a command whose file is among these when the attempt starts was
    written for an earlier attempt (a stop left by a callback of the last one must not end a
    resumed run); every file that arrives later is fresh, whatever the writer's clock said.
    """
    try:
        names = _command_names(directory)
    except OSError:
        return {}
    identities = {name: file_identity(directory / name) for name in names}
    return {name: ident for name, ident in identities.items() if ident is not None}


def _command_names(directory: Path) -> list[str]:
    """The command files in ``directory``, sorted, hidden ones left out (OSError when it
    cannot be listed)."""
    names = os.listdir(directory)
    return sorted(n for n in names if n.endswith(COMMAND_FILE_SUFFIX) and not n.startswith("."))


@dataclass
class Command:
    command: str
    id: str
    source: str | None
    reason: str | None


@dataclass
class Rejection:
    id: str | None
    command: str | None
    source: str | None
    reason: str
    malformed: bool = False  # not a command at all: its file goes to control/rejected/


def rejection_line(rej: Rejection) -> str:
    """A rejection as the one line rank 0 logs: ``control stop (id X, from h:1) rejected:
    stale: ...``; control characters from the file are shown, not obeyed."""
    who = ", ".join(f"{k} {v}" for k, v in (("id", rej.id), ("from", rej.source)) if v is not None)
    what = " ".join(x for x in (rej.command, f"({who})" if who else None) if x)
    line = f"control {what} rejected: {rej.reason}" if what else f"control: {rej.reason}"
    return printable(line)


def _control_record(
    verdict: Command | Rejection, accepted: bool, step: int | None
) -> dict[str, Any]:
    """The ``control`` record of a command applied at ``step``, or of a rejection."""
    return {
        "command": verdict.command,
        "id": verdict.id,
        "source": verdict.source,
        "accepted": accepted,
        "reason": verdict.reason,
        "applied_at_step": step,
    }


class ControlPoller:
    """Finds, validates and de-duplicates command files for rank 0."""

    def __init__(
        self,
        ckpt_dir: Path,
        seen_ids: set[str],
        *,
        interval: float = 0.02,
        capabilities: Capabilities | None = None,
    ) -> None:
        self.dir = control_dir(ckpt_dir)
        # What this trainer can carry out: any other command is rejected here, on rank 0,
        # before it reaches the agreement (trainer/steering/policy.py).
        self.capabilities = capabilities or Capabilities("this trainer")
        self.processed = self.dir / PROCESSED_DIR_NAME
        self.seen = seen_ids
        # The command files in control/ when this attempt started (taken by start()): they
        # were written for an earlier attempt, so they are stale. Judged by arrival, on this
        # host's view of the directory, never by the writer's clock (its ``ts``).
        self.there_at_start: dict[str, FileIdentity] = {}
        self.watch = DirWatch(self.dir, interval=interval, name="ilab-control-watch")
        self._warned_unsafe = False
        self.pending: list[Command] = []  # accepted, waiting for the next all-reduce
        self.rejected: list[Rejection] = []  # to journal as control records

    def start(self) -> None:
        """Note the command files already there (stale: see :func:`command_files`), create
        the control dir (0o750) and start watching it. Call it when the attempt starts."""
        self.there_at_start = command_files(self.dir)
        self.watch.start()

    def close(self) -> None:
        self.watch.close()

    def poll(self) -> int:
        """Bit mask of the commands to apply at this step boundary (0 when none)."""
        if not self.watch.changed:
            return 0  # the common case: one attribute read
        self.watch.changed = False
        try:
            st = os.stat(self.dir)
        except FileNotFoundError:
            return 0
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            if not self._warned_unsafe:
                self._warned_unsafe = True
                msg = (
                    f"control dir {self.dir} is writable by group or others "
                    f"(mode {stat.S_IMODE(st.st_mode):o}); commands are ignored until it is "
                    "not (chmod go-w)"
                )
                self.rejected.append(Rejection(None, None, None, msg))
            return 0  # a chmod changes ctime: the helper thread raises the flag again
        self._scan()
        self.watch.scanned()
        mask = 0
        for cmd in self.pending:
            mask |= BITS[cmd.command]
        return mask

    def journal(
        self, emit: Callable[[str, dict[str, Any]], Any], step: int
    ) -> list[dict[str, Any]]:
        """Journal the rejections and the commands carried by this step's agreement as
        ``control`` records; returns the applied ones' records."""
        rejected, self.rejected = self.rejected, []  # taken: each is journaled once
        carried, self.pending = self.pending, []
        for rej in rejected:
            log.warning("%s", rejection_line(rej))  # one line on the trainer's console
            emit("control", _control_record(rej, False, None))
        applied = [_control_record(cmd, True, step) for cmd in carried]
        for rec in applied:
            emit("control", rec)
        return applied

    def _scan(self) -> None:
        try:
            names = _command_names(self.dir)
        except OSError as exc:
            log.warning("cannot list %s: %s", self.dir, exc)
            return
        for name in names[:MAX_FILES_PER_POLL]:
            path = self.dir / name
            if (cmd_or_rej := self._parse(path)) is None:
                continue  # gone meanwhile
            cid = cmd_or_rej.id
            if cid is not None and cid in self.seen:
                self._archive(path)  # applied before (e.g. before a resume): never again
                continue
            if cid is not None:
                self.seen.add(cid)
            if isinstance(cmd_or_rej, Command):
                self.pending.append(cmd_or_rej)
                self._archive(path)
            elif cmd_or_rej.malformed:
                moved = move_aside(path)
                where = f"moved to control/{REJECTED_DIR_NAME}/" if moved else "left in place"
                cmd_or_rej.reason = clip(f"{cmd_or_rej.reason}; {where}")
                self.rejected.append(cmd_or_rej)
            else:
                self.rejected.append(cmd_or_rej)
                self._archive(path)
        if len(names) > MAX_FILES_PER_POLL:
            self.watch.changed = True  # more to read next step

    def _parse(self, path: Path) -> Command | Rejection | None:
        """The command in a file, or why it is refused; None when the file is gone. Only a
        regular file of at most 64 KiB is read (never a FIFO, never through a symlink)."""
        stem = path.name.removesuffix(COMMAND_FILE_SUFFIX)
        try:
            obj = read_json_object(path)
        except FileNotFoundError:
            return None
        except RejectedFile as exc:
            return Rejection(stem, None, None, f"command file refused: {exc}", malformed=True)
        cid = obj.get("id")
        if not (isinstance(cid, str) and 0 < len(cid) <= MAX_NAME_CHARS):
            cid = stem  # no usable id of its own: the file's name
        command, source, reason = obj.get("command"), obj.get("source"), obj.get("reason")
        source = clip(source, MAX_NAME_CHARS) if isinstance(source, str) else None
        reason = clip(reason) if isinstance(reason, str) else None  # a 50 MB reason: a few KB
        if not isinstance(command, str) or command not in BITS:  # a list is not even hashable
            return Rejection(
                cid,
                clip(command, MAX_NAME_CHARS) if isinstance(command, str) else None,
                source,
                clip(f"unknown command {command!r}; expected one of {', '.join(BITS)}"),
                malformed=True,
            )
        before = self.there_at_start.get(path.name)
        if before is not None and before == file_identity(path):
            return Rejection(cid, command, source, STALE_REASON)
        refusal = self.capabilities.refusal(command)
        if refusal is not None:
            return Rejection(cid, command, source, clip(refusal))
        return Command(command, cid, source, reason)

    def _archive(self, path: Path) -> None:
        try:
            os.replace(path, safe_dir(path.parent, self.processed) / path.name)
        except OSError as exc:
            log.warning("cannot move %s to %s: %s", path, self.processed, exc)
