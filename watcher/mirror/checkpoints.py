"""One checkpoint to the store: its files (concurrently), a check that every file is there
at its size, then the ``.upload_complete`` marker, last. A restarted upload sends only the
files missing or of another size; a checkpoint whose marker is there is not sent again."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from journal.remote.layout import LEASES_PREFIX, MARKER_NAME, checkpoint_prefix, marker_key
from journal.remote.store import Store
from journal.rundir.inbox import MAX_FILE_BYTES


class IncompleteUpload(OSError):
    """Files missing or short in the store after their upload: no marker was written."""


@dataclass(frozen=True)
class Uploaded:
    """What one checkpoint's upload sent."""

    name: str
    files: int
    bytes: int
    seconds: float


def local_files(local: Path) -> dict[str, int]:
    """A checkpoint's files (relative POSIX path -> size); a single-file checkpoint is one."""
    if local.is_file():
        return {local.name: local.stat().st_size}
    out = {}
    for root, _dirs, names in os.walk(local):
        for n in names:
            p = Path(root) / n
            out[p.relative_to(local).as_posix()] = p.stat().st_size
    return dict(sorted(out.items()))


def upload_checkpoint(
    store: Store, local: Path, name: str, *, about: dict[str, Any] | None = None
) -> Uploaded | None:
    """Upload ``local`` as checkpoint ``name`` (``checkpoints/step-000010``), marker last.
    Returns None when its marker was already there. Raises OSError (the store, or the
    local files gone) and :class:`IncompleteUpload`; the marker is then not written."""
    prefix = checkpoint_prefix(name)
    remote = store.listing(prefix)
    if prefix + MARKER_NAME in remote:
        return None
    t0 = time.monotonic()
    files = local_files(local)
    base = local.parent if local.is_file() else local
    todo = [
        (str(base / rel), prefix + rel)
        for rel, size in files.items()
        if remote.get(prefix + rel) != size
    ]
    store.put_files(todo)
    remote = store.listing(prefix)
    short = [rel for rel, size in files.items() if remote.get(prefix + rel) != size]
    if short:
        raise IncompleteUpload(
            f"{len(short)} file(s) missing in the store after upload: {short[0]}"
        )
    total = sum(files.values())
    marker = {"files": files, "bytes": total, **(about or {})}
    store.put_bytes(marker_key(name), json.dumps(marker, sort_keys=True).encode())
    return Uploaded(name, len(files), total, time.monotonic() - t0)


def remote_leased(store: Store, name: str, now: float | None = None) -> bool:
    """Whether a remote watcher holds an unexpired lease on checkpoint ``name`` (a lease
    file over the inboxes' size cap is none, and is not read)."""
    now = time.time() if now is None else now
    for key, size in store.listing(f"{LEASES_PREFIX}{name}/").items():
        if size > MAX_FILE_BYTES:
            continue
        try:
            expires = json.loads(store.get_bytes(key, MAX_FILE_BYTES)).get("expires")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(expires, (int, float)) and expires > now:
            return True
    return False


def remove_checkpoint(store: Store, name: str) -> bool:
    """Delete checkpoint ``name`` from the store, its marker first (so a reader never sees a
    marked checkpoint losing files); False when a remote lease holds it."""
    if remote_leased(store, name):
        return False
    prefix = checkpoint_prefix(name)
    keys = list(store.listing(prefix))
    if prefix + MARKER_NAME in keys:
        store.delete([prefix + MARKER_NAME])
    store.delete([k for k in keys if k != prefix + MARKER_NAME])
    return True


def lease_role(uri: str) -> str:
    """The holder role of the leases of a mirror to ``uri`` (a successor takes over those
    of its dead predecessor by this name, options.MirrorRun)."""
    return f"mirror:{uri}"
