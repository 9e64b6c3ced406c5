"""Dispatch: the records read together, turned into deliveries per lane.

One routing for the live engine and the backtest replay: each record goes to the hooks of
its event, grouped into lanes (a callback object's hooks together, each other hook alone);
a delivery a saved cursor says completed is not made again; a save's checkpoint is leased
per delivery. The engine hands each lane's deliveries to that lane's queue, the replay runs
them in place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from watcher.hooks.delivery import ENVELOPE, Batch, Delivery, undeliverable
from watcher.hooks.hook import Hook

#: Leases a save record's checkpoint for one delivery: the lease's name, or None.
LeaseFor = Callable[[dict[str, Any]], str | None]


#: What :meth:`Dispatcher.route` made: lane index -> its deliveries in journal order (only
#: the lanes that got some), and the run's end as the records say: True after a
#: ``train_end``, False after a ``train_begin`` (a resumed attempt), None when they hold
#: neither. A plain tuple: the replay routes one record at a time.
Routed = tuple[dict[int, list[Delivery]], bool | None]


class Dispatcher:
    """Routes records to the hooks of their event.

    Args:
        hooks: what runs on which event; :attr:`lanes` groups them (the engine makes one
            queue per lane, in this order).
        lease_for: leases a save's checkpoint for each of its deliveries (None: nothing is
            leased, as in a backtest).
        notice: says a skipped malformed record in one line.
    """

    def __init__(
        self,
        hooks: list[Hook],
        *,
        lease_for: LeaseFor | None = None,
        notice: Callable[[str], None],
    ) -> None:
        self.lanes = lanes(hooks)
        lane_of = {id(h): i for i, lane in enumerate(self.lanes) for h in lane}
        # event -> its hooks, each with its lane (the dispatch loop's table)
        self._routes: dict[str, list[tuple[Hook, int]]] = {}
        for hook in hooks:
            self._routes.setdefault(hook.event, []).append((hook, lane_of[id(hook)]))
        #: the events some hook is on (a caller routing one record at a time asks first)
        self.events = frozenset(self._routes)
        self._lease_for = lease_for
        self._notice = notice
        # what a saved cursor says completed (per hook id), up to which seq
        self._done: dict[str, set[int]] = {}
        self._done_max = -1

    def remember_done(self, done: Mapping[str, Iterable[int]]) -> None:
        """The deliveries a saved cursor says completed (per hook id): not made again."""
        self._done = {k: set(v) for k, v in done.items()}
        self._done_max = max((max(v) for v in self._done.values() if v), default=-1)

    def route(self, records: list[dict[str, Any]], batch: Batch) -> Routed:
        """The deliveries of ``records`` (read together, in journal order), made in
        ``batch``. Per record only dict lookups: this loop runs for every record of a
        replay."""
        routes, lease_for = self._routes, self._lease_for
        done, done_max = self._done, self._done_max
        per_lane: dict[int, list[Delivery]] = {}
        ended: bool | None = None
        for rec in records:
            ev = rec.get("event")
            if ev == "train_end":
                ended = True
            elif ev == "train_begin":  # a resumed attempt: its predecessor's end is not ours
                ended = False
            hooks = routes.get(ev) if type(ev) is str else None
            if not hooks:
                continue
            if (ev == "save" or not rec.keys() >= ENVELOPE) and (why := undeliverable(rec)):
                self._notice(f"skipped a malformed {ev} record (seq {rec['seq']}): {why}")
                continue  # e.g. a save appended by hand
            seq = rec["seq"]
            prefix = f"{rec.get('run_id', '')}-{seq}-"
            for hook, lane in hooks:
                if seq <= done_max and seq in done.get(hook.id, ()):
                    continue  # completed before a restart
                # a save's checkpoint is leased per delivery, released as each completes
                lease = lease_for(rec) if ev == "save" and lease_for is not None else None
                todo = per_lane.get(lane)
                if todo is None:
                    todo = per_lane[lane] = []
                todo.append(Delivery(hook, rec, batch, prefix + hook.short_id, lease))
        return per_lane, ended


def lanes(hooks: list[Hook]) -> list[list[Hook]]:
    """The hooks grouped into lanes: those of one object together (by identity), each other
    hook alone, in the order first seen."""
    by_key: dict[int, list[Hook]] = {}
    for h in hooks:
        by_key.setdefault(id(h.owner) if h.owner is not None else id(h), []).append(h)
    return list(by_key.values())
