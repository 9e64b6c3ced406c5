"""``ilab-watch URI ...``: a mirrored run watched from another machine. A thread keeps a
local replica of the run (:class:`journal.remote.replica.Replica`) in step with the store;
the watcher follows the replica's journal as it would a local run's."""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

import click

from journal.remote.errors import Kind, Problem, classify
from journal.remote.replica import Replica, ReplicaBusy
from journal.remote.store import StoreURIError, is_uri

log = logging.getLogger("watcher.mirror")
#: The longest wait between two tries of a sync that fails (a full disk must not be filled
#: by a whole download every ``--poll`` seconds).
MAX_RETRY_S = 30.0


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
    """The replica of ``uri`` and the thread that syncs it every ``poll`` seconds (a sync
    that fails: tried again less and less often, up to MAX_RETRY_S apart). What goes wrong
    is said once, as what it is (:func:`journal.remote.errors.classify`): the store not
    answering, the store refusing, this machine's disk."""

    def __init__(self, uri: str, download: Path | None, poll: float) -> None:
        where = download or default_replica_dir(uri)
        try:
            self.replica = Replica(uri, where, download=download is not None)
        except (StoreURIError, ReplicaBusy) as exc:
            raise click.UsageError(str(exc)) from None
        self.poll = poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ilab-replica", daemon=True)
        self._said: Problem | None = None  # what was said of the failing syncs

    @property
    def dir(self) -> Path:
        return self.replica.dir

    def start(self) -> None:
        """Check the store (one that refuses, e.g. no such bucket or wrong keys: one line,
        exit 2), copy what it holds now (before the watcher's first look), then sync in the
        background."""
        try:
            self.replica.store.check()
        except Exception as exc:
            problem = classify(exc)
            if problem.permanent:  # the check reads the store only: the store's answer
                self.replica.close()
                click.echo(f"ilab-watch: {self.replica.store.uri}: {problem.cause}", err=True)
                sys.exit(2)
        self._sync()
        self._thread.start()

    def _sync(self) -> bool:
        try:
            self.replica.sync()
        except Exception as exc:  # the store's client (unreachable, denied), the disk
            self._say(classify(exc))
            return False
        if self._said is not None:
            log.warning(
                "the store answers again"
                if self._said.kind is Kind.TRANSIENT
                else f"{self.dir}: in step with the store again"
            )
        self._said = None
        return True

    def _say(self, problem: Problem) -> None:
        """One line per trouble (an outage is one, however its messages vary)."""
        said = self._said
        self._said = problem
        if (
            said is not None
            and said.kind is problem.kind
            and (problem.kind is Kind.TRANSIENT or said.cause == problem.cause)
        ):
            return
        if problem.kind is Kind.TRANSIENT:
            log.warning("the store does not answer (%s); retrying", problem.cause[:200])
        elif problem.local:
            log.warning(
                "cannot copy into %s: %s (on this machine, not the store); retrying",
                self.dir,
                problem.cause,
            )
        else:  # nothing on the training side waits for this watcher: it may come back
            log.warning(
                "%s refuses: %s; trying again at most %gs apart",
                self.replica.store.uri,
                problem.cause,
                MAX_RETRY_S,
            )

    def _run(self) -> None:
        delay = self.poll
        while not self._stop.wait(delay):
            delay = self.poll if self._sync() else min(MAX_RETRY_S, max(self.poll, delay * 2))

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
