"""Dispatch: the records read together, turned into deliveries per lane.

One routing for the live engine and the backtest replay: each record goes to the hooks of
its event, grouped into lanes (a callback object's hooks together, each other hook alone);
a delivery a saved cursor says completed is not made again; a save's checkpoint is leased
per delivery. The engine hands each lane's deliveries to that lane's queue, the replay runs
them in place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import itemgetter, methodcaller
from typing import Any, NamedTuple

from journal.record.events import AFTER_END_EVENTS
from journal.record.record import Record
from watcher.hooks.delivery import Batch, Delivery, Run, undeliverable
from watcher.hooks.hook import Hook

#: Leases a save record's checkpoint for one delivery: the lease's name, or None.
LeaseFor = Callable[[Record], str | None]


class Routed(NamedTuple):
    """What :meth:`Dispatcher.route` made from records read together."""

    #: lane index -> its deliveries in journal order (only the lanes that got some)
    deliveries: dict[int, list[Delivery]]
    #: whether the attempt has ended as the records say (:func:`attempt_ended`; None: they
    #: hold only records others append after an end)
    ended: bool | None
    #: the inline lanes' deliveries, as runs (lane index -> in journal order)
    plain: dict[int, list[Run]]


class Dispatcher:
    """Routes records to the hooks of their event.

    Args:
        hooks: what runs on which event; :attr:`lanes` groups them (the engine makes one
            queue per lane, in this order).
        lease_for: leases a save's checkpoint for each of its deliveries (None: nothing is
            leased, as in a backtest).
        notice: says a skipped malformed record in one line.
        inline: whether the one lane of ``hooks`` (only ever one: the caller's thread
            would make a slow lane delay the others) runs in the caller's thread, batch by
            batch (a replay into a plain callable: watcher.engine.engine); its deliveries
            are made as runs (``Run``). Such a lane has no hook on ``save`` (nothing
            to lease).
    """

    def __init__(
        self,
        hooks: list[Hook],
        *,
        lease_for: LeaseFor | None = None,
        notice: Callable[[str], None],
        inline: Callable[[list[Hook]], bool] | None = None,
    ) -> None:
        self.lanes = lanes(hooks)
        #: the lanes whose deliveries are made as runs
        self.inline = frozenset(
            i
            for i, lane in enumerate(self.lanes)
            if len(self.lanes) == 1
            and inline is not None
            and inline(lane)
            and all(h.event != "save" for h in lane)
        )
        lane_of = {id(h): i for i, lane in enumerate(self.lanes) for h in lane}
        # event -> its hooks, each with its lane (the dispatch loop's table)
        self._routes: dict[str, list[tuple[Hook, int]]] = {}
        for hook in hooks:
            self._routes.setdefault(hook.event, []).append((hook, lane_of[id(hook)]))
        #: the events some hook is on (a caller routing one record at a time asks first)
        self.events = frozenset(self._routes)
        # event -> its one hook, when each event has one (_route_plain)
        self._hook_of: dict[str, Hook] | None = None
        if all(len(on) == 1 for on in self._routes.values()):
            self._hook_of = {ev: on[0][0] for ev, on in self._routes.items()}
        self._lease_for = lease_for
        self._notice = notice
        # what a saved cursor says completed (per hook id), up to which seq
        self._done: dict[str, set[int]] = {}
        self._done_max = -1

    def remember_done(self, done: Mapping[str, Iterable[int]]) -> None:
        """The deliveries a saved cursor says completed (per hook id): not made again."""
        self._done = {k: set(v) for k, v in done.items()}
        self._done_max = max((max(v) for v in self._done.values() if v), default=-1)

    def route(
        self,
        records: list[Record],
        batch: Batch,
        events: list[Any] | None = None,
        kinds: set[str] | None = None,
        *,
        whole: bool = False,
    ) -> Routed:
        """The deliveries of ``records`` (read together, in journal order), made in
        ``batch``; ``events``: their ``event`` fields, and ``kinds`` the set of them (see
        :func:`events_of`), when the caller has them; ``whole``: the reader says each was
        written with its whole envelope (``ReadBatch.patched`` is False: none lacks its run
        id or time). Per record only dict lookups: this loop runs for every record of a
        replay."""
        if events is None:
            events, kinds = events_of(records)
        if (
            self.inline
            and (fast := self._route_plain(records, batch, events, kinds, whole)) is not None
        ):
            return Routed({}, attempt_ended(events), {0: fast} if fast else {})
        lease_for = self._lease_for
        done, done_max = self._done, self._done_max
        made: list[list[Any]] = [[] for _ in self.lanes]
        inline = self.inline
        # event -> (hook, its lane's list.append, whether the lane takes runs) for this
        # call: one call per delivery
        routes = {
            ev: [(hook, made[lane].append, lane in inline) for hook, lane in hooks]
            for ev, hooks in self._routes.items()
        }
        runs: dict[int, Run] = {}  # an inline lane's run being made
        for rec, ev in zip(records, events, strict=True):
            hooks = routes.get(ev)
            if not hooks:
                continue
            # the readers complete every record: what no default stands in for (a run id, a
            # time) and a save's checkpoint are what a record may still lack
            check = ev == "save" or rec["run_id"] is None or rec["ts"] is None
            if check and (why := undeliverable(rec)):
                self._notice(f"skipped a malformed {ev} record (seq {rec['seq']}): {why}")
                continue  # e.g. a save appended by hand
            seq = rec["seq"]
            for hook, add, pair in hooks:
                if seq <= done_max and seq in done.get(hook.id, ()):
                    continue  # completed before a restart
                if pair:
                    run = runs.get(id(add))
                    if run is None or run.hook is not hook:
                        runs[id(add)] = run = Run(hook, batch, [])
                        add(run)
                    run.records.append(rec)
                    continue
                # a save's checkpoint is leased per delivery, released as each completes;
                # the delivery id is made when asked (a plain success never asks)
                lease = lease_for(rec) if ev == "save" and lease_for is not None else None
                add(Delivery(hook, rec, batch, None, lease))
        per_lane = {lane: todo for lane, todo in enumerate(made) if todo and lane not in inline}
        plain = {lane: made[lane] for lane in inline if made[lane]}
        return Routed(per_lane, attempt_ended(events), plain)

    def _route_plain(
        self,
        records: list[Record],
        batch: Batch,
        events: list[Any],
        kinds: set[str] | None,
        whole: bool,
    ) -> list[Run] | None:
        """The runs of the one inline lane (one hook per event: an object's methods or one
        callable), when nothing per record needs judging: no record lacks its run id or
        time, and none may have been delivered before a restart. A batch of one hooked
        event (a replay's ``log`` records: most batches) is one run, made in C. None: the
        general loop of :meth:`route` decides."""
        hook_of = self._hook_of
        if hook_of is None or kinds is None or records[0]["seq"] <= self._done_max:
            return None
        if not whole and (None in map(_run_id_of, records) or None in map(_ts_of, records)):
            return None  # a record to say as malformed (undeliverable)
        hooked = kinds.intersection(hook_of)
        if len(hooked) == 1:
            (ev,) = hooked
            if len(kinds) == 1:  # the batch's records are the run, as they are
                return [Run(hook_of[ev], batch, records)]
            recs = [r for r, e in zip(records, events, strict=True) if e == ev]
            return [Run(hook_of[ev], batch, recs)]
        runs: list[Run] = []
        for rec, ev in zip(records, events, strict=True):
            hook = hook_of.get(ev)
            if hook is None:
                continue
            if not runs or hook is not runs[-1].hook:
                runs.append(Run(hook, batch, []))
            runs[-1].records.append(rec)
        return runs


def events_of(records: list[Record]) -> tuple[list[Any], set[str] | None]:
    """The ``event`` of each record (None where it is not a string), and the set of them
    (None: not made), in C: the engine and :meth:`Dispatcher.route` ask these of every
    record of a batch, and most batches hold a few kinds of records."""
    events = list(map(_event_of, records))
    try:
        return events, set(events)
    except TypeError:  # an unhashable event (a record of no event, then): set aside
        return [ev if type(ev) is str else None for ev in events], None


def attempt_ended(events: Sequence[Any], ended: bool | None = None) -> bool | None:
    """Whether the attempt has ended after ``events`` (in journal order), by the journal's
    one rule (``journal.store.tail``'s ``Tail.ended``): the last event that is not one of
    :data:`~journal.record.events.AFTER_END_EVENTS` (a late report, a job, an alert...)
    decides, ended when it is ``train_end``. ``ended``: what was known before them (the
    answer when they are all such records)."""
    for ev in reversed(events):
        if ev not in AFTER_END_EVENTS:
            return ev == "train_end"
    return ended


_event_of = methodcaller("get", "event")
_run_id_of = itemgetter("run_id")
_ts_of = itemgetter("ts")


def lanes(hooks: list[Hook]) -> list[list[Hook]]:
    """The hooks grouped into lanes: those of one object together (by identity), each other
    hook alone, in the order first seen."""
    by_key: dict[int, list[Hook]] = {}
    for h in hooks:
        by_key.setdefault(id(h.owner) if h.owner is not None else id(h), []).append(h)
    return list(by_key.values())
