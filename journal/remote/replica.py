"""A mirrored run followed from its store into a local replica dir, for readers and watchers
on machines without the run's filesystem (``ilab-watch URI``, ``ilab-journal status URI``).

The replica is a run dir like any other: its ``journal.jsonl`` holds the store's records in
order, so the watcher's cursors, at-least-once delivery and exit codes work on it unchanged.
A ``save`` record is copied there only once its checkpoint's ``.upload_complete`` marker is
in the store (or the store's journal says it was removed), with ``checkpoint_path`` set to
``<replica>/checkpoints/<name>`` and ``checkpoint_uri`` to the checkpoint's URI: with
``download`` the checkpoint's files are fetched there first (under a remote lease, so the
mirror keeps it meanwhile); without, that directory holds only a ``URI`` file naming it.
When the store's journal says a checkpoint was removed (the run rotated it), its local copy
goes too, once no lease in the replica holds it (a watcher's delivery on it is running), as
the trainer's rotation treats the run dir.

The replica holds its journal lock, as a trainer would: reports and control commands that
its watchers write into ``reports/`` and ``control/`` are sent to the store's prefixes of
those names (where the mirroring watcher brings them to the trainer), not journaled here.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from journal.checkpoints.leases import LeaseError, checkpoint_name
from journal.checkpoints.rotation import remove_unless_leased
from journal.remote.layout import (
    CONTROL_PREFIX,
    JOURNAL_PREFIX,
    LEASES_PREFIX,
    MAX_SEGMENT_BYTES,
    REPORTS_PREFIX,
    marker_key,
    segments,
)
from journal.remote.restore import fetch_checkpoint
from journal.remote.store import Store
from journal.rundir.files import atomic_write, json_files
from journal.rundir.lock import JournalLock
from journal.rundir.paths import checkpoint_root, control_dir, journal_path, reports_dir, watch_dir
from journal.rundir.safety import make_dir
from journal.store import append_copied, iter_events

log = logging.getLogger("journal.remote")
STATE_NAME = "replica.json"


class ReplicaBusy(RuntimeError):
    """Another process follows the store into this replica dir."""


class Replica:
    """Copy ``uri``'s journal into ``replica_dir`` (see the module docstring); call
    :meth:`sync` repeatedly (each call does what the store allows now)."""

    def __init__(
        self, uri: str, replica_dir: Path, *, download: bool = False, for_watchers: bool = True
    ) -> None:
        self.store = Store(uri)
        self.dir = Path(replica_dir)
        self.download = download
        #: False (readers): every line copied as it is, saves not held for their marker,
        #: no journal lock taken
        self.for_watchers = for_watchers
        self.journal = journal_path(self.dir)
        make_dir(self.dir)
        self._lock = JournalLock(self.dir, role="replica")
        if for_watchers and not self._lock.try_acquire():
            raise ReplicaBusy(f"{self.dir} is already followed from a store by another process")
        self._state_path = watch_dir(self.dir) / STATE_NAME
        self._offset, size = self._load_state()
        append_copied(self.dir, b"", cut_at=size)  # what a killed sync appended after its state
        self._pending = b""  # store bytes fetched, not yet copied (whole lines)
        self._waiting: str | None = None  # a save whose marker is awaited (said once)
        self.ended = False
        #: local checkpoints the run removed, deleted here once no lease holds them
        self._removed: set[Path] = set()
        if for_watchers:  # after a restart: what the replica's journal says was removed
            for rec in iter_events(self.journal, {"save", "checkpoint_removed"}):
                self._note_removal(rec)

    def close(self) -> None:
        if self.for_watchers:
            self._lock.release()

    def _load_state(self) -> tuple[int, int]:
        try:
            state = json.loads(self._state_path.read_bytes())
            return int(state["store_offset"]), int(state["replica_size"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0, 0

    def sync(self) -> bool:
        """Fetch new segments, copy what can be copied, send reports and commands out;
        whether anything was copied. Raises OSError and the store client's errors."""
        for seg in segments(self.store.listing(JOURNAL_PREFIX)):
            if seg.end > self._offset + len(self._pending):
                data = self.store.get_bytes(seg.key, MAX_SEGMENT_BYTES)
                self._pending += data[self._offset + len(self._pending) - seg.start :]
        copied = self._copy()
        if self.for_watchers:
            self._send_out()
            self._prune()
        return copied

    def _copy(self) -> bool:
        lines = self._pending.splitlines(keepends=True)
        out: list[bytes] = []
        used = 0
        try:
            for i, line in enumerate(lines):
                rec = _record(line)
                if rec is not None and rec.get("event") == "save" and self.for_watchers:
                    rewritten = self._save(rec, lines[i + 1 :])
                    if rewritten is None:
                        break  # its checkpoint is not in the store yet
                    line = rewritten
                elif rec is not None and rec.get("event") in ("train_end", "train_begin"):
                    self.ended = rec["event"] == "train_end"
                if rec is not None and self.for_watchers:
                    self._note_removal(rec)
                out.append(line)
                used += len(lines[i])
        finally:  # a download that fails (a full disk) keeps what came before it: its
            self._append(out, used)  # checkpoints were fetched whole, and are delivered
        return bool(out)

    def _append(self, out: list[bytes], used: int) -> None:
        """Append the copied lines (``used`` bytes of the store's journal) and note how far
        the copy is."""
        if not out:
            return
        size = append_copied(self.dir, b"".join(out))
        self._pending = self._pending[used:]
        self._offset += used
        state = orjson.dumps({"store_offset": self._offset, "replica_size": size})
        atomic_write(self._state_path, state, root=self.dir)

    def _save(self, rec: dict[str, Any], later: list[bytes]) -> bytes | None:
        """A save record as copied into the replica, or None while its marker is awaited."""
        data = rec.get("data") or {}
        local = self._local(rec)
        if local is None:
            return orjson.dumps(rec) + b"\n"
        name = local.name
        key = local.relative_to(self.dir).as_posix()
        removed = any(
            (r := _record(line)) is not None
            and r.get("event") == "checkpoint_removed"
            and Path(str((r.get("data") or {}).get("checkpoint_path"))).name == name
            for line in later
        )
        if not removed and not self.store.exists(marker_key(key)):
            if self._waiting != key:
                self._waiting = key
                log.info("waiting for %s's marker in %s", key, self.store.uri)
            return None
        if not removed and not local.exists():
            if self.download:
                self._fetch(key, local)
            else:
                uri = f"{self.store.url(key)}\n".encode()  # checkpoints/ may be a link
                atomic_write(local / "URI", uri, root=local.parent)
        data = {**data, "checkpoint_path": str(local), "checkpoint_uri": self.store.url(key)}
        if "hf_path" in data:  # the export inside it: at the local copy too
            data["hf_path"] = _moved_inside(data["hf_path"], rec["data"]["checkpoint_path"], local)
        return orjson.dumps({**rec, "data": data}) + b"\n"

    def _local(self, rec: Mapping[str, Any]) -> Path | None:
        """Where a save's or a removal's checkpoint is kept in the replica."""
        path = (rec.get("data") or {}).get("checkpoint_path")
        if not isinstance(path, str):
            return None
        name = Path(path).name
        return checkpoint_root(self.dir, name) / name

    def _note_removal(self, rec: Mapping[str, Any]) -> None:
        event = rec.get("event")
        if event in ("save", "checkpoint_removed") and (local := self._local(rec)) is not None:
            if event == "checkpoint_removed":
                self._removed.add(local)
            else:  # a later save of that step brings it back
                self._removed.discard(local)

    def _prune(self) -> None:
        """Delete the local copies of removed checkpoints that no lease holds now."""
        for local in sorted(self._removed):
            if not local.exists():
                self._removed.discard(local)
                continue
            try:
                name = checkpoint_name(self.dir, local)
            except LeaseError:
                self._removed.discard(local)  # not a checkpoint this replica knows how to hold
                continue
            reason = "removed from the mirrored run"
            if remove_unless_leased(self.dir, local, name, emit=_journaled_already, reason=reason):
                self._removed.discard(local)
                log.info("removed %s: the run removed that checkpoint", local)

    def _fetch(self, key: str, local: Path) -> None:
        """Download under a remote lease (the mirror keeps the checkpoint meanwhile)."""
        lease = f"{LEASES_PREFIX}{key}/{uuid.uuid4().hex[:12]}.json"
        self.store.put_bytes(lease, orjson.dumps({"expires": time.time() + 3600}))
        try:
            make_dir(local.parent)  # checkpoints/ (it may be a link, to a bigger disk)
            fetch_checkpoint(self.store, key, local)
        finally:
            self.store.delete([lease])

    def _send_out(self) -> None:
        """Reports and commands written here go to the store's reports/ and control/."""
        for inbox, prefix in (
            (reports_dir(self.dir), REPORTS_PREFIX),
            (control_dir(self.dir), CONTROL_PREFIX),
        ):
            for path in json_files(inbox):
                try:
                    obj = json.loads(path.read_bytes())
                except (OSError, ValueError):
                    continue
                if isinstance(obj, dict) and isinstance(obj.get("checkpoint_path"), str):
                    obj["checkpoint_path"] = Path(obj["checkpoint_path"]).name  # a bare name
                self.store.put_bytes(prefix + path.name, orjson.dumps(obj))
                os.unlink(path)


def _journaled_already(event: str, data: dict[str, Any]) -> None:
    """The replica's journal has the run's own ``checkpoint_removed``: nothing to add."""


def _record(line: bytes) -> dict[str, Any] | None:
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return rec if isinstance(rec, dict) else None


def _moved_inside(inner: Any, old: Any, new: Path) -> Any:
    """A path inside a checkpoint (the save's ``hf_path``: its HF export) at the replica's
    copy of that checkpoint; anything else as it was (None stays None)."""
    if not isinstance(inner, str) or not isinstance(old, str):
        return inner
    try:
        return str(new / PurePosixPath(inner).relative_to(PurePosixPath(old)))
    except ValueError:  # not inside it: left for its reader to judge
        return inner
