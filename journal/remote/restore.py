"""A mirrored run brought back into an empty run dir: its journal (the segments, joined) and
its newest checkpoint that carries the ``.upload_complete`` marker. A checkpoint without the
marker is never fetched; the marker's file list is checked against what arrived."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from journal.remote.errors import classify
from journal.remote.layout import (
    CHECKPOINTS_PREFIX,
    JOURNAL_PREFIX,
    MARKER_NAME,
    MAX_MARKER_BYTES,
    MAX_SEGMENT_BYTES,
    checkpoint_prefix,
    marked_checkpoints,
    marker_key,
    segments,
)
from journal.remote.store import Store, StoreURIError
from journal.rundir.files import atomic_write
from journal.rundir.paths import checkpoint_step, journal_path


class RestoreError(Exception):
    """Nothing (or nothing usable) to restore from a store (one line)."""


@dataclass(frozen=True)
class Restored:
    """What a restore brought back."""

    checkpoint: str | None  # checkpoints/step-000030, or None (no marked checkpoint)
    step: int | None
    journal_bytes: int
    seconds: float


def newest_marked(store: Store) -> str | None:
    """The marked checkpoint of the highest step, or None."""
    marked = [
        (step, name)
        for name in marked_checkpoints(store.listing(CHECKPOINTS_PREFIX))
        if (step := checkpoint_step(name.rsplit("/", 1)[-1])) is not None
    ]
    return max(marked)[1] if marked else None


def fetch_journal(store: Store) -> bytes:
    """The mirrored journal: its segments joined in order (b"" when there are none)."""
    found = segments(store.listing(JOURNAL_PREFIX))
    return b"".join(store.get_bytes(s.key, MAX_SEGMENT_BYTES) for s in found)


def fetch_checkpoint(store: Store, name: str, dest: Path) -> None:
    """Download marked checkpoint ``name`` to ``dest`` (through a ``.tmp-`` dir renamed at
    the end); raises RestoreError when a file is missing or of another size than its
    marker says. Whatever fails (a full disk, the store), the ``.tmp-`` dir goes: a partial
    copy never stays behind to fill the disk."""
    prefix = checkpoint_prefix(name)
    files = json.loads(store.get_bytes(marker_key(name), MAX_MARKER_BYTES)).get("files") or {}
    tmp = dest.with_name(f".tmp-{dest.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        pairs = []
        for rel in files:
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            pairs.append((prefix + rel, str(target)))
        store.get_files(pairs)
        for rel, size in files.items():
            if not (tmp / rel).is_file() or (tmp / rel).stat().st_size != size:
                raise RestoreError(f"{store.url(prefix + rel)}: not the size its marker says")
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def restore_run(uri: str, ckpt_dir: Path) -> Restored:
    """Fetch ``uri``'s journal and newest marked checkpoint into ``ckpt_dir`` (which holds
    no journal). Raises RestoreError (one line) and StoreURIError."""
    t0 = time.monotonic()
    store = Store(uri)
    try:
        store.check()  # no such bucket is said as such, not as "holds no mirrored journal"
        data = fetch_journal(store)
        if not data:
            raise RestoreError(f"{uri} holds no mirrored journal ({JOURNAL_PREFIX}*.jsonl)")
        name = newest_marked(store)
        if name is not None:
            dest = ckpt_dir / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            fetch_checkpoint(store, name, dest)
    except (RestoreError, StoreURIError):
        raise
    except Exception as exc:  # the store's client: unreachable, denied, ...; a full disk
        raise RestoreError(f"cannot restore from {uri}: {classify(exc).cause}") from None
    # last: a journal means a restored run
    atomic_write(journal_path(ckpt_dir), data, root=ckpt_dir)
    step = checkpoint_step(name.rsplit("/", 1)[-1]) if name else None
    return Restored(name, step, len(data), time.monotonic() - t0)


__all__ = ["MARKER_NAME", "RestoreError", "Restored", "restore_run"]
