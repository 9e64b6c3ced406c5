"""Durable file operations shared by every writer of small state files.

Command files, watcher cursors and checkpoint renames all need the same two things: a file
that appears whole or not at all, and a directory entry that survives a power cut. Neither
goes through a symlink (:func:`journal.rundir.safety.open_no_follow`).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

from journal.rundir.safety import CREATE, StrPath, open_no_follow


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so a rename or create inside it is durable (best effort: some
    filesystems refuse to fsync directories)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(
    path: StrPath,
    data: bytes,
    *,
    root: StrPath,
    mode: int = 0o640,
    durable: bool = True,
    exclusive: bool = False,
) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part.

    A temp file in the same directory (a dot name readers skip) is written, fsynced and
    renamed over ``path`` (a symlink there is replaced, never followed); then the directory
    is fsynced. Its directories below ``root`` are made, and refused when one is a symlink
    (:func:`journal.rundir.safety.safe_dir`). ``durable=False`` skips both fsyncs, for
    state that means nothing after a reboot (e.g. which processes run). ``exclusive``: a
    claim: the file is linked into place only where nothing is (``FileExistsError``
    otherwise), so of any number of processes on any hosts sharing the directory exactly
    one creates it, and it appears whole.
    """
    final = Path(path)
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(open_no_follow(tmp, CREATE, mode, root=root), "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.link(tmp, final) if exclusive else os.replace(tmp, final)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    if durable:
        fsync_dir(final.parent)


def json_files(directory: Path) -> list[Path]:
    """The ``*.json`` files of an inbox directory, sorted by name; temp files (dot names)
    are not listed and a missing directory has none."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [directory / n for n in sorted(names) if n.endswith(".json") and not n.startswith(".")]
