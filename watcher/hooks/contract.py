"""The callback-object contract: what the watcher reads of a class-based callback, in one place.

A callback object (a :class:`~watcher.hooks.callbacks.TrainerCallback` subclass, a built-in,
an exporter, an InstructLab adapter, or any object with ``on_<event>`` methods) may define the
members of :class:`CallbackObject`; every one is optional. :func:`read_callback` reads a
user's object once, when its hooks are made, into a frozen :class:`CallbackShape`; the hooks,
the engine (``restore_state``, ``after_deliveries``) and the backtest use that shape and never
look the members up on the object again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from journal.record.events import EVENTS
from journal.record.record import Record
from watcher.hooks.callbacks import TrainerCallback, callable_name

log = logging.getLogger("watcher")

#: The journal's records, as ``restore_state`` receives the history.
Records = list[Record]


class CallbackObject(Protocol):
    """Every member the watcher reads of a callback object. All of them are optional: an
    object defines those it needs (the watcher reads them with :func:`read_callback`).

    Besides these, each ``on_<event>(self, event, **data)`` method (``on_save``,
    ``on_evaluate``, ...) is the object's hook of that event; a method inherited unchanged
    from :class:`~watcher.hooks.callbacks.TrainerCallback` is not hooked. A class attribute
    ``CURSOR_LABEL`` fixes the name of a built-in class in cursors and results whatever
    module it lives in (:func:`~watcher.hooks.callbacks.callable_name`).
    """

    #: The name of the object's hooks (``<label>.on_<event>``) in cursors and results;
    #: None or absent: ``module.Class`` of the object (an adapter names the object it runs).
    callback_label: str | None
    #: Only these events are hooked (absent: every ``on_<event>`` method the object has).
    subscribed_events: Collection[str]
    #: Events read for context only (a built-in checking ``train_begin``'s configuration):
    #: left out of ``ilab-watch``'s default cursor name.
    context_events: Collection[str]
    #: True: every record is delivered, none coalesced (an exporter, an adapter).
    deliver_every_record: bool

    def restore_state(self, records: Records) -> None:
        """Called once, before live delivery, with the journal's records before the start
        position: a stateful callback rebuilds counters and best values from them."""
        ...

    def after_deliveries(self) -> None:
        """Called after each batch of deliveries to the object, before the batch is
        recorded (an exporter writes what it buffered); raising fails the batch."""
        ...


@dataclass(frozen=True, slots=True, eq=False)
class CallbackShape:
    """A callback object as read once by :func:`read_callback`. Its identity is the object's:
    the hooks of one shape share one ordered queue (watcher.engine.queues)."""

    obj: Any = None  # the user's object (never copied)
    label: str = ""
    context_events: frozenset[str] = frozenset()
    every_record: bool = False
    #: ``{event: bound on_<event> method}``, in the journal's event order
    methods: Mapping[str, Callable[..., Any]] = field(default_factory=lambda: MappingProxyType({}))
    restore_state: Callable[[Records], None] | None = None
    after_deliveries: Callable[[], None] | None = None


def read_callback(obj: Any, *, every_record: bool = False) -> CallbackShape:
    """``obj`` read against :class:`CallbackObject`: the one place a user's callback object
    is looked into. ``every_record``: deliver it every record whatever it says (an
    exporter). A member that is not callable where a method is expected counts as absent,
    as does a falsy ``callback_label``."""
    only = getattr(obj, "subscribed_events", None)
    methods: dict[str, Callable[..., Any]] = {}
    for event in EVENTS if only is None else [e for e in EVENTS if e in only]:
        meth = getattr(obj, f"on_{event}", None)
        if meth is None or not callable(meth):
            continue
        base = getattr(TrainerCallback, f"on_{event}", None)
        if base is not None and getattr(meth, "__func__", None) is base:
            continue  # the inherited no-op
        methods[event] = meth
    return CallbackShape(
        obj=obj,
        label=getattr(obj, "callback_label", None) or callable_name(type(obj)),
        context_events=frozenset(getattr(obj, "context_events", ())),
        every_record=every_record or bool(getattr(obj, "deliver_every_record", False)),
        methods=MappingProxyType(methods),
        restore_state=_method(obj, "restore_state"),
        after_deliveries=_method(obj, "after_deliveries"),
    )


def _method(obj: Any, name: str) -> Callable[..., Any] | None:
    member = getattr(obj, name, None)
    return member if callable(member) else None


def restore_states(shapes: list[CallbackShape], history: Callable[[], Records]) -> None:
    """Each stateful callback's ``restore_state(records)``, with the records before the
    watcher's start (``history()``, read once and only when one of them asks), so it
    rebuilds counters and best values; one that raises is logged, the others go on."""
    asking = [shape for shape in shapes if shape.restore_state is not None]
    if not asking:
        return
    records = history()
    for shape in asking:
        try:
            shape.restore_state(records)  # type: ignore[misc]
        except Exception:
            log.exception("restore_state() of %s failed", callable_name(shape.obj))
