"""A run dir nobody else can steer: who may own it, who may write it, what is never followed.

Files in a checkpoint dir steer the run: ``control/`` commands stop or abort it, ``reports/``
pick the best checkpoint, ``leases/`` decide what rotation deletes, ``checkpoints/`` are
loaded on resume, and the journal and lock files are opened for writing. Whoever can create
or replace entries there can steer (or, with a planted symlink, redirect) a run. So a run
dir and those subdirectories must belong to the user running it (or to root) and be
writable by nobody else; and nothing written inside it goes through a symlink: every file
is opened by :func:`open_no_follow` (``O_NOFOLLOW``, the directories below the run dir
checked by :func:`safe_dir`; ``journal.rundir.files.atomic_write`` writes through it too).
The run dir itself may be a link: the user named it.

Readers (``status``, ``show``, ``tail``) do not call this: reading a colleague's journal is
fine. Everything that writes into the dir or acts on what is in it does.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from pathlib import Path

from journal.rundir.paths import (
    ALERTS_DIR_NAME,
    CHECKPOINTS_DIR_NAME,
    CONTROL_DIR_NAME,
    JOURNAL_NAME,
    LEASES_DIR_NAME,
    LOCK_NAME,
    LOGS_DIR_NAME,
    REPORTS_DIR_NAME,
    RUN_LOCK_NAME,
    WATCH_DIR_NAME,
)

#: Subdirectories whose files steer the run (commands, results, leases, resumed state).
STEERING_DIRS: tuple[str, ...] = (
    CONTROL_DIR_NAME,
    REPORTS_DIR_NAME,
    LEASES_DIR_NAME,
    CHECKPOINTS_DIR_NAME,
)
#: Subdirectories written into, never a symlink: the steering ones but ``checkpoints/``
#: (the last; it may be a link, to a bigger disk), those of alerts, logs and watchers.
WRITTEN_DIRS = (*STEERING_DIRS[:-1], ALERTS_DIR_NAME, LOGS_DIR_NAME, WATCH_DIR_NAME)
#: Files opened for writing by the journal's writer and the locks: never a symlink.
OPENED_FILES: tuple[str, ...] = (JOURNAL_NAME, LOCK_NAME, RUN_LOCK_NAME)
#: Why a symlink where we write is refused.
LINK = "a symbolic link: refusing to follow it (remove it)"
#: :func:`open_no_follow`'s flags for a file appended to (a journal, a log), and for a new
#: file (never one that is there, link or not).
APPEND, CREATE = os.O_WRONLY | os.O_APPEND | os.O_CREAT, os.O_WRONLY | os.O_CREAT | os.O_EXCL
StrPath = str | os.PathLike[str]
#: File types (``stat.S_IF*``) a file written may be.
REGULAR, DEVICES, FIFO = (stat.S_IFREG,), (stat.S_IFREG, stat.S_IFCHR), (stat.S_IFIFO,)
_KIND = {stat.S_IFREG: "a regular file", stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a directory"}
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


def file_problem(st: os.stat_result, uid: int, *, kinds: tuple[int, ...] = REGULAR) -> str | None:
    """Why a file we are about to write (its ``lstat``/``fstat``) must not be used; None
    when it may. ``kinds``: the file types it may be (:data:`DEVICES`: ``/dev/null`` too;
    :data:`FIFO`: a pipe a process reads, never a regular file)."""
    if stat.S_ISLNK(st.st_mode):
        return LINK
    if stat.S_IFMT(st.st_mode) not in kinds:
        return f"not {_KIND[kinds[0]]} (remove it)"
    if not trusted_owner(st.st_uid, uid):
        return f"owned by {_user(st.st_uid)}, not by you ({_user(uid, with_uid=False)}): remove it"
    return None


def check_run_dir(ckpt_dir: str | os.PathLike[str]) -> None:
    """Raise :class:`UnsafeRunDir` unless ``ckpt_dir``, its steering subdirectories and its
    journal and lock files are safe for this user. Missing ones are fine (they will be
    created by us); a directory we write into (:data:`WRITTEN_DIRS`), journal or lock
    file that is a symlink (or another user's) is refused; the run dir and
    ``checkpoints/`` are judged by what they point to (only their owner made the link)."""
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
    for name in (*WRITTEN_DIRS, *OPENED_FILES):
        with contextlib.suppress(FileNotFoundError):
            kinds = (stat.S_IFDIR,) if name in WRITTEN_DIRS else REGULAR
            if why := file_problem(os.lstat(root / name), uid, kinds=kinds):
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


def safe_dir(root: StrPath, path: StrPath) -> Path:
    """``path``, a directory at or below ``root`` (a run dir or a state dir, as the user
    named it: ``root`` itself may be a link), made where missing (mode 0750; ``root`` too)
    and every directory below ``root`` checked to be a directory, not a symlink. Raises
    :class:`UnsafeRunDir` for a link."""
    d = Path(os.path.abspath(root))  # lexical: spelled relative or absolute, never resolved
    for part in Path(os.path.abspath(path)).relative_to(d).parts:
        d /= part
        if not os.path.lexists(d):
            make_dir(d)  # in its parent, checked (or ``root``)
        st = os.lstat(d)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise UnsafeRunDir(d, LINK if stat.S_ISLNK(st.st_mode) else "not a directory")
    return Path(path)


def open_no_follow(
    path: StrPath, flags: int, mode: int = 0o640, *, root: StrPath, kinds: tuple[int, ...] = REGULAR
) -> int:
    """``os.open`` of ``path`` below ``root`` (see :func:`safe_dir`: its directories made
    and checked) that never follows a symlink and never blocks on a
    FIFO; the file must be of ``kinds`` (see :func:`file_problem`; a FIFO nobody reads is
    ENXIO) and of this user or root. The one way to open a file for writing in a run dir.
    Raises :class:`UnsafeRunDir` otherwise, OSError for the usual reasons."""
    safe_dir(root, Path(path).parent)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeRunDir(path, LINK) from None
        if exc.errno == errno.ENXIO and kinds != FIFO:  # O_NONBLOCK kept us from hanging
            raise UnsafeRunDir(path, "not a regular file (remove it)") from None
        raise
    try:
        why = file_problem(os.fstat(fd), os.geteuid(), kinds=kinds)
        if why:
            raise UnsafeRunDir(path, why)
        os.set_blocking(fd, True)  # O_NONBLOCK was only for the open
    except BaseException:
        os.close(fd)
        raise
    return fd
