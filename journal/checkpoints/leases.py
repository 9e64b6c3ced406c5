"""Checkpoint leases: a checkpoint someone is still using is not rotated away.

A lease is one small JSON file ``<ckpt_dir>/leases/<checkpoint>--<id>.json`` holding the
checkpoint's name, who holds it and when it expires. A checkpoint directory is named by
itself (``step-000040``, HF's ``checkpoint-40``); a single-file checkpoint (Lightning's
``.ckpt``, anywhere in the run dir) by its path relative to the run dir, percent-encoded in
the lease file's name (see :func:`lease_key`), so two files of the same name in two
directories are two checkpoints. Files are created and renewed atomically (temp + rename),
so they work over a shared file system and from any host.
A lease that is not renewed expires: a holder killed with ``kill -9`` never pins a
checkpoint forever. The trainer's rotation lists the directory once per save and reads only
the leases of the checkpoints it is about to delete, so its cost does not grow with the
number of leases on other checkpoints.

Expiry compares the holder's clock (``expires`` is absolute Unix time) with the trainer's;
hosts sharing a checkpoint dir are expected to run NTP.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import orjson

from journal.rundir.files import atomic_write, json_files
from journal.rundir.inbox import RejectedFile, checked_time, move_aside, read_json_object, refusal
from journal.rundir.paths import checkpoint_root, checkpoint_step, is_checkpoint_file, leases_dir

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 60.0
#: The longest lease: one that is never released still ends (30 days).
MAX_TTL_S = 30 * 86400.0
_CLOCK_SLACK_S = 86400.0  # hosts' clocks differ a little: a day more is still a lease
#: Told about each refused lease file, with the payload of the ``control`` record that
#: journals it (see :func:`journal.rundir.inbox.refusal`).
OnReject = Callable[[dict[str, Any]], Any]
_SEP = "--"
_SUFFIX = ".json"
#: Characters a lease file name keeps as they are; every other one is percent-encoded (``/``
#: too), so the encoding is one to one. ``%`` itself is encoded, hence never doubled.
_KEEP = "=-_.,+@"
_MAX_KEY = 200  # leaves room for --<id>.json within a file name's 255 bytes
_LONG = "%%"  # marks a long name's key (its hash); quote() never writes two % in a row


class LeaseError(ValueError):
    """A lease request that cannot be honoured (unknown id, no such checkpoint)."""


@dataclass(frozen=True)
class Lease:
    """One lease on a checkpoint: who holds it and until when (a file in ``leases/``)."""

    id: str
    checkpoint: str  # step-000040, or a .ckpt file's path relative to the run dir
    holder: str
    expires: float
    ttl: float

    def to_json(self) -> bytes:
        return orjson.dumps(self.__dict__, option=orjson.OPT_APPEND_NEWLINE)


def checkpoint_name(ckpt_dir: str | os.PathLike[str], checkpoint: str | os.PathLike[str]) -> str:
    """The name of a checkpoint of this run, given as a path or a name: a checkpoint
    directory's own name (``step-000040``), or a ``.ckpt`` file's path relative to the run
    dir (``lightning_logs/version_0/checkpoints/epoch=0-step=4.ckpt``). Raises LeaseError
    for anything else, and for a checkpoint outside ``ckpt_dir``."""
    p = Path(checkpoint)
    if checkpoint_step(p.name) is not None:
        return _dir_name(ckpt_dir, checkpoint)
    if is_checkpoint_file(p.name):
        return _file_name(ckpt_dir, p)
    raise LeaseError(
        f"{checkpoint}: not a checkpoint directory (expected step-NNNNNN or checkpoint-N) "
        "nor a .ckpt file"
    )


def _dir_name(ckpt_dir: str | os.PathLike[str], checkpoint: str | os.PathLike[str]) -> str:
    """A checkpoint directory's name, given bare or as a path into its root."""
    p = Path(checkpoint)
    root = checkpoint_root(ckpt_dir, p.name)
    if p.parent.resolve() != root.resolve() and str(p.parent) not in ("", "."):
        raise LeaseError(f"{checkpoint}: not a checkpoint of {ckpt_dir} (expected {root}/{p.name})")
    return p.name


def _file_name(ckpt_dir: str | os.PathLike[str], p: Path) -> str:
    """A ``.ckpt`` file's path relative to the run dir, symlinks resolved (one file, one
    name). A relative path is taken from the run dir (as lease files name it), or from the
    current directory when only that one exists."""
    run = Path(ckpt_dir).resolve()
    if not p.is_absolute() and not (run / p).exists() and p.exists():
        p = p.resolve()
    rel = os.path.relpath((run / p).resolve(), run)  # an absolute p replaces run
    if rel in (os.curdir, os.pardir) or rel.startswith(os.pardir + os.sep):
        raise LeaseError(f"{p}: not a checkpoint of {ckpt_dir} (a .ckpt file must lie inside it)")
    return Path(rel).as_posix()


def lease_key(checkpoint: str) -> str:
    """How a checkpoint's name appears in its lease files' names: a directory's name as it
    is, a file's relative path percent-encoded (one to one, no ``/``); a name too long for
    a file name becomes its start and a hash of the whole."""
    key = quote(checkpoint, safe=_KEEP)
    if len(key) <= _MAX_KEY:
        return key
    digest = hashlib.sha256(checkpoint.encode()).hexdigest()[:32]
    return f"{key[: _MAX_KEY - len(_LONG) - len(digest)]}{_LONG}{digest}"


def checkpoint_path(ckpt_dir: str | os.PathLike[str], name: str) -> Path:
    """Where the checkpoint of this name (see :func:`checkpoint_name`) is."""
    if checkpoint_step(name) is not None:
        return checkpoint_root(ckpt_dir, name) / name
    return Path(ckpt_dir) / name


def check_ttl(ttl: float) -> float:
    """``ttl`` if a lease of that many seconds ends (finite, more than 0, at most
    :data:`MAX_TTL_S`); raises LeaseError otherwise."""
    if not (isinstance(ttl, (int, float)) and math.isfinite(ttl) and 0 < ttl <= MAX_TTL_S):
        raise LeaseError(
            f"ttl {ttl!r}: a lease lasts more than 0 and at most {MAX_TTL_S:.0f} seconds "
            "(30 days), so that one never released still ends"
        )
    return float(ttl)


def _path(ckpt_dir: str | os.PathLike[str], checkpoint: str, lease_id: str) -> Path:
    return leases_dir(ckpt_dir) / f"{lease_key(checkpoint)}{_SEP}{lease_id}{_SUFFIX}"


def acquire(
    ckpt_dir: str | os.PathLike[str],
    checkpoint: str | os.PathLike[str],
    *,
    ttl: float = DEFAULT_TTL_S,
    holder: str | None = None,
    must_exist: bool = True,
) -> Lease:
    """Lease a checkpoint for ``ttl`` seconds (renew to keep it); returns the lease. Raises
    LeaseError for a checkpoint not of this run, or a ttl :func:`check_ttl` refuses."""
    ttl = check_ttl(ttl)
    name = checkpoint_name(ckpt_dir, checkpoint)
    where = checkpoint_path(ckpt_dir, name)
    is_dir = checkpoint_step(name) is not None
    if must_exist and not (where.is_dir() if is_dir else where.is_file()):
        raise LeaseError(f"{checkpoint}: no such checkpoint in {where.parent}")
    lease = Lease(
        id=uuid.uuid4().hex[:16],
        checkpoint=name,
        holder=holder or f"{os.uname().nodename}:{os.getpid()}",
        expires=time.time() + ttl,
        ttl=ttl,
    )
    atomic_write(_path(ckpt_dir, name, lease.id), lease.to_json(), root=ckpt_dir)
    return lease


def renew(ckpt_dir: str | os.PathLike[str], lease: Lease) -> Lease:
    """Push the expiry ``lease.ttl`` seconds from now; raises LeaseError if it is gone.

    The check and the rewrite are two steps: a holder that may release the same lease from
    another thread must not run both at once (the watcher's LeaseKeeper holds its lock
    across a renewal, so a renewal never brings back a lease released meanwhile)."""
    path = _path(ckpt_dir, lease.checkpoint, lease.id)
    if not path.exists():
        raise LeaseError(f"lease {lease.id} is gone (expired and cleaned, or released)")
    new = Lease(lease.id, lease.checkpoint, lease.holder, time.time() + lease.ttl, lease.ttl)
    atomic_write(path, new.to_json(), root=ckpt_dir)
    return new


def release(ckpt_dir: str | os.PathLike[str], lease_id: str) -> str:
    """End a lease by id; returns the checkpoint it held (its name, as in the lease file's
    name; for a hashed long name, the start of it). Raises LeaseError if unknown."""
    for path in json_files(leases_dir(ckpt_dir)):
        key, _, rest = path.name.rpartition(_SEP)
        if rest == f"{lease_id}{_SUFFIX}":
            path.unlink(missing_ok=True)
            return unquote(key)
    raise LeaseError(f"no lease {lease_id!r} in {leases_dir(ckpt_dir)}")


def drop(ckpt_dir: str | os.PathLike[str], lease: Lease) -> None:
    """End a lease its holder still has in hand (no directory scan)."""
    _path(ckpt_dir, lease.checkpoint, lease.id).unlink(missing_ok=True)


def take_over(ckpt_dir: str | os.PathLike[str], holder: str, *, by: str, ttl: float) -> list[Lease]:
    """The unexpired leases of ``holder``, a holder that is known to be dead (a watcher
    whose successor took its cursor), made ``by``'s: the same ids and checkpoints, renewed
    for ``ttl`` seconds. Its expired leases are removed. Files that are not leases are left
    alone (rotation moves them aside)."""
    ttl = check_ttl(ttl)
    now = time.time()
    out = []
    for path, expires, obj in _leases(json_files(leases_dir(ckpt_dir))):
        if obj.get("holder") != holder:
            continue
        lease_id, checkpoint = obj.get("id"), obj.get("checkpoint")
        if not isinstance(lease_id, str) or not isinstance(checkpoint, str):
            continue
        if path != _path(ckpt_dir, checkpoint, lease_id):
            continue  # not a file its holder wrote: left to expire
        if expires <= now:
            path.unlink(missing_ok=True)  # it holds nothing; only its file was left
            continue
        lease = Lease(lease_id, checkpoint, by, time.time() + ttl, ttl)
        atomic_write(path, lease.to_json(), root=ckpt_dir)
        out.append(lease)
    return out


def _leases(paths: Iterable[Path]) -> Iterator[tuple[Path, float, dict[str, Any]]]:
    """Each lease file of ``paths`` with when it ends and what it holds; files that are not
    leases (and ones released meanwhile) are skipped, left where they are."""
    for path in paths:
        try:
            expires, obj = _lease(path)
        except (FileNotFoundError, RejectedFile):
            continue
        yield path, expires, obj


def _lease(path: Path) -> tuple[float, dict[str, Any]]:
    """When the lease in ``path`` ends, and the lease. Raises RejectedFile for a file that
    is not a lease (not a regular file, over 64 KiB, malformed, no finite ``expires``) and
    FileNotFoundError for one released meanwhile. Lease files are written by rename, so a
    complete name always holds a complete lease."""
    obj = read_json_object(path)
    return checked_time(obj, "expires", RejectedFile), obj


def _files_of(ckpt_dir: str | os.PathLike[str], names: set[str]) -> Iterator[tuple[str, Path]]:
    """The lease files of the checkpoints ``names``, each with its checkpoint's name, told
    from the file names of one directory listing (plain strings): no file is read."""
    d = leases_dir(ckpt_dir)
    try:
        entries = os.listdir(d)
    except FileNotFoundError:
        return
    by_key = {lease_key(name): name for name in names}
    for entry in entries:
        name = by_key.get(entry.rpartition(_SEP)[0])
        if name is not None and entry.endswith(_SUFFIX):
            yield name, d / entry


def leased(
    ckpt_dir: str | os.PathLike[str],
    names: set[str],
    now: float | None = None,
    *,
    on_reject: OnReject | None = None,
) -> set[str]:
    """Which of the checkpoints ``names`` (see :func:`checkpoint_name`) hold an unexpired
    lease. One directory listing (plain strings: rotation calls this on every save); only
    the leases of those checkpoints are read. Expired leases found on the way are removed.
    A file that is not a lease (a FIFO, a symlink, over 64 KiB, no finite ``expires``) holds
    nothing: it is moved to ``leases/rejected/`` and ``on_reject`` gets the record that
    journals it."""
    now = time.time() if now is None else now
    out: set[str] = set()
    for name, path in _files_of(ckpt_dir, names):
        if name in out:
            continue
        try:
            expires, _ = _lease(path)
            if expires > now + MAX_TTL_S + _CLOCK_SLACK_S:  # no lease is taken for that long
                raise RejectedFile(f"expires {expires:.0f}, beyond the 30-day limit")
        except FileNotFoundError:
            continue  # released meanwhile
        except RejectedFile as exc:
            log.warning("refusing lease file %s: %s", path, exc)
            record = refusal(path, str(exc), move_aside(path))
            if on_reject is not None:
                on_reject(record)
            continue
        if expires > now:
            out.add(name)
        else:
            path.unlink(missing_ok=True)
    return out


def expiries(ckpt_dir: str | os.PathLike[str], names: set[str]) -> dict[str, list[float]]:
    """When each lease of the checkpoints ``names`` ends (expired ones included), read only:
    nothing is removed or moved, for ``status``. Files that are not leases are skipped."""
    of = {path: name for name, path in _files_of(ckpt_dir, names)}
    out: dict[str, list[float]] = {}
    for path, expires, _ in _leases(of):
        out.setdefault(of[path], []).append(expires)
    return out


def active(ckpt_dir: str | os.PathLike[str], now: float | None = None) -> list[Lease]:
    """Every unexpired lease (for ``status`` and people); files that are not leases are
    skipped (and left alone: rotation moves them aside)."""
    now = time.time() if now is None else now
    out = []
    for _, expires, obj in _leases(json_files(leases_dir(ckpt_dir))):
        if expires > now:
            ttl = obj.get("ttl")
            out.append(
                Lease(
                    str(obj.get("id")),
                    str(obj.get("checkpoint")),
                    str(obj.get("holder")),
                    expires,
                    float(ttl) if isinstance(ttl, (int, float)) else 0.0,
                )
            )
    return sorted(out, key=lambda lease: lease.checkpoint)
