"""Reading the files others drop into a run's inboxes: ``control/``, ``reports/``, ``leases/``.

Whoever can write those directories hands the trainer input, so what lies there must never
hang, exhaust or crash its reader. One reader serves all three: only a regular file is read
(a symlink, FIFO, device or directory is refused, and a symlink is never followed), opened
non-blocking, at most :data:`MAX_FILE_BYTES`. A file that fails, or whose content its inbox
refuses, is moved to ``<inbox>/rejected/`` by the reader that owns the inbox, which journals
the refusal once (:func:`refusal`: a ``control`` record naming no command).
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from journal.rundir.paths import REPORTS_DIR_NAME
from journal.rundir.safety import safe_dir

#: The largest file an inbox reader reads: a command, a report (its metrics included) or a
#: lease is far smaller; a bigger one is refused without being read.
MAX_FILE_BYTES = 64 * 1024
#: Where refused files go, inside their inbox (beside ``processed/``).
REJECTED_DIR_NAME = "rejected"
#: Free text from an inbox (a command's reason, a refusal's why) is journaled up to this.
MAX_TEXT_CHARS = 4096
#: Names, sources and ids from an inbox are journaled up to this.
MAX_NAME_CHARS = 256


class RejectedFile(ValueError):
    """An inbox file that cannot be taken (why, in words fit for a journal record)."""


def read_file(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, read without blocking and
    without following a symlink. Raises :class:`RejectedFile` for anything else, and
    ``FileNotFoundError`` when the file is gone (a concurrent reader took it: not an error).
    """
    try:
        st = os.lstat(path)  # look before opening: a device is never opened at all
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise RejectedFile(f"unreadable: {exc.strerror}") from None
    _check(st, limit)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # swapped for a symlink since the lstat
            raise RejectedFile("a symbolic link (not followed)") from None
        raise RejectedFile(f"unreadable: {exc.strerror}") from None
    try:
        _check(os.fstat(fd), limit)  # what was opened, in case it was swapped meanwhile
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise RejectedFile(f"unreadable: {exc.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:  # it grew while being read
        raise RejectedFile(f"larger than the {limit // 1024} KiB limit")
    return data


def _check(st: os.stat_result, limit: int) -> None:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        raise RejectedFile("a symbolic link (not followed)")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else None
        raise RejectedFile(f"not a regular file ({kind or 'a device or socket'})")
    if st.st_size > limit:
        raise RejectedFile(f"{st.st_size} bytes, over the {limit // 1024} KiB limit")


def read_json_object(path: Path, limit: int = MAX_FILE_BYTES) -> dict[str, Any]:
    """:func:`read_file`, parsed as one JSON object; :class:`RejectedFile` otherwise."""
    raw = read_file(path, limit)
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RejectedFile(f"invalid JSON: {clip(str(exc), MAX_NAME_CHARS)}") from None
    if not isinstance(obj, dict):
        raise RejectedFile("not a JSON object")
    return obj


def checked_id(obj: Mapping[str, Any], error: type[ValueError]) -> str:
    """An inbox file's ``id``: a string of 1 to :data:`MAX_NAME_CHARS` characters; raises
    ``error`` (the inbox's own refusal) otherwise."""
    rid = obj.get("id")
    if not isinstance(rid, str) or not 0 < len(rid) <= MAX_NAME_CHARS:
        raise error(f"id must be a string of 1 to {MAX_NAME_CHARS} characters")
    return rid


def checked_text(
    obj: Mapping[str, Any], key: str, error: type[ValueError], limit: int = MAX_TEXT_CHARS
) -> str | None:
    """``obj[key]``: a string of at most ``limit`` characters, or None; raises ``error``."""
    value = obj.get(key)
    if value is not None and (not isinstance(value, str) or len(value) > limit):
        raise error(f"{key} must be a string of at most {limit} characters, or null")
    return value


def checked_time(obj: Mapping[str, Any], key: str, error: type[ValueError]) -> float:
    """``obj[key]`` as a Unix time: a finite number, not a boolean; raises ``error``."""
    at = obj.get(key)
    if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at):
        shown = orjson.dumps(at)[:40].decode(errors="replace")
        raise error(f"{key} must be a Unix time, not {shown}")
    return float(at)


def checked_int(obj: Mapping[str, Any], key: str, error: type[ValueError]) -> int | None:
    """``obj[key]``: an integer (not a boolean) or None; raises ``error``."""
    value = obj.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise error(f"{key} must be an integer or null")
    return value


def move_aside(path: Path) -> Path | None:
    """Move a refused file into its inbox's ``rejected/`` so no reader trips on it again;
    returns where it went, or None when it could not be moved (logged; the caller must
    then remember it itself)."""
    dest = path.parent / REJECTED_DIR_NAME  # the inbox's rejected/
    try:  # renames the entry: a FIFO or symlink is not opened; rejected/ is no link
        os.replace(path, safe_dir(path.parent, dest) / path.name)
    except FileNotFoundError:
        return None  # another reader moved it first
    except OSError as exc:
        import logging  # only on this rare path: readers such as status never pay for it

        logging.getLogger(__name__).warning(
            "cannot move %s to %s: %s", path, dest, exc.strerror or exc
        )
        return None
    return dest / path.name


def clip(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    keep = limit - len(f"… [truncated {len(text)} characters]")  # the longest note
    return f"{text[: max(keep, 0)]}… [truncated {len(text) - max(keep, 0)} characters]"


def refusal(path: Path, why: str, moved_to: Path | None, source: Any = None) -> dict[str, Any]:
    """The payload of the ``control`` record that journals a refused inbox file: no command,
    not accepted, the file (``<inbox>/<name>``), why, and where it went."""
    where = f"{path.parent.name}/{path.name}"
    then = (
        f"moved to {path.parent.name}/{REJECTED_DIR_NAME}/"
        if moved_to is not None
        else "left in place (cannot be moved aside)"
    )
    return {
        "command": None,
        "id": None,
        "source": clip(source, MAX_NAME_CHARS) if isinstance(source, str) else None,
        "accepted": False,
        "reason": clip(f"{clip(where, MAX_NAME_CHARS)} refused: {why}; {then}"),
        "applied_at_step": None,
    }


@dataclass(frozen=True)
class RefusedFile:
    """An inbox file refused when it was read (what its ``control`` record says)."""

    inbox: str  # control, reports or leases
    name: str  # its file name there (a report's is its id and ``.json``)
    why: str  # the reason, without where the file went

    @property
    def stem(self) -> str:
        return self.name.removesuffix(".json")


#: How :func:`refusal` words its reason: ``<inbox>/<name> refused: <why>; <where it went>``.
_REFUSED = re.compile(r"(?P<inbox>[^/]+)/(?P<name>[^/]+) refused: (?P<why>.*)", re.S)
_WENT = ("; moved to ", "; left in place (cannot be moved aside)")


def refused_file(data: Mapping[str, Any]) -> RefusedFile | None:
    """The inbox file a ``control`` record's payload says :func:`refusal` refused, or None
    (a command's verdict names its command)."""
    reason = data.get("reason")
    if data.get("command") is not None or data.get("accepted") is not False:
        return None
    if not isinstance(reason, str) or not (m := _REFUSED.match(reason)):
        return None
    why = m["why"]
    for went in _WENT:
        if (at := why.rfind(went)) >= 0:
            why = why[:at]
            break
    return RefusedFile(m["inbox"], m["name"], why)


def refused_report(data: Mapping[str, Any]) -> RefusedFile | None:
    """The report file a ``control`` record's payload says was refused (its ``name`` is
    the report's id and ``.json``), or None (a command's verdict, another inbox's refusal).
    ``ilab-journal status`` counts these, and a watcher tells the hook whose report it was."""
    refused = refused_file(data)
    return refused if refused is not None and refused.inbox == REPORTS_DIR_NAME else None
