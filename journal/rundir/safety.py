"""A run dir nobody else can steer: who may own it, who may write it, what is never followed.

Files in a checkpoint dir steer the run: ``control/`` commands stop or abort it, ``reports/``
pick the best checkpoint, ``leases/`` decide what rotation deletes, ``checkpoints/`` are
loaded on resume, and the journal and lock files are opened for writing. Whoever can create
or replace entries there can steer (or, with a planted symlink, redirect) a run. So a run
dir and those subdirectories must belong to the user running it (or to root) and be
writable by nobody else, and the journal and lock files are opened with ``O_NOFOLLOW``.

Readers (``status``, ``show``, ``tail``) do not call this: reading a colleague's journal is
fine. Everything that writes into the dir or acts on what is in it does.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from pathlib import Path

from journal.rundir.paths import (
    CHECKPOINTS_DIR_NAME,
    CONTROL_DIR_NAME,
    JOURNAL_NAME,
    LEASES_DIR_NAME,
    LOCK_NAME,
    REPORTS_DIR_NAME,
    RUN_LOCK_NAME,
)

#: Subdirectories whose files steer the run (commands, results, leases, resumed state).
STEERING_DIRS: tuple[str, ...] = (
    CONTROL_DIR_NAME,
    REPORTS_DIR_NAME,
    LEASES_DIR_NAME,
    CHECKPOINTS_DIR_NAME,
)
#: Files opened for writing by the journal's writer and the locks: never a symlink.
OPENED_FILES: tuple[str, ...] = (JOURNAL_NAME, LOCK_NAME, RUN_LOCK_NAME)
#: Mode of the directories we create: the group may read (as the journal's 0640), not write.
DIR_MODE = 0o750
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class UnsafeRunDir(PermissionError):
    """The run dir (or a file or directory in it) could be steered by someone else.

    A :class:`PermissionError`, so every command that turns permission problems into one
    line (``ilab-journal``'s ``user_errors``) does so for this too. ``str()`` is that line.
    """

    def __init__(self, path: str | os.PathLike[str], why: str) -> None:
        super().__init__(errno.EPERM, why, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _user(uid: int, *, with_uid: bool = True) -> str:
    """``alice (uid 1000)`` (``alice`` without ``with_uid``), or ``uid 4242`` for a uid
    with no name."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
    return f"{name} (uid {uid})" if with_uid else name


def trusted_owner(owner: int, uid: int) -> bool:
    """Whether a file owned by ``owner`` may steer a run of user ``uid``: their own, or
    root's (root can do anything anyway)."""
    return owner in (uid, 0)


def dir_problem(path: str | os.PathLike[str], st: os.stat_result, uid: int) -> str | None:
    """Why the directory ``path`` (its ``stat``) is not safe for a run of user ``uid``, as
    one line naming the fix; None when it is."""
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if not trusted_owner(st.st_uid, uid):
        return (
            f"owned by {_user(st.st_uid)}, not by you ({_user(uid, with_uid=False)}): its "
            "owner could steer or take over the run; use a directory of your own"
        )
    if st.st_mode & _OTHERS_WRITE:
        who = " and ".join(
            w
            for bit, w in ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "others"))
            if st.st_mode & bit
        )
        return (
            f"writable by {who} (mode {stat.S_IMODE(st.st_mode):o}): they could steer the "
            f"run; make it yours alone with `chmod go-w {path}`"
        )
    return None


def file_problem(st: os.stat_result, uid: int, *, devices: bool = False) -> str | None:
    """Why a file we are about to write (its ``lstat``/``fstat``) must not be used; None
    when it may. ``devices``: a character device (``/dev/null``) is acceptable too."""
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link: refusing to follow it (remove it)"
    if not (stat.S_ISREG(st.st_mode) or (devices and stat.S_ISCHR(st.st_mode))):
        return "not a regular file (remove it)"
    if not trusted_owner(st.st_uid, uid):
        return f"owned by {_user(st.st_uid)}, not by you ({_user(uid, with_uid=False)}): remove it"
    return None


def check_run_dir(ckpt_dir: str | os.PathLike[str]) -> None:
    """Raise :class:`UnsafeRunDir` unless ``ckpt_dir``, its steering subdirectories and its
    journal and lock files are safe for this user. Missing ones are fine (they will be
    created by us); a symlinked directory is judged by what it points to (only its owner
    could have made the link), a symlinked journal or lock file is refused."""
    uid = os.geteuid()
    root = Path(ckpt_dir)
    for d in (root, *(root / name for name in STEERING_DIRS)):
        try:
            st = os.stat(d)
        except FileNotFoundError:
            if d == root:
                return  # a new run dir: nothing in it yet
            continue
        if why := dir_problem(d, st, uid):
            raise UnsafeRunDir(d, why)
    for name in OPENED_FILES:
        try:
            st = os.lstat(root / name)
        except FileNotFoundError:
            continue
        if why := file_problem(st, uid):
            raise UnsafeRunDir(root / name, why)


def not_a_directory(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` can never be a directory: one line naming the part of it that is a
    file (``afile/run``: ``afile``), or None when it is or could be one. Nothing is created."""
    p = Path(path)
    for part in (p, *p.parents):
        if part.exists():  # False below a regular file too (ENOTDIR): go up
            return None if part.is_dir() else f"{path}: {part} is not a directory"
    return None


def make_dir(path: str | os.PathLike[str]) -> None:
    """Create a run directory (and its parents) that only its owner can write, whatever
    the umask (a umask of 002 would make it group-writable, and refused)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.mkdir(mode=DIR_MODE, exist_ok=True)


def open_no_follow(
    path: str | os.PathLike[str], flags: int, mode: int, *, devices: bool = False
) -> int:
    """``os.open`` that never follows a symlink and never blocks on a FIFO; the file must be
    a regular file (or a character device, with ``devices``) of this user or root. Raises
    :class:`UnsafeRunDir` otherwise, OSError for the usual reasons."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeRunDir(path, "a symbolic link: refusing to follow it (remove it)") from None
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads (O_NONBLOCK kept us from hanging)
            raise UnsafeRunDir(path, "not a regular file (remove it)") from None
        raise
    try:
        why = file_problem(os.fstat(fd), os.geteuid(), devices=devices)
        if why:
            raise UnsafeRunDir(path, why)
        os.set_blocking(fd, True)  # O_NONBLOCK was only for the open
    except BaseException:
        os.close(fd)
        raise
    return fd
