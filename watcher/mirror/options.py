"""``ilab-watch``'s mirror options (``--mirror URI``) and running the mirror beside, or
instead of, the watcher's hooks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from journal.cli.common import Seconds
from journal.remote.store import StoreURIError
from journal.rundir.paths import watch_dir
from watcher.engine.cursor import CursorBusy, CursorLock
from watcher.engine.signals import StopOnSignal
from watcher.engine.statedir import StateFiles
from watcher.mirror.checkpoints import lease_role
from watcher.mirror.mirror import Mirror

#: How much lower than training a mirroring watcher alone runs (``nice``).
MIRROR_NICE = 10

#: The mirror's options (``ilab-watch``'s, watcher.cli.options).
MIRROR_OPTIONS = [
    click.option(
        "--mirror",
        "mirror_uri",
        metavar="URI",
        help="Copy each complete checkpoint (marker last) and the journal (as segments) to URI "
        "(any fsspec URI; s3:// needs s3fs, the `s3` extra), leasing each checkpoint until it "
        "is there; rotated checkpoints are deleted there too. Credentials and endpoint from "
        "the environment (AWS_*) or config files, never the URI (docs/mirror.md).",
    ),
    click.option(
        "--linger",
        type=Seconds(0, 86400),
        default=0.0,
        show_default=True,
        metavar="SECONDS",
        help="With --mirror: once the run's train_end (and all after it) is in the store, go "
        "on bringing in the reports that watchers elsewhere send through the store (an eval "
        "of the last checkpoint ending after the run) until SECONDS pass with nothing new; "
        "each is journaled in the run and mirrored.",
    ),
    click.option(
        "--download",
        "download_dir",
        type=click.Path(file_okay=False, path_type=Path),
        metavar="DIR",
        help="With a store URI for DIR: keep the run in DIR and fetch each checkpoint there "
        "before its callbacks run (default: the checkpoint's URI in checkpoint_uri, no "
        "download).",
    ),
]


class MirrorRun:
    """A mirror the watcher's CLI runs: its lock (one mirroring watcher per run dir), its
    threads, its end."""

    def __init__(
        self, ckpt_dir: Path, uri: str, *, follow: bool, lease_ttl: float, linger: float = 0.0
    ) -> None:
        try:
            self.mirror = Mirror(ckpt_dir, uri, follow=follow, lease_ttl=lease_ttl, linger=linger)
        except StoreURIError as exc:
            raise click.UsageError(str(exc)) from None
        self._lock = CursorLock(
            StateFiles.of(watch_dir(ckpt_dir), "mirror", ckpt_dir), store=self.mirror.store.uri
        )
        self._checked = False

    def check(self) -> None:
        """Take the run dir's mirror lock (exit 3 when another watcher mirrors it) and check
        the store: one line, and exit 2 when it refuses (no such bucket, wrong keys,
        denied), exit 1 when the prefix is another run's."""
        if self._checked:
            return
        try:
            self._lock.claim()
        except CursorBusy as exc:
            click.echo(f"ilab-watch: mirror: {exc}", err=True)
            sys.exit(3)
        # the previous mirror died holding the lock: its leases are ours (kept for the saves
        # read again, the rest let go once the journal is read), not held until their ttl
        previous = self._lock.previous
        store = (previous or {}).get("store")  # the dead one's, maybe another store's
        self.mirror.leases.take_over_from(previous, role=lease_role(store) if store else None)
        refused = self.mirror.preflight()
        if refused is not None:
            self._lock.release()
            code, line = refused
            click.echo(f"ilab-watch: mirror: {line}", err=True)
            sys.exit(code)
        self._checked = True

    def start(self) -> None:
        """:meth:`check`, then start mirroring."""
        self.check()
        self.mirror.start()

    def finish(self, quiet: bool) -> int:
        """Wait for the mirror to be done; its exit code."""
        code = self.mirror.join()
        self._lock.release()
        if not quiet:
            m = self.mirror
            click.echo(
                f"ilab-watch: mirror: {len(m.uploaded)} checkpoint(s), journal {m.sent} bytes "
                f"in {m.store.uri}",
                err=True,
            )
        return code


def open_mirror(
    ckpt_dir: Path, uri: str | None, *, follow: bool, lease_ttl: float, linger: float = 0.0
) -> MirrorRun | None:
    """The mirror ``--mirror URI`` asks for (None without it); a refused URI, or
    ``--linger`` without a mirror, is a usage error (one line)."""
    if uri is None:
        if linger:
            raise click.UsageError("--linger is for a mirroring watcher: give --mirror URI")
        return None
    return MirrorRun(ckpt_dir, uri, follow=follow, lease_ttl=lease_ttl, linger=linger)


def run_alone(run: MirrorRun, quiet: bool) -> int:
    """``ilab-watch DIR --mirror URI`` with no hooks: the mirror until the run's end is in
    the store; 130 when interrupted."""
    with StopOnSignal(
        run.mirror.request_stop
    ) as signals:  # every SIGINT/SIGTERM: one graceful stop
        run.check()  # a store that refuses is its one line, not after a "mirroring" line
        if not quiet:
            click.echo(
                f"ilab-watch: mirroring {run.mirror.ckpt_dir} to {run.mirror.store.uri}", err=True
            )
        # Background work: on a node whose cores training keeps busy, uploads take what is
        # left (with hooks beside it, the process keeps its priority: evals are not slowed).
        os.nice(MIRROR_NICE)
        run.start()
        code = run.finish(quiet)
    return 130 if signals.received else code
