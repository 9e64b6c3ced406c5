"""One assembly: what a watcher is asked for (:class:`WatchPlan`) made into a watcher
holding its cursor (:func:`assemble`), for ``ilab-watch`` and the watcher ``run_training``
embeds alike. Each front end says what its options ask for; this puts it together."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from journal.checkpoints.leases import DEFAULT_TTL_S
from journal.rundir.paths import watch_dir
from watcher.engine.completion import Reporter
from watcher.engine.engine import Watcher
from watcher.engine.follow import StartAt
from watcher.engine.jobs import JobRunners
from watcher.exporters.base import close_all
from watcher.hooks.hook import HookSet


@dataclass(frozen=True)
class WatchPlan:
    """What a watcher is asked for: its hooks (callback objects and exporters included),
    the journal it follows, its cursor (``name``, kept in ``state_dir``, the run dir's
    ``watch/`` by default; ``persist_cursor``) and where delivery starts, how it follows
    (``follow``, ``poll``), who hears of each delivery, its checkpoint leases, ``--via``'s
    jobs, and who it says sent a control command."""

    journal: Path
    built: HookSet
    name: str
    start: StartAt
    state_dir: Path | None = None
    follow: bool = True
    poll: float | None = None
    persist_cursor: bool = True
    reporter: Reporter | None = None
    lease_ttl: float = DEFAULT_TTL_S
    jobs: JobRunners | None = None
    control_source: str | None = None


def assemble(plan: WatchPlan) -> Watcher:
    """The watcher ``plan`` asks for (its settings are :class:`Watcher`'s keyword
    arguments), holding its cursor's lock. One that cannot claim it
    (:class:`watcher.engine.cursor.CursorBusy`: another process runs this cursor; an unsafe
    run dir) raises, with the plan's exporters closed."""
    settings = {f.name: getattr(plan, f.name) for f in fields(plan)}
    journal, built = settings.pop("journal"), settings.pop("built")
    settings["state_dir"] = plan.state_dir or watch_dir(journal.parent)
    watcher = Watcher(journal, built.hooks, stateful_callbacks=built.stateful, **settings)
    try:  # one process per cursor, as one launch per run dir
        watcher.claim()
    except BaseException:
        close_all(built.exporters)
        raise
    return watcher
