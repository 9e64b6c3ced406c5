"""The death rule: an attempt whose processes are all gone and that wrote no ``train_end``
(docs/alerts.md, "Hangs and deaths").

On this host the ranks' pids say it (``/proc``); for ranks on other hosts, the run lock's
heartbeat does: node 0's launcher rewrites it every few seconds while it runs
(journal/rundir/lock.py), so a lock nobody holds and no fresh heartbeat means nobody is
left to write the ending. A launcher that still holds the run dir writes the
``train_end`` itself (its fallback end): no death then. Pure: the guard hands in what it
sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from watcher.alerts.hang import AttemptTracker
from watcher.alerts.processes import ProcessView

#: Seconds every process must have been gone before it is a death: a ``train_end`` may
#: be on its way (a worker's last append, a launcher's fallback end).
GRACE_S = 3.0


@dataclass(frozen=True)
class DeathFinding:
    run_id: str | None
    attempt: int | None
    step: int
    message: str


def check_died(
    tracker: AttemptTracker,
    view: ProcessView,
    launcher: dict[str, Any] | None,
    now: float,
    grace_s: float = GRACE_S,
    *,
    launcher_seen: bool = False,
) -> DeathFinding | None:
    """A death when the attempt is active (no ``train_end``), no rank on this host is
    alive for ``grace_s`` now, and no launcher holds the run dir (``launcher``: the run
    lock's holder, None when it is free and its heartbeat stale). Ranks on other hosts
    count as gone only once a launcher was seen holding the run dir and is no more
    (``launcher_seen``): without one, nothing here can tell."""
    if not tracker.active:
        return None
    ranks = view.ranks()
    if not ranks or launcher is not None:
        return None
    local = [p for p in ranks if p.local]
    if any(p.alive or p.state is None for p in local):
        return None
    gone_since = max((p.since for p in local if p.since is not None), default=None)
    if gone_since is not None and now - gone_since < grace_s:
        return None
    remote = len(ranks) - len(local)
    if remote and not launcher_seen:
        return None
    pids = ", ".join(f"rank {p.rank} pid {p.pid}" for p in local)
    what = f"every process of attempt {tracker.attempt} is gone ({pids})" if local else ""
    if remote:
        what = (what + "; " if what else "") + (
            f"{remote} rank(s) on other hosts: the run lock's heartbeat is stale"
        )
    step = tracker.last_step
    return DeathFinding(
        tracker.run_id,
        tracker.attempt,
        step,
        f"{what}, and no train_end was written (last step {step}; nothing holds the "
        "run dir to write it)",
    )
