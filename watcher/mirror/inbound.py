"""Reports and control commands that remote watchers write into the store's ``reports/``
and ``control/`` prefixes, moved into the run dir's inboxes (where the trainer polls them)
and then deleted from the store. A file over the local inboxes' cap
(:data:`journal.rundir.inbox.MAX_FILE_BYTES`) is never read: it is moved aside in the store, to
``reports/rejected/`` or ``control/rejected/``, with one line."""

from __future__ import annotations

import logging
import posixpath
from pathlib import Path

from journal.channels.reports import drain
from journal.remote.layout import CONTROL_PREFIX, REPORTS_PREFIX
from journal.remote.store import Store, TooLarge
from journal.rundir.files import atomic_write
from journal.rundir.inbox import MAX_FILE_BYTES, REJECTED_DIR_NAME
from journal.rundir.paths import control_dir, reports_dir

log = logging.getLogger("watcher.mirror")


def bring_in(store: Store, ckpt_dir: Path) -> int:
    """Move every ``*.json`` file of the two prefixes in; returns how many. A report is then
    journaled as one written locally would be (by the trainer, or here once it is gone)."""
    moved = {"reports": 0, "control": 0}
    for prefix, inbox, kind in (
        (REPORTS_PREFIX, reports_dir(ckpt_dir), "reports"),
        (CONTROL_PREFIX, control_dir(ckpt_dir), "control"),
    ):
        for key, size in sorted(store.listing(prefix).items()):
            name = posixpath.basename(key)
            if posixpath.dirname(key) != prefix.rstrip("/") or not name.endswith(".json"):
                continue  # only files directly in the prefix, as in the local inboxes
            try:
                if size > MAX_FILE_BYTES:
                    raise TooLarge(key)
                data = store.get_bytes(key, MAX_FILE_BYTES)  # it may have grown since
            except TooLarge:
                aside = f"{prefix}{REJECTED_DIR_NAME}/{name}"
                store.move(key, aside)
                log.warning(
                    "mirror: refused %s: %d bytes, over the %d KiB a %s file may hold; moved "
                    "to %s unread",
                    store.url(key),
                    size,
                    MAX_FILE_BYTES // 1024,
                    "report" if kind == "reports" else "command",
                    aside,
                )
                continue
            atomic_write(inbox / name, data, root=ckpt_dir)
            store.delete([key])
            moved[kind] += 1
    if moved["reports"]:
        drain(ckpt_dir, role="mirror")
    if any(moved.values()):
        log.info(
            "mirror: brought in %d report(s), %d command(s)", moved["reports"], moved["control"]
        )
    return sum(moved.values())
