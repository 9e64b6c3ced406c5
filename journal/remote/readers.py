"""The read commands (``status``, ``show``, ``tail -f``, ``query``, ``stats``) on a mirrored
run: DIR may be a store URI. The run's journal is copied from the store's segments into a
temporary run dir (each line as it is), then kept in step every second while the command
runs (``tail -f`` follows it so until ``train_end``); the command reads that dir as it would
a local run's, with the same output and exit codes. A store that cannot be read is one
line, exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

# The store's modules load only for a URI: ``ilab-journal status DIR`` (the common case,
# in scripts) pays for none of them.

SYNC_EVERY_S = 1.0


def open_for_reading(uri: str) -> Path:
    """A temporary run dir holding ``uri``'s journal now, kept in step in the background
    (removed when the process exits). Raises StoreURIError and the store client's errors."""
    import atexit
    import shutil
    import tempfile
    import threading

    from journal.remote.replica import Replica
    from journal.remote.store import StoreURIError

    where = Path(tempfile.mkdtemp(prefix="ilab-remote-"))
    atexit.register(shutil.rmtree, where, True)
    replica = Replica(uri, where / "run", for_watchers=False)
    replica.store.check()  # no such bucket is said as such, not as "holds no journal"
    replica.sync()
    if replica.journal.stat().st_size == 0:
        raise StoreURIError(f"{uri} holds no mirrored journal (journal/*.jsonl)")

    def keep_in_step() -> None:
        stop = threading.Event()
        while not stop.wait(SYNC_EVERY_S):
            try:
                replica.sync()
            except Exception:  # a store that stops answering: what was copied stays
                continue

    threading.Thread(target=keep_in_step, name="ilab-remote-sync", daemon=True).start()
    return replica.dir


class RunDirOrURI(click.ParamType):
    """A run dir (or journal path) as given, or a store URI replaced by its copy's dir."""

    name = "DIR|URI"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value)
        if "://" not in text:  # not a URI (journal.remote.store.is_uri says which are)
            return text
        from journal.remote.errors import classify
        from journal.remote.store import StoreURIError, is_uri

        if not is_uri(text):
            return text
        try:
            return str(open_for_reading(text))
        except StoreURIError as exc:
            self.fail(str(exc), param, ctx)
        except Exception as exc:  # the store's client: unreachable, denied, no such bucket
            self.fail(f"cannot read {text}: {classify(exc).cause}", param, ctx)


RUN_DIR_OR_URI = RunDirOrURI()
