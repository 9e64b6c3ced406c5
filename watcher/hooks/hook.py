"""Hooks: one callback bound to one event, with its delivery options, and how to build them
from what users give (command strings, callables, callback objects)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from journal.record.events import MICROBATCH_EVENTS
from journal.record.text import printable
from watcher.hooks.callbacks import (
    CallbackSpecError,
    CommandTarget,
    callable_name,
    check_callable,
)
from watcher.hooks.contract import CallbackShape, read_callback

QueuePolicy = Literal["all", "latest"]
#: Events that can fire many times a second: by default only the newest pending one runs.
HIGH_RATE_EVENTS = frozenset(
    {"step_begin", "step_end", "log", "before_optimizer_step", "after_optimizer_step"}
    | MICROBATCH_EVENTS
)


@dataclass
class HookOptions:
    """How deliveries of one hook run."""

    timeout: float | None = None  # seconds; None: commands 3600, callables unlimited
    retries: int = 0
    backoff: float = 1.0  # first retry delay; doubles each time, capped at 60 s
    concurrency: int = 1
    queue: QueuePolicy | None = None  # None: "latest" for high-rate events, else "all"
    #: the scheduler (``--via slurm|local``) whose jobs run a command hook's deliveries,
    #: through the runner the watcher is given (watcher.engine.jobs); None: processes of
    #: the watcher. A callable always runs in the watcher.
    via: str | None = None


@dataclass
class Hook:
    """One callback bound to one event."""

    event: str
    target: CommandTarget | Callable[..., Any]
    options: HookOptions = field(default_factory=HookOptions)
    label: str = ""
    #: Reads records for context only (a built-in checking train_begin's configuration):
    #: left out of ilab-watch's default cursor name, which so stays what it was without it.
    context: bool = False
    #: The callback object whose method this is, as read once (None for a command or a
    #: lone callable): the hooks of one object share one ordered queue (watcher.engine.queues).
    owner: CallbackShape | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.label:
            self.label = (
                self.target.spec
                if isinstance(self.target, CommandTarget)
                else callable_name(self.target)
            )
        if self.options.queue is None:
            self.options.queue = "latest" if self.event in HIGH_RATE_EVENTS else "all"

    @cached_property  # asked once per delivery
    def id(self) -> str:
        """Stable identity (cursor key): the event and what runs."""
        return f"{self.event}:{self.label}"

    @cached_property
    def inline(self) -> bool:
        """A Python callable called directly, on its queue's worker: no timeout thread, and
        no checkpoint to check first (a save's is checked: it may be removed)."""
        return (
            not isinstance(self.target, CommandTarget)
            and self.options.timeout is None
            and self.event != "save"
        )

    @cached_property
    def short_id(self) -> str:
        return hashlib.sha1(self.id.encode()).hexdigest()[:8]


def hook_for(event: str, spec: Any, options: HookOptions, *, shell: bool = False) -> Hook:
    """A command string or a Python callable bound to ``event``."""
    if isinstance(spec, str):
        return Hook(event, CommandTarget.parse(spec, event, shell=shell), options)
    check_callable(spec, f"on_{event}")
    return Hook(event, spec, options)


def hooks_for_object(
    obj: Any, options_for: Callable[[str], HookOptions], *, every_record: bool = False
) -> list[Hook]:
    """One hook per ``on_<event>`` method the object implements (class-based callbacks),
    read once against the callback contract (:func:`~watcher.hooks.contract.read_callback`):
    events in its ``context_events`` make context hooks, ``deliver_every_record`` (or
    ``every_record``: an exporter) gets every record (no coalescing), a ``callback_label``
    names the hooks (an adapter, by the object it runs). The hooks name the object's shape
    as their ``owner``: the watcher calls its methods one at a time, in journal order."""
    return hooks_for_shape(read_callback(obj, every_record=every_record), options_for)


def hooks_for_shape(shape: CallbackShape, options_for: Callable[[str], HookOptions]) -> list[Hook]:
    """The hooks of a callback object already read (see :func:`hooks_for_object`)."""
    if not shape.methods:
        raise CallbackSpecError(f"{callable_name(shape.obj)} implements no on_<event> method")

    def options(ev: str) -> HookOptions:
        opts = options_for(ev)
        return dataclasses.replace(opts, queue="all") if shape.every_record else opts

    return [
        Hook(
            ev,
            meth,
            options(ev),
            label=f"{shape.label}.on_{ev}",
            context=ev in shape.context_events,
            owner=shape,
        )
        for ev, meth in shape.methods.items()
    ]


@dataclass(frozen=True)
class HookSet:
    """A watcher's hooks (:func:`assemble_hooks`), with the callback objects whose
    ``restore_state(records)`` it calls before delivering (each one's shape, whose
    ``restore_state`` is set) and the exporters it closes."""

    hooks: list[Hook]
    stateful: list[CallbackShape]
    exporters: list[Any]


def assemble_hooks(
    commands: Iterable[tuple[str, Any]],
    objects: Iterable[Any],
    exporters: Iterable[Any],
    options_for: Callable[[str], HookOptions],
    *,
    shell: bool = False,
) -> HookSet:
    """The hooks of ``ilab-watch`` and of the embedded watcher, in the order they run:
    each ``(event, command string or callable)``, each callback object's ``on_<event>``
    methods, then each exporter's (every record: an exporter writes points, not only the
    newest pending one). A callback object with a ``restore_state`` is stateful (an
    exporter is not: it reads back what its tracker holds).

    Each argument is read to its end before the next one is: a caller that passes
    generators makes nothing (a callback object, a tracker's connection) before what
    comes earlier proved usable, and all of its objects before their hooks."""
    hooks = [hook_for(event, spec, options_for(event), shell=shell) for event, spec in commands]
    made = list(objects)
    stateful = []
    for obj in made:
        shape = read_callback(obj)
        hooks.extend(hooks_for_shape(shape, options_for))
        if shape.restore_state is not None:
            stateful.append(shape)
    trackers = list(exporters)
    for exporter in trackers:
        hooks.extend(hooks_for_object(exporter, options_for, every_record=True))
    return HookSet(hooks, stateful, trackers)


def instantiate(obj: Any, where: str) -> Any:
    """A class given by name is constructed with no arguments; a constructor that raises
    is a usage error in one line naming the class and the exception (the user's mistake,
    not ours: no traceback), ``SystemExit`` and other BaseExceptions included."""
    if isinstance(obj, type):
        try:
            return obj()
        except TypeError as exc:
            raise CallbackSpecError(
                f"{where}: cannot construct {callable_name(obj)}() without arguments: {exc}"
            ) from None
        except KeyboardInterrupt:
            raise  # Ctrl-C while it is being made: the watcher stops as for any Ctrl-C
        except BaseException as exc:  # sys.exit(0) in it must not end the watcher "ok"
            raise CallbackSpecError(
                printable(f"{where}: {callable_name(obj)}() raised {type(exc).__name__}: {exc}")
            ) from None
    return obj
