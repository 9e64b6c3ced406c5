"""Durable delivery cursor: what has completed, so a restart neither loses nor repeats work.

Stored as JSON, written atomically (temp file, fsync, rename, directory fsync). ``offset`` is
where re-reading must start: the start of the oldest read batch that still has deliveries in
flight. ``done`` lists, per hook, the seqs completed at or after that point.

One process per cursor: :class:`CursorLock` (``<state_dir>/<name>.lock``, the journal's
``flock`` of :mod:`journal.lock`) is held while a watcher runs, so a second watcher with the
same state dir and name is refused instead of running every delivery a second time.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from journal.rundir.files import atomic_write
from journal.rundir.lock import HEARTBEAT_S, FileLock, Locked, describe, holder
from journal.store import START, Cursor
from watcher.engine.statedir import StateFiles

log = logging.getLogger("watcher")

#: Seconds between fsynced cursor saves (each save is atomic, see CursorFile.save).
DURABLE_EVERY_S = 1.0


@dataclass
class CursorState:
    """A watcher's saved progress: ``at``, where every delivery before it is done (a line
    start); the journal's first-line ``fingerprint`` (a replaced journal starts over); the
    seqs done per hook past ``at`` (made again only if not done); the labels of the
    ``hooks`` that saved it (a hook new to a named cursor is said: it starts at ``at``)."""

    at: Cursor = START
    fingerprint: str | None = None
    hooks: tuple[str, ...] | None = None
    done: dict[str, set[int]] = field(default_factory=dict)

    def take_hooks(self, labels: tuple[str, ...]) -> list[str]:
        """Record ``labels`` as the hooks of this cursor: the ones it was saved without
        (none for a cursor that never said), which start where it is."""
        new = [] if self.hooks is None else sorted(set(labels) - set(self.hooks))
        self.hooks = labels
        return new

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "version": 1,
                "offset": self.at.offset,
                "line_no": self.at.line_no,
                "fingerprint": self.fingerprint,
                "done": {k: sorted(v) for k, v in self.done.items() if v},
                "hooks": None if self.hooks is None else sorted(self.hooks),
            },
            option=orjson.OPT_INDENT_2,
        )


class CursorFile:
    """Load/save a :class:`CursorState` in ``files.cursor``; ``files=None`` keeps it in
    memory only."""

    def __init__(self, files: StateFiles | None) -> None:
        self.path, self.files = (files.cursor if files else None), files
        self.warning: str | None = None
        self._synced = -DURABLE_EVERY_S  # when a save was last fsynced (monotonic)

    def load(self) -> CursorState | None:
        """The saved state, or None when there is none. An unreadable or empty cursor means
        "replay from the start" (with a warning), never "skip"."""
        if self.path is None or not self.path.exists():
            return None
        try:
            raw: Any = orjson.loads(self.path.read_bytes())
            return CursorState(
                at=Cursor(int(raw["offset"]), int(raw.get("line_no", 0))),
                fingerprint=raw.get("fingerprint"),
                done={k: set(map(int, v)) for k, v in (raw.get("done") or {}).items()},
                hooks=None if raw.get("hooks") is None else tuple(map(str, raw["hooks"])),
            )
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            self.warning = f"cursor {self.path} is unreadable ({exc}); replaying from the start"
            log.warning(self.warning)
            return CursorState()

    def save(self, state: CursorState | bytes, *, durable: bool | None = None) -> None:
        """Write ``state`` (or its :meth:`CursorState.to_json`) atomically.

        Always atomic (a ``kill -9`` leaves the old cursor or the new one); fsynced when
        ``durable``, by default at most once a second: a replay saves it many times a
        second, and after a power loss an older cursor only repeats deliveries."""
        if self.files is None:
            return
        now = time.monotonic()
        if durable is None:
            durable = now - self._synced >= DURABLE_EVERY_S
        data = state if isinstance(state, bytes) else state.to_json()
        atomic_write(self.files.cursor, data, root=self.files.root, durable=durable)
        if durable:
            self._synced = now


class CursorBusy(RuntimeError):
    """Another watcher process holds this cursor (the message names it)."""


class CursorLock(FileLock):
    """``<state_dir>/<name>.lock``: held by the one watcher process that uses this cursor
    (and its results file, delivery logs and running markers). A ``flock``, so a watcher
    killed with ``kill -9`` leaves it free; heartbeating, as the launcher's run lock, for
    state dirs on file systems whose ``flock`` does not reach other hosts."""

    def __init__(self, files: StateFiles, **info: Any) -> None:
        super().__init__(
            files.lock, root=files.root, role="watcher", heartbeat_s=HEARTBEAT_S, **info
        )
        self.name = files.name

    def claim(self) -> None:
        """Take the lock or raise :class:`CursorBusy` naming its holder (a moment's wait:
        the holder's description is written just after its ``flock`` is taken)."""
        try:
            self.acquire(timeout=0.5)
        except Locked:
            who = describe(holder(self.path) or {})
            raise CursorBusy(
                f"cursor '{self.name}' in {self.path.parent} is in use by {who}: it already "
                "runs these hooks; stop it, or give one of them another --name"
            ) from None
        if self.previous:
            log.warning(
                "the previous watcher of cursor '%s' (%s) ended without releasing it; taking over",
                self.name,
                describe(self.previous),
            )
