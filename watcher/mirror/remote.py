"""``ilab-watch URI ...``: a mirrored run watched from another machine. A thread keeps a
local replica of the run (:class:`journal.remote.replica.Replica`) in step with the store;
the watcher follows the replica's journal as it would a local run's."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any

import click

from journal.remote.replica import Replica, ReplicaBusy
from journal.remote.store import StoreURIError, is_uri

log = logging.getLogger("watcher.mirror")


class RunDirOrURI(click.ParamType):
    """A run dir (a Path) or a store URI (kept a str: a Path would fold its ``//``)."""

    name = "DIR|URI"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, Path) or not is_uri(str(value)):
            return Path(value)
        return str(value)


def default_replica_dir(uri: str) -> Path:
    """Where a store's run is kept locally when no ``--download DIR`` says."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ilab-journal" / "remote" / hashlib.sha1(uri.encode()).hexdigest()[:16]


class RemoteFollow:
    """The replica of ``uri`` and the thread that syncs it every ``poll`` seconds."""

    def __init__(self, uri: str, download: Path | None, poll: float) -> None:
        where = download or default_replica_dir(uri)
        try:
            self.replica = Replica(uri, where, download=download is not None)
        except (StoreURIError, ReplicaBusy) as exc:
            raise click.UsageError(str(exc)) from None
        self.poll = poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ilab-replica", daemon=True)
        self._failing = False

    @property
    def dir(self) -> Path:
        return self.replica.dir

    def start(self) -> None:
        self._sync()  # what the store holds now, before the watcher's first look
        self._thread.start()

    def _sync(self) -> None:
        try:
            self.replica.sync()
        except Exception as exc:  # the store's client: unreachable, denied, ...
            if not self._failing:
                log.warning("the store does not answer (%s); retrying", str(exc)[:200])
            self._failing = True
            return
        if self._failing:
            log.warning("the store answers again")
        self._failing = False

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            self._sync()

    def finish(self) -> None:
        """Stop syncing; send out the last reports and commands."""
        self._stop.set()
        self._thread.join(timeout=30)
        self._sync()
        self.replica.close()


def follow_remote(
    dir: Path | str, download: Path | None, poll: float | None
) -> RemoteFollow | None:
    """For a URI: the started replica it is followed through (None for a run dir)."""
    if isinstance(dir, Path):
        if download is not None:
            raise click.UsageError("--download is for a store URI (ilab-watch s3://... )")
        return None
    follow = RemoteFollow(dir, download, poll or 1.0)
    follow.start()
    return follow
